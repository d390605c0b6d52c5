"""End-to-end check of tools/bench.py's child processes, on --quick shapes.

Runs the benchmark twice, as a user would:

  1. timing of stock and of ours with an environment argument
     (GLIBC_TUNABLES), one measured step, each trainer in a process of its
     own: the recorded command runs as given; each trainer's first, second
     and one measured step took time; weights and slots were counted; ours'
     process saw its GLIBC_TUNABLES and stock's inherited this process's;
     the two processes' losses agree (same model, seed and batches);
  2. the same timing one process at a time (`--sequential`, as on an
     accelerator) on a simulated one-chip host (tests/one_chip/: a second
     process that opens JAX's backend fails, as on a TPU): the benchmark's
     own process holds no backend, each trainer's process ran its steps
     alone and reported its device peak (None on the CPU), the table says
     so; the losses agree;
  3. peak RSS of ours in a fresh process over 3 steps: a running peak per
     step, never falling, above the baseline from the first step on, and
     not above the process's peak read after the last step;
  4. tools/step_floor.py on the 'char' config: one table row of times.

Prints one PASS or FAIL line per check; exit status 0 when all pass, 1
otherwise.

Usage:
  python tools/bench_smoke.py [--work_dir=DIR]

Takes minutes: each of the 5 processes imports trax (~20-60 s on a busy
machine).
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

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(_REPO, 'tests'))
import one_chip_host  # pylint: disable=g-import-not-at-top,wrong-import-position

_BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'bench.py')
_STEP_FLOOR = os.path.join(
  os.path.dirname(os.path.abspath(__file__)), 'step_floor.py'
)
_OURS = "ours+GLIBC_TUNABLES='glibc.malloc.arena_max=1'"


def _run(checks, name, args, out_dir, env=None):
  """Runs `python *args`; its bench_quick.json, or None when it failed."""
  proc = subprocess.run(
    [sys.executable] + args,
    capture_output=True,
    text=True,
    check=False,
    env=env,
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


def check_one_at_a_time(checks, out_dir):
  """Timing of stock and ours one process at a time, on a simulated
  one-chip host."""
  args = [
    _BENCH,
    '--quick',
    '--configs=l6',
    '--trainers=stock,ours',
    '--steps=1',
    '--nomemory',
    '--sequential',
    f'--out_dir={out_dir}',
  ]
  os.makedirs(out_dir, exist_ok=True)
  env = one_chip_host.env(os.path.join(out_dir, 'one_chip.lock'))
  results = _run(checks, 'one at a time, one-chip host', args, out_dir, env)
  if results is None:
    return
  timing = results['configs']['l6']['timing']
  checks.check(
    'one at a time: recorded as timed so',
    results['configs']['l6']['timing_mode'] == 'sequential',
    str(results['configs']['l6'].get('timing_mode')),
  )
  for t in ('stock', 'ours'):
    r = timing[t]
    checks.check(
      f'one at a time {t}: 3 steps, no error, a device peak (none on the CPU)',
      r['error'] is None
      and len(r['losses']) == 3
      and 'chip_peak_bytes' in r
      and (r['chip_peak_bytes'] is None)
      == (results['environment']['platform'] == 'cpu'),
      f'{r["error"]}, {r["losses"]}, {r.get("chip_peak_bytes")}',
    )
  checks.check(
    'one at a time: the losses of the two processes agree',
    np.allclose(
      timing['ours']['losses'], timing['stock']['losses'], rtol=1e-5, atol=0
    ),
    f'{timing["ours"]["losses"]} vs {timing["stock"]["losses"]}',
  )
  with open(os.path.join(out_dir, 'bench_quick.md')) as f:
    table = f.read()
  checks.check(
    'one at a time: the table says so, with a device peak column',
    'one at a time' in table
    and 'device peak default / stock / ours (MiB)' in table,
    table[:2000],
  )


def check_memory(checks, out_dir):
  """Peak RSS of ours in a fresh process, over 3 steps."""
  args = [
    _BENCH,
    '--quick',
    '--configs=l6',
    '--trainers=ours',
    '--memory_steps=3',
    '--notiming',
    f'--out_dir={out_dir}',
  ]
  results = _run(checks, 'memory', args, out_dir)
  if results is None:
    return
  mem = results['configs']['l6']['memory']['ours']
  peaks = mem['peak_above_baseline_after_step_bytes']
  checks.check(
    'memory: a running peak and a time per step (3)',
    len(peaks) == len(mem['step_s']) == 3,
    f'{peaks}, {mem["step_s"]}',
  )
  checks.check(
    'memory: the running peak never falls', peaks == sorted(peaks), str(peaks)
  )
  checks.check(
    'memory: above the baseline from the first step',
    bool(peaks) and peaks[0] > 0,
    str(peaks),
  )
  # The process's peak is read after its last step.
  checks.check(
    'memory: no running peak above the process peak',
    bool(peaks) and peaks[-1] <= mem['peak_above_baseline_bytes'],
    f'{peaks} vs {mem["peak_above_baseline_bytes"]}',
  )
  checks.check(
    'memory: weights and slots counted',
    mem['weights_bytes'] > 0 and mem['slots_bytes'] > 0,
    f'{mem["weights_bytes"]}, {mem["slots_bytes"]}',
  )


def check_step_floor(checks):
  """tools/step_floor.py's table: one row per config."""
  proc = subprocess.run(
    [sys.executable, _STEP_FLOOR, '--quick', '--configs=char', '--repeats=1'],
    capture_output=True,
    text=True,
    check=False,
  )
  if not checks.check(
    'step_floor run exits 0', proc.returncode == 0, f'status {proc.returncode}'
  ):
    print(proc.stderr[-3000:], file=sys.stderr)
    return
  rows = [
    line.split('|')[1:-1]
    for line in proc.stdout.splitlines()
    if line.startswith('| char |')
  ]
  # Times print to 0.1 ms: the loss layer's may round to 0 at quick sizes.
  checks.check(
    'step_floor: one row for char, its times not negative',
    len(rows) == 1 and all(float(c) >= 0 for c in rows[0][1:]),
    proc.stdout[-500:],
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
    check_one_at_a_time(checks, os.path.join(work_dir, 'one_at_a_time'))
    check_memory(checks, os.path.join(work_dir, 'memory'))
  check_step_floor(checks)
  print(
    f'{"FAIL" if checks.failed else "PASS"} bench smoke: '
    f'{len(checks.failed)} check(s) failed',
    flush=True,
  )
  return 1 if checks.failed else 0


if __name__ == '__main__':
  sys.exit(main())
