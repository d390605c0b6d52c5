"""tools/bench.py as a user runs it: the entry script and its child processes.

One short benchmark run (one trainer, one measured step) checks that the
package's child processes find their entry and answer the timing protocol;
the longer runs (two trainers' losses across processes, the memory process
in a fresh process) are tools/bench_smoke.py's, which CI runs after the
tests.
"""

import json
import os
import shlex
import subprocess
import sys

_BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), 'tools', 'bench.py')


def test_a_flag_error_exits_non_zero_from_any_directory(tmp_path):
  out_dir = tmp_path / 'bench_results'
  proc = subprocess.run(
      [sys.executable, _BENCH, '--configs=l6,l7', '--notiming', '--nomemory',
       f'--out_dir={out_dir}'],
      cwd=tmp_path, capture_output=True, text=True, check=False)
  assert proc.returncode != 0
  assert "unknown configs ['l7']; choose from" in proc.stderr + proc.stdout
  assert not out_dir.exists()


def test_timing_steps_a_trainer_in_a_process_of_its_own(tmp_path):
  # Ours runs with an environment argument, which its process must see.
  ours = "ours+GLIBC_TUNABLES='glibc.malloc.arena_max=1'"
  args = [_BENCH, '--quick', '--configs=l6', f'--trainers={ours}',
          '--steps=1', '--nomemory', f'--out_dir={tmp_path}']
  # No time limit: a slow or busy machine must not fail the test.
  proc = subprocess.run([sys.executable] + args, capture_output=True,
                        text=True, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(tmp_path / 'bench_quick.json') as f:
    results = json.load(f)
  assert (tmp_path / 'bench_quick.md').exists()
  # The recorded command, split as a shell would, gives the same arguments.
  assert shlex.split(results['command']) == ['python'] + args
  timing = results['configs']['l6']['timing'][ours]
  assert timing['first_step_s'] > 0 and timing['second_step_s'] > 0
  assert len(timing['step_s']) == 1
  assert len(timing['losses']) == 3
  assert timing['weights_bytes'] > 0 and timing['slots_bytes'] > 0
  assert timing['glibc_tunables'] == 'glibc.malloc.arena_max=1'
