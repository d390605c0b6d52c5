"""End-to-end check of tools/bench.py's timing processes, on --quick shapes.

Runs the benchmark as a user would: timing of stock and of ours with an
environment argument (GLIBC_TUNABLES), one measured step, each trainer in a
process of its own, stepped in turns: the recorded command runs as given;
the Markdown table is written; each trainer's first, second and one
measured step took time; weights and slots were counted; ours' process saw
its GLIBC_TUNABLES and stock's inherited this process's; the two
processes' losses agree (same model, seed and batches); no device peak on
the CPU.

The rest of the benchmark's processes run in the suite:
tests/tools/test_bench.py (one process at a time on a simulated one-chip
host, the benchmark's own process holding no backend; the peak RSS
process, fresh, over 3 steps, with the tests marked slow) and
tests/tools/test_step_floor.py (tools/step_floor.py's table).

Prints one PASS or FAIL line per check; exit status 0 when all pass, 1
otherwise.

Usage:
  python tools/bench_smoke.py [--work_dir=DIR]

Takes minutes: each of the 2 processes imports trax (~20-60 s on a busy
machine) and plans ours.
"""

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile

import numpy as np

from smoke_checks import Checks

_BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'bench.py')
_OURS = "ours+GLIBC_TUNABLES='glibc.malloc.arena_max=1'"


def _run(checks, name, args, out_dir):
  """Runs `python *args`; its bench_quick.json, or None when it failed."""
  proc = subprocess.run(
    [sys.executable] + args,
    capture_output=True,
    text=True,
    check=False,
  )
  if not checks.check(
    f'{name} run exits 0', proc.returncode == 0, f'status {proc.returncode}'
  ):
    print(proc.stderr[-3000:], file=sys.stderr)
    return None
  with open(os.path.join(out_dir, 'bench_quick.json')) as f:
    return json.load(f)


def check_timing(checks, out_dir):
  """Timing of stock and ours, each trainer in a process of its own."""
  args = [
    _BENCH,
    '--quick',
    '--configs=l6',
    f'--trainers=stock,{_OURS}',
    '--steps=1',
    '--nomemory',
    f'--out_dir={out_dir}',
  ]
  results = _run(checks, 'timing', args, out_dir)
  if results is None:
    return
  checks.check(
    'timing: the recorded command splits into its arguments',
    shlex.split(results['command']) == ['python'] + args,
    results['command'],
  )
  checks.check(
    'timing: the Markdown table was written next to the JSON',
    os.path.exists(os.path.join(out_dir, 'bench_quick.md')),
    os.path.join(out_dir, 'bench_quick.md'),
  )
  timing = results['configs']['l6']['timing']
  for t in ('stock', _OURS):
    r = timing[t]
    checks.check(
      f'timing {t}: first and second step took time',
      r['first_step_s'] > 0 and r['second_step_s'] > 0,
      f'{r["first_step_s"]}, {r["second_step_s"]}',
    )
    checks.check(
      f'timing {t}: one measured step', len(r['step_s']) == 1, str(r['step_s'])
    )
    checks.check(
      f'timing {t}: weights and slots counted',
      r['weights_bytes'] > 0 and r['slots_bytes'] > 0,
      f'{r["weights_bytes"]}, {r["slots_bytes"]}',
    )
  checks.check(
    "timing: ours' process saw its GLIBC_TUNABLES",
    timing[_OURS]['glibc_tunables'] == 'glibc.malloc.arena_max=1',
    str(timing[_OURS]['glibc_tunables']),
  )
  checks.check(
    "timing: stock's process inherited GLIBC_TUNABLES",
    timing['stock']['glibc_tunables'] == os.environ.get('GLIBC_TUNABLES'),
    str(timing['stock']['glibc_tunables']),
  )
  for t in ('stock', _OURS):
    checks.check(
      f'timing {t}: no device peak on the CPU',
      results['environment']['platform'] != 'cpu'
      or timing[t]['chip_peak_bytes'] is None,
      str(timing[t]['chip_peak_bytes']),
    )
  # Same model, seed and batches in two processes: the same losses.
  ours, stock = timing[_OURS]['losses'], timing['stock']['losses']
  checks.check(
    'timing: ours has a loss per step (3)', len(ours) == 3, str(ours)
  )
  checks.check(
    'timing: the losses of the two processes agree (rtol 1e-5)',
    len(ours) == len(stock) and np.allclose(ours, stock, rtol=1e-5, atol=0),
    f'{ours} vs {stock}',
  )


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
    '--work_dir',
    default=None,
    help='Where the runs write (default: a temporary '
    'directory, removed at the end).',
  )
  flags = parser.parse_args()
  checks = Checks()
  with tempfile.TemporaryDirectory() as tmp:
    work_dir = flags.work_dir or tmp
    check_timing(checks, os.path.join(work_dir, 'timing'))
  print(
    f'{"FAIL" if checks.failed else "PASS"} bench smoke: '
    f'{len(checks.failed)} check(s) failed',
    flush=True,
  )
  return 1 if checks.failed else 0


if __name__ == '__main__':
  sys.exit(main())
