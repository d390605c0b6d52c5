"""A run resumed on another device count, under a device memory budget,
plans and trains as the run that never moved.

The run trains 2 steps on one device, 2 more resumed on 2 devices, and 2
more resumed on one device again, each part in a fresh process on forced
CPU devices (tests/checkpoints/device_count_worker.py); the reference is
the same 6 steps uninterrupted on one device. A checkpoint written on 2
devices once held a layer's scalar state as a numpy scalar (device 0's
copy indexed out of its per-device array), which the planner cannot type
ahead: the resume on one device stopped with `DeviceMemoryBudgetError`.

The same across process counts (1 -> 2 real processes on loopback -> 1,
through `trax-revplus train` and `launch`): check 7 of
tools/multiprocess_training_smoke.py, which CI runs.
"""

import os

import numpy as np

from conftest import run_multidevice_worker

_WORKER = os.path.join(os.path.dirname(__file__), 'device_count_worker.py')


def _train(monkeypatch, n_devices, *runs):
  """The worker's figures of `runs` ((dir, steps), in order) on
  `n_devices` forced devices, in a fresh process."""
  monkeypatch.setenv(
    'DEVICE_COUNT_RUNS', ','.join(f'{path}:{steps}' for path, steps in runs)
  )
  return run_multidevice_worker(n_devices, script=_WORKER)


def _assert_close(moved, unmoved):
  assert len(moved) == len(unmoved)
  for a, b in zip(moved, unmoved):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-5)


def test_resume_one_two_one_device_under_a_budget_trains_as_unmoved(
  tmp_path, monkeypatch
):
  unmoved, moved = str(tmp_path / 'unmoved'), str(tmp_path / 'moved')
  first = _train(monkeypatch, 1, (unmoved, 6), (moved, 2))
  second = _train(monkeypatch, 2, (moved, 4))[moved]
  third = _train(monkeypatch, 1, (moved, 6))[moved]
  reference, first = first[unmoved], first[moved]
  starts = [run['first_step'] for run in (first, second, third)]
  assert starts == [0, 2, 4]
  losses = first['losses'] + second['losses'] + third['losses']
  assert len(losses) == 6
  np.testing.assert_allclose(losses, reference['losses'], rtol=0, atol=1e-5)
  _assert_close(third['weights'], reference['weights'])
  _assert_close(third['slots'], reference['slots'])
  # One device plans alike whichever device count wrote the checkpoint.
  assert third['plan'] == first['plan'] == reference['plan']
  # On any device count the host keeps (and saves) a scalar state as the
  # 0-d array the layer was initialized with.
  for run in (first, second, third, reference):
    assert run['state_types'] == ['ndarray'], run['state_types']
