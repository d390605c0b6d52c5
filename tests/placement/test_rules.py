"""trax_revplus.placement.rules: each rule's placed arrays have the shapes,
dtypes and shardings of the types compiled ahead for them
(`Placement.abstract_*`), on one device and on N forced CPU devices (a
fresh process)."""

import os

import pytest

from conftest import run_multidevice_worker
import rules_worker

_WORKER = os.path.join(os.path.dirname(__file__), 'rules_worker.py')


def _assert_the_same(result, n_devices):
  for name, (placed, types) in result.items():
    assert placed == types, name
  batch = result['batch'][0]
  assert batch[0][:2] == (
    [[n_devices, 8 // n_devices, 3], 'int32']
    if n_devices > 1
    else [[8, 3], 'int32']
  )


def test_one_device_types_are_the_placed_ones():
  result = rules_worker.placed_and_types(1)
  _assert_the_same(result, 1)
  # One CPU device: weights and state stay host arrays, as placed.
  assert result['params'][0][0][0] == 'host'


@pytest.mark.parametrize('n_devices', [2])
def test_n_devices_types_are_the_placed_ones(n_devices):
  result = run_multidevice_worker(n_devices, 'placed_and_types', script=_WORKER)
  _assert_the_same(result, n_devices)
  assert result['per_device'][0][0][0] == [n_devices, 4]
