"""trax_revplus.compat: trax 1.4.1 helpers rewritten for current JAX."""

import importlib

import jax
import numpy as np
import pytest
from trax import fastmath

import trax_revplus
from trax_revplus import compat

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
  flat = [np.full((2, 3), 7.0), np.full((4,), 8.0), np.full((2, 3), 9.0),
          np.zeros(1)]
  new_tree, rest = compat.tree_unflatten(flat, tree,
                                         copy_from_tree=[None, ()])
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
  x = {'w': np.arange(6, dtype=np.float32).reshape(2, 3),
       'b': (np.float32(2.0),)}
  assert compat.for_n_devices(x, 1) is x
  y = compat.for_n_devices(x, 4)
  assert y['w'].shape == (4, 2, 3) and y['b'][0].shape == (4,)
  for i in range(4):
    np.testing.assert_array_equal(y['w'][i], x['w'])
  assert np.shares_memory(y['w'], x['w'])
