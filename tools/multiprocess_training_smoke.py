"""End-to-end check: multi-process training (jax.distributed on loopback)
equals one process.

The same tiny reversible model trains 3 steps on the same global batch of 8
rows (tests/multiprocess/training_worker.py) as 2 processes x 1 CPU device
(real processes started by `trax_revplus.multiprocess.launcher`), 1 process
x 2 forced CPU devices and 1 process x 1 device (each a fresh process:
this script's own process opens no JAX backend):

  1. every run sees the devices it was given;
  2. the one-process runs (1 and 2 devices) match trax's default `Trainer`
     without dropout (max abs difference < 1e-5);
  3. without dropout, each of the 2 processes matches 1 process x 2 devices
     and 1 process x 1 device: weights, optimizer slots and the loss (the
     mean over every device) within 1e-5;
  4. the 2 processes hold identical weights, slots and losses, with and
     without dropout;
  5. with dropout, each of the 2 processes matches 1 process x 2 devices
     (weights and slots within 1e-5), and 1 process x 1 device differs
     (> 1e-4: dropout masks are drawn per device, so the comparison can
     fail);
  6. without dropout, every run's every process trained in 2 micro-batches
     (`micro_batches = 2`), with the accumulated gradients on the device
     and on the host, matches its own run in one pass (weights and slots
     within 1e-5).

The suite keeps the cheap part, 1 process x 1 device against trax's default
`Trainer` (tests/multiprocess/test_training_matches_one_process.py), and a
real 2-process JAX job through the launcher (tests/multiprocess/
test_launcher.py).

Prints one PASS or FAIL line per check; exit status 0 when all pass, 1
otherwise.

Usage:
  python tools/multiprocess_training_smoke.py [--work_dir=DIR]

Takes minutes: each of the 4 processes imports trax (~20-60 s on a busy
machine). The launcher ends every process when one fails; the waits have no
fixed deadline.
"""

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_WORKER_DIR = os.path.join(_REPO, 'tests', 'multiprocess')
_WORKER = os.path.join(_WORKER_DIR, 'training_worker.py')
_TOLERANCE = 1e-5

sys.path.insert(0, _REPO)
# pylint: disable=g-import-not-at-top,wrong-import-position
from trax_revplus.multiprocess import launcher

from smoke_checks import Checks
# pylint: enable=g-import-not-at-top,wrong-import-position


def _env(n_local_devices):
  env = dict(os.environ)
  flags = [
    f
    for f in env.get('XLA_FLAGS', '').split()
    if 'xla_force_host_platform_device_count' not in f
  ]
  if n_local_devices > 1:
    flags.append(f'--xla_force_host_platform_device_count={n_local_devices}')
  env['XLA_FLAGS'] = ' '.join(flags)
  env['JAX_PLATFORMS'] = 'cpu'
  env['PYTHONPATH'] = os.pathsep.join(
    [_REPO] + [p for p in env.get('PYTHONPATH', '').split(os.pathsep) if p]
  )
  return env


def _train(checks, work, n_processes, n_local_devices):
  """Runs the worker; {process index: its npz as a dict}, or None."""
  name = f'{n_processes}x{n_local_devices}'
  out = os.path.join(work, name)
  os.makedirs(out, exist_ok=True)
  command = [sys.executable, _WORKER, out]
  env = _env(n_local_devices)
  if n_processes == 1:
    code = subprocess.run(command, env=env, cwd=_REPO, check=False).returncode
  else:
    code = launcher.launch(command, n_processes, env=env)
  if not checks.check(f'{name}: the run exits 0', code == 0, f'status {code}'):
    return None
  results = {}
  for i in range(n_processes):
    with np.load(os.path.join(out, f'process{i}.npz')) as data:
      results[i] = dict(data)
  want = [n_processes, n_local_devices, n_processes * n_local_devices]
  checks.check(
    f'{name}: every process sees [processes, local devices, devices] = {want}',
    all(list(r['devices']) == want for r in results.values()),
    str([list(r['devices']) for r in results.values()]),
  )
  return results


def _max_diff(a, b, prefix):
  keys = sorted(k for k in a if k.startswith(prefix))
  if not keys or keys != sorted(k for k in b if k.startswith(prefix)):
    return float('inf')
  return max(float(np.max(np.abs(a[k] - b[k]))) for k in keys)


def _max_diff_to_reference(result):
  """Our dropout-free weights against trax's default Trainer's (`ref/`)."""
  keys = sorted(k for k in result if k.startswith('ref/'))
  if not keys:
    return float('inf')
  return max(
    float(np.max(np.abs(result[k] - result['plain/w/' + k[4:]]))) for k in keys
  )


def check_runs(checks, runs):
  """The checks of the module docstring, on the three runs' results."""
  for name in ('1x1', '1x2'):
    diff = _max_diff_to_reference(runs[name][0])
    checks.check(
      f"{name} matches trax's default Trainer (< {_TOLERANCE})",
      diff < _TOLERANCE,
      f'{diff:.3g}',
    )
  two = runs['2x1']
  for other in ('1x2', '1x1'):
    reference = runs[other][0]
    for i in (0, 1):
      for part, prefix in (('weights', 'plain/w/'), ('slots', 'plain/s/')):
        diff = _max_diff(two[i], reference, prefix)
        checks.check(
          f'no dropout: process {i} of 2 matches {other} '
          f'{part} (< {_TOLERANCE})',
          diff < _TOLERANCE,
          f'{diff:.3g}',
        )
    # The loss each process reports is the mean over every device.
    checks.check(
      f'no dropout: the loss of 2 processes matches {other}',
      np.allclose(
        two[0]['plain/loss'],
        reference['plain/loss'],
        rtol=1e-7,
        atol=_TOLERANCE,
      ),
      f'{two[0]["plain/loss"]} vs {reference["plain/loss"]}',
    )
  for variant in ('plain', 'dropout'):
    same = (
      _max_diff(two[0], two[1], f'{variant}/w/') == 0
      and _max_diff(two[0], two[1], f'{variant}/s/') == 0
      and np.array_equal(two[0][f'{variant}/loss'], two[1][f'{variant}/loss'])
    )
    checks.check(
      f'{variant}: weights, slots and losses identical on both processes', same
    )
  for name, run in runs.items():
    for i, result in run.items():
      keys = [
        k[len('plain/') :]
        for k in result
        if k.startswith(('plain/w/', 'plain/s/'))
      ]
      for variant, where in (('micro', 'device'), ('micro_host', 'host')):
        diff = max(
          (
            float(
              np.max(np.abs(result[f'{variant}/' + k] - result['plain/' + k]))
            )
            for k in keys
          ),
          default=float('inf'),
        )
        checks.check(
          f'{name} process {i}: 2 micro-batches, gradients '
          f'accumulated on the {where}, match one pass (weights '
          f'and slots < {_TOLERANCE})',
          diff < _TOLERANCE,
          f'{diff:.3g}',
        )
  one = runs['1x2'][0]
  for i in (0, 1):
    for part, prefix in (('weights', 'dropout/w/'), ('slots', 'dropout/s/')):
      diff = _max_diff(two[i], one, prefix)
      checks.check(
        f'dropout: process {i} of 2 matches 1x2 {part} (< {_TOLERANCE})',
        diff < _TOLERANCE,
        f'{diff:.3g}',
      )
  # Dropout masks are drawn per device: one device draws others (so the
  # comparison above can fail).
  diff = _max_diff(runs['1x1'][0], one, 'dropout/w/')
  checks.check(
    'dropout: 1x1 differs from 1x2 (> 1e-4)',
    1e-4 < diff < float('inf'),
    f'{diff:.3g}',
  )


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument(
    '--work_dir',
    default=None,
    help='Where the runs write (default: a temporary '
    'directory, removed at the end).',
  )
  flags = parser.parse_args()
  checks = Checks()
  with tempfile.TemporaryDirectory() as tmp:
    work = flags.work_dir or tmp
    os.makedirs(work, exist_ok=True)
    runs = {
      '2x1': _train(checks, work, 2, 1),
      '1x2': _train(checks, work, 1, 2),
      '1x1': _train(checks, work, 1, 1),
    }
    if all(r is not None for r in runs.values()):
      check_runs(checks, runs)
  print(
    f'{"FAIL" if checks.failed else "PASS"} multiprocess training '
    f'smoke: {len(checks.failed)} check(s) failed',
    flush=True,
  )
  return 1 if checks.failed else 0


if __name__ == '__main__':
  sys.exit(main())
