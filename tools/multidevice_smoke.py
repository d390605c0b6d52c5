"""End-to-end check of ReversibleSerialTrainer on 4 forced CPU devices.

Runs tests/placement/multidevice_worker.py in a fresh process with
XLA_FLAGS=--xla_force_host_platform_device_count=4 set before JAX starts,
and checks what tests/placement/test_multidevice.py checks on 2 devices in
the suite:

  1. the worker exits 0 and sees 4 local devices;
  2. ours on 4 devices matches trax's default Trainer on one device, ours on
     one device, ours with free_accelerators_on_step=True, and ours with
     batch_slices=2 against the default Trainer; a ReformerLM with LSH
     attention gives the same with batch_slices=2 as with 1; ours planned
     under a device memory budget (1 GiB, and the least plan's own peak)
     against the default Trainer (all max abs differences <= 1e-5);
  3. the loss has one value per device; Adasum trains to finite weights
     that differ from plain averaging; every weight is a host numpy array;
  4. every function of the step compiles ahead on helper threads, and
     nothing compiled ahead compiles again when called (the same total as
     without compiling ahead).

Prints one PASS or FAIL line per check; exit status 0 when all pass, 1
otherwise.

Usage:
  python tools/multidevice_smoke.py [--work_dir=DIR] [--n_devices=4]

Takes a few minutes: the worker imports trax (~20-60 s on a busy machine)
and trains 8 small runs.
"""

import argparse
import json
import os
import subprocess
import sys

from smoke_checks import Checks

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_WORKER = os.path.join(_REPO, 'tests', 'placement', 'multidevice_worker.py')
_TOLERANCE = 1e-5


def _run_worker(n_devices, work_dir):
  """(exit status, the worker's JSON result or None, stderr)."""
  env = dict(os.environ)
  env['XLA_FLAGS'] = (
    env.get('XLA_FLAGS', '')
    + f' --xla_force_host_platform_device_count={n_devices}'
  )
  env['JAX_PLATFORMS'] = 'cpu'
  proc = subprocess.run(
    [sys.executable, _WORKER, str(n_devices)],
    env=env,
    capture_output=True,
    text=True,
    cwd=_REPO,
    check=False,
  )
  if work_dir:
    os.makedirs(work_dir, exist_ok=True)
    with open(os.path.join(work_dir, 'worker.out'), 'w') as f:
      f.write(proc.stdout)
    with open(os.path.join(work_dir, 'worker.err'), 'w') as f:
      f.write(proc.stderr)
  lines = proc.stdout.strip().splitlines()
  result = json.loads(lines[-1]) if proc.returncode == 0 and lines else None
  return proc.returncode, result, proc.stderr


def check_result(checks, n, result):
  checks.check(
    f'{n} local devices',
    result['local_devices'] == n,
    str(result['local_devices']),
  )
  for key, what in (
    ('max_diff_vs_default_1dev', "trax's default Trainer on one device"),
    ('max_diff_vs_ours_1dev', 'ours on one device'),
    ('max_diff_free', 'ours with free_accelerators_on_step=True'),
    (
      'max_diff_slices_vs_default_1dev',
      "batch_slices=2 vs trax's default Trainer",
    ),
    (
      'max_diff_fused_vs_default_1dev',
      "every layer in one program vs trax's default Trainer",
    ),
    (
      'max_diff_budget_vs_default_1dev',
      "planned under a 1 GiB budget vs trax's default Trainer",
    ),
    (
      'max_diff_least_vs_default_1dev',
      "planned under the least plan's peak vs trax's default Trainer",
    ),
    ('max_diff_lsh_slices', 'LSH ReformerLM: batch_slices=2 vs 1'),
  ):
    checks.check(
      f'{n} devices match {what} (<= {_TOLERANCE})',
      result[key] <= _TOLERANCE,
      f'{result[key]:.3g}',
    )
  checks.check(
    'one loss per device',
    result['loss_shape'] == [n],
    str(result['loss_shape']),
  )
  checks.check(
    'Adasum: finite weights, not plain averaging',
    result['adasum_finite'] and result['adasum_diff_vs_mean'] > 0,
    f'finite {result["adasum_finite"]}, diff '
    f'{result["adasum_diff_vs_mean"]:.3g}',
  )
  checks.check('every weight a host numpy array', result['weights_are_numpy'])
  checks.check(
    'a budget plans on N devices: the fused program under 1 GiB',
    result['budget_plan']['fused_layers'] > 0,
    str(result['budget_plan']),
  )
  # Every function of the step compiles ahead on N CPU devices, those
  # whose calls wait for their collectives (`Placement.sync_collectives`)
  # too, and none of them compiles again.
  helper, total = result['compiles_ahead']
  checks.check(
    'compiled ahead on helper threads, nothing again when called',
    helper == total == result['compiles_when_called'],
    f'{helper} on helpers, {total} in all vs '
    f'{result["compiles_when_called"]} when called',
  )


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument(
    '--work_dir',
    default=None,
    help="Where to keep the worker's output (default: nowhere).",
  )
  parser.add_argument(
    '--n_devices',
    type=int,
    default=4,
    help='Forced CPU devices (default 4; the suite runs 2).',
  )
  flags = parser.parse_args()
  checks = Checks()
  n = flags.n_devices
  code, result, err = _run_worker(n, flags.work_dir)
  if checks.check(
    f'worker on {n} devices exits 0 with a result',
    result is not None,
    f'status {code}',
  ):
    check_result(checks, n, result)
  else:
    print(err[-5000:], file=sys.stderr)
  print(
    f'{"FAIL" if checks.failed else "PASS"} multidevice smoke: '
    f'{len(checks.failed)} check(s) failed',
    flush=True,
  )
  return 1 if checks.failed else 0


if __name__ == '__main__':
  sys.exit(main())
