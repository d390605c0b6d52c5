"""trax_revplus.compat: trax 1.4.1 helpers rewritten for current JAX."""

import importlib
import os
import warnings

import jax
import numpy as np
import pytest
from trax import fastmath

import trax_revplus
from trax_revplus import compat

from conftest import run_multidevice_worker

STOCK_BASELINE_WORKER = os.path.join(
  os.path.dirname(__file__), 'stock_baseline_worker.py'
)
# The module itself: `trax.fastmath.numpy` as an attribute is jax.numpy.
trax_numpy = importlib.import_module('trax.fastmath.numpy')


@pytest.fixture(autouse=True)
def _stock_trax():
  trax_revplus.deactivate()
  yield


def _slots_like_a_trainer():
  """Slots as a trainer keeps them: arrays beside () of weightless layers."""
  a = jax.device_put(np.arange(6, dtype=np.float32).reshape(2, 3))
  b = jax.device_put(np.ones((4,), np.float32))
  return [((a, b), ()), (), [{'m': a}]]


def test_stock_tree_unflatten_fails_on_current_jax():
  # The bug compat fixes: trax's version compares arrays with `in`.
  tree = _slots_like_a_trainer()
  flat = [np.zeros((2, 3)), np.zeros((4,)), np.zeros((2, 3))]
  with pytest.raises((TypeError, ValueError)):
    trax_numpy.tree_unflatten(flat, tree, copy_from_tree=[None, ()])


def test_tree_unflatten_restores_arrays_and_keeps_empty_leaves():
  tree = _slots_like_a_trainer()
  flat = [
    np.full((2, 3), 7.0),
    np.full((4,), 8.0),
    np.full((2, 3), 9.0),
    np.zeros(1),
  ]
  new_tree, rest = compat.tree_unflatten(flat, tree, copy_from_tree=[None, ()])
  (x, y), empty = new_tree[0]
  assert empty == () and new_tree[1] == ()
  np.testing.assert_array_equal(x, flat[0])
  np.testing.assert_array_equal(y, flat[1])
  np.testing.assert_array_equal(new_tree[2][0]['m'], flat[2])
  assert isinstance(new_tree[0], tuple) and isinstance(new_tree[2], list)
  assert len(rest) == 1 and rest[0] is flat[3]
  # Same structure as trax's own flatten of the tree, leaf for leaf.
  assert len(fastmath.tree_flatten(new_tree)) == 3


def test_tree_unflatten_without_copy_from_tree_matches_stock():
  tree = [(np.zeros(2), 3.0), {'k': np.zeros(1)}]
  flat = [np.ones(2), 5.0, np.ones(1)]
  ours, ours_rest = compat.tree_unflatten(flat, tree)
  stock, stock_rest = trax_numpy.tree_unflatten(flat, tree)
  ours_leaves = fastmath.tree_flatten(ours)
  stock_leaves = fastmath.tree_flatten(stock)
  assert len(ours_leaves) == len(stock_leaves) == 3
  for a, b in zip(ours_leaves, stock_leaves):
    assert a is b
  assert ours_rest == stock_rest == []


def test_for_n_devices_adds_a_device_axis_without_copying():
  x = {
    'w': np.arange(6, dtype=np.float32).reshape(2, 3),
    'b': (np.float32(2.0),),
  }
  assert compat.for_n_devices(x, 1) is x
  y = compat.for_n_devices(x, 4)
  assert y['w'].shape == (4, 2, 3) and y['b'][0].shape == (4,)
  for i in range(4):
    np.testing.assert_array_equal(y['w'][i], x['w'])
  assert np.shares_memory(y['w'], x['w'])


def _jax_deprecations(record):
  return [
    str(w.message)
    for w in record
    if issubclass(w.category, (DeprecationWarning, UserWarning))
    and ('deprecated' in str(w.message) or 'renamed' in str(w.message))
  ]


def test_init_host_and_devices_matches_stock_without_deprecated_calls(
  monkeypatch,
):
  from trax.supervised import training  # pylint: disable=g-import-not-at-top

  with warnings.catch_warnings(record=True) as record:
    warnings.simplefilter('always')
    stock = training.init_host_and_devices(None, 3)
  # What compat removes: trax calls jax.host_count(), deprecated.
  assert any('process_count' in m for m in _jax_deprecations(record))
  with warnings.catch_warnings(record=True) as record:
    warnings.simplefilter('always')
    ours = compat.init_host_and_devices(None, 3)
  assert not _jax_deprecations(record)
  assert ours[:3] == stock[:3] == (True, 1, jax.local_device_count())
  np.testing.assert_array_equal(np.asarray(ours[3]), np.asarray(stock[3]))
  # Keeps working once JAX removes the old name.
  monkeypatch.delattr(jax, 'host_count')
  assert compat.init_host_and_devices(None, 3)[:3] == stock[:3]
  with pytest.raises(ValueError, match='n_devices != all devices'):
    compat.init_host_and_devices(jax.local_device_count() + 1, 3)


def _jit_refusing_device_arguments(fun, **kwargs):
  """jax.jit as it will be once `device` and `backend` are gone."""
  if 'device' in kwargs or 'backend' in kwargs:
    raise TypeError('jit() got an unexpected keyword argument')
  return jax.jit(fun, **kwargs)


def test_accelerate_on_cpu_matches_stock_without_deprecated_calls(monkeypatch):
  from trax.layers import acceleration  # pylint: disable=g-import-not-at-top

  def f(x, weights):
    return {'y': x @ weights[0] + weights[1]}

  x = np.arange(6, dtype=np.float32).reshape(2, 3)
  weights = (np.ones((3, 2), np.float32), np.float32(0.5))
  with warnings.catch_warnings(record=True) as record:
    warnings.simplefilter('always')
    stock = acceleration._accelerate(f, 0)(x, weights)  # pylint: disable=protected-access
  assert any('device argument on jit' in m for m in _jax_deprecations(record))
  with warnings.catch_warnings(record=True) as record:
    warnings.simplefilter('always')
    ours = compat.accelerate(f, 0)(x, weights)
  assert not _jax_deprecations(record)
  np.testing.assert_array_equal(ours['y'], stock['y'])
  assert ours['y'].devices() == {jax.devices('cpu')[0]}
  # Keeps working once jit takes no `device`: trax's backend table is what
  # fastmath.jit calls.
  jax_backend = importlib.import_module('trax.fastmath.jax')
  monkeypatch.setitem(
    jax_backend.JAX_BACKEND, 'jit', _jit_refusing_device_arguments
  )
  np.testing.assert_array_equal(
    compat.accelerate(f, 0)(x, weights)['y'], stock['y']
  )
  np.testing.assert_array_equal(
    compat.accelerate(f, 1)(x, weights)['y'], stock['y']
  )


def test_stock_baseline_runs_stock_where_its_rng_and_weights_part():
  """Stock's one-device step with its weights on an accelerator and the
  Loop's RNG on the host (a TPU or GPU on current JAX, stood in for by a
  second CPU device) fails as it ships; within `stock_baseline()` it trains
  to the weights of the same run with no accelerator."""
  result = run_multidevice_worker(2, script=STOCK_BASELINE_WORKER)
  assert 'incompatible devices' in result['stock_error']
  assert result['weight_arrays'] == 7 and result['trained']
  assert result['same_weights']
