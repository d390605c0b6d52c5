"""Shared checks of the layer tests: stock and our layers side by side.

Every check builds the same layer mix twice, once from stock
`trax.layers.reversible` classes and once from ours, gives both the same
weights, state and rng, and compares with the stock result or with `jax.vjp`
of the plain (non-reversible) forward computation.
"""

import jax
import jax.numpy as jnp
import numpy as np
from trax import shapes
from trax.layers import reversible as stock

import layer_cases
from trax_revplus import layers as ours

INIT_RNG = jax.random.PRNGKey(17)
RUN_RNG = jax.random.PRNGKey(4)

# Same code path and backend: only reordering by XLA may differ.
FORWARD_TOL = 1e-6
GRAD_TOL = 1e-5


def leaves(tree):
  return jax.tree_util.tree_leaves(tree)


def is_float(x):
  return jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact)


def max_abs_diff(a, b):
  """Max |a - b| over matching leaves; asserts same structure, exact ints."""
  la, lb = leaves(a), leaves(b)
  assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
  worst = 0.0
  for x, y in zip(la, lb):
    x, y = np.asarray(x), np.asarray(y)
    assert x.shape == y.shape and x.dtype == y.dtype, (x.shape, y.shape)
    if x.dtype == jax.dtypes.float0:
      continue
    if not np.issubdtype(x.dtype, np.inexact):
      np.testing.assert_array_equal(x, y)
      continue
    if x.size:
      worst = max(worst, float(np.max(np.abs(x.astype(np.float64) - y))))
  return worst


def assert_rel_close(actual, expected, tol):
  """max |actual - expected| <= tol * max(1, max |expected|), per leaf."""
  for x, y in zip(leaves(actual), leaves(expected)):
    y = np.asarray(y)
    if y.dtype == jax.dtypes.float0 or not y.size:
      continue
    scale = max(1.0, float(np.max(np.abs(y.astype(np.float64)))))
    assert max_abs_diff(x, y) <= tol * scale


def random_ct(tree, seed):
  """Random float cotangents; float0 zeros for int/bool leaves."""
  rs = np.random.RandomState(seed)

  def ct(x):
    x = np.asarray(x)
    if np.issubdtype(x.dtype, np.inexact):
      return rs.normal(size=x.shape).astype(x.dtype)
    return np.zeros(x.shape, dtype=jax.dtypes.float0)

  return jax.tree_util.tree_map(ct, tree)


def build_pair(case_name):
  case = layer_cases.CASES[case_name]
  stock_layer, x = case(stock.ReversibleHalfResidual, stock.ReversibleSerial)
  our_layer, _ = case(ours.ReversibleHalfResidual, ours.ReversibleSerial)
  sig = shapes.signature(x)
  stock_layer.init(sig, rng=INIT_RNG)
  our_layer.init(sig, rng=INIT_RNG)
  return stock_layer, our_layer, x
