"""Multi-process training (jax.distributed on loopback) equals one process.

The same tiny reversible model trains 3 steps on the same global batch of 8
rows as 2 processes x 1 CPU device, 1 process x 2 devices and 1 process x
1 device (tests/multiprocess/training_worker.py; the last in the test's own
process); weights and optimizer slots must agree, and the one-device run
must agree with trax's default `Trainer`. The processes are real
(`trax_revplus.multiprocess.launcher`); their waits have no fixed deadline
(a busy machine is slow, not wrong): the launcher ends every process when
one fails.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

import training_worker
import trax_revplus
from trax_revplus.multiprocess import launcher

_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                       'training_worker.py')
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
_TOLERANCE = 1e-5


def _env(n_local_devices):
  env = dict(os.environ)
  flags = [f for f in env.get('XLA_FLAGS', '').split()
           if 'xla_force_host_platform_device_count' not in f]
  if n_local_devices > 1:
    flags.append(
        f'--xla_force_host_platform_device_count={n_local_devices}')
  env['XLA_FLAGS'] = ' '.join(flags)
  env['JAX_PLATFORMS'] = 'cpu'
  env['PYTHONPATH'] = os.pathsep.join(
      [_REPO] + [p for p in env.get('PYTHONPATH', '').split(os.pathsep) if p])
  return env


def _train(tmp_path, name, n_processes, n_local_devices):
  """Runs the worker; returns {process index: its npz as a dict}.

  1 process x 1 device trains here, in the test's own process (one CPU
  device); the others in fresh processes.
  """
  out = tmp_path / name
  out.mkdir()
  command = [sys.executable, _WORKER, str(out)]
  env = _env(n_local_devices)
  if (n_processes, n_local_devices) == (1, 1):
    try:
      training_worker.train(str(out))
    finally:
      trax_revplus.deactivate()
  elif n_processes == 1:
    subprocess.run(command, env=env, check=True, cwd=_REPO)
  else:
    assert launcher.launch(command, n_processes, env=env) == 0
  results = {}
  for i in range(n_processes):
    with np.load(out / f'process{i}.npz') as data:
      results[i] = dict(data)
  for result in results.values():
    assert list(result['devices']) == [
        n_processes, n_local_devices, n_processes * n_local_devices]
  return results


def _max_diff(a, b, prefix):
  keys = sorted(k for k in a if k.startswith(prefix))
  assert keys and keys == sorted(k for k in b if k.startswith(prefix))
  return max(float(np.max(np.abs(a[k] - b[k]))) for k in keys)


def _max_diff_to_reference(result):
  """Our dropout-free weights against trax's default Trainer's (`ref/`)."""
  keys = sorted(k for k in result if k.startswith('ref/'))
  assert keys
  return max(float(np.max(np.abs(result[k] - result['plain/w/' + k[4:]])))
             for k in keys)


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  """The worker's results as 2 processes x 1 device, 1 x 2 and 1 x 1."""
  tmp_path = tmp_path_factory.mktemp('multiprocess')
  return {'2x1': _train(tmp_path, '2x1', 2, 1),
          '1x2': _train(tmp_path, '1x2', 1, 2),
          '1x1': _train(tmp_path, '1x1', 1, 1)}


def test_one_process_matches_trax_default_trainer(runs):
  assert _max_diff_to_reference(runs['1x1'][0]) < _TOLERANCE
  assert _max_diff_to_reference(runs['1x2'][0]) < _TOLERANCE


@pytest.mark.parametrize('other', ['1x2', '1x1'])
def test_two_processes_match_one_process_without_dropout(runs, other):
  two = runs['2x1']
  reference = runs[other][0]
  for i in (0, 1):
    assert _max_diff(two[i], reference, 'plain/w/') < _TOLERANCE
    assert _max_diff(two[i], reference, 'plain/s/') < _TOLERANCE
  # The loss each process reports is the mean over every device.
  np.testing.assert_allclose(two[0]['plain/loss'], reference['plain/loss'],
                             atol=_TOLERANCE)


def test_weights_and_slots_are_identical_on_every_process(runs):
  two = runs['2x1']
  for variant in ('plain', 'dropout'):
    assert _max_diff(two[0], two[1], f'{variant}/w/') == 0
    assert _max_diff(two[0], two[1], f'{variant}/s/') == 0
    np.testing.assert_array_equal(two[0][f'{variant}/loss'],
                                  two[1][f'{variant}/loss'])


def test_with_dropout_two_processes_match_one_process_two_devices(runs):
  two, one = runs['2x1'], runs['1x2'][0]
  for i in (0, 1):
    assert _max_diff(two[i], one, 'dropout/w/') < _TOLERANCE
    assert _max_diff(two[i], one, 'dropout/s/') < _TOLERANCE
  # Dropout masks are drawn per device: one device draws others (so this
  # comparison can fail).
  assert _max_diff(runs['1x1'][0], one, 'dropout/w/') > 1e-4
