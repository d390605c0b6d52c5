"""Each layer case, ours against stock trax 1.4.1 and `jax.vjp`.

forward, init, reverse and reverse_and_grad of `ReversibleHalfResidual`s in
`ReversibleSerial`s (tests/layers/layer_cases.py), with 1 weight shard and,
for a few, with `N_WEIGHTS_SHARDS = 2`.
"""

import jax
import numpy as np
import pytest
from trax.layers import base
from trax.layers import combinators as cb

import layer_cases
from layer_pairs import FORWARD_TOL
from layer_pairs import GRAD_TOL
from layer_pairs import RUN_RNG
from layer_pairs import assert_rel_close
from layer_pairs import build_pair
from layer_pairs import is_float
from layer_pairs import leaves
from layer_pairs import max_abs_diff
from layer_pairs import random_ct


ALL_CASES = sorted(layer_cases.CASES)
SHARD_CASES = ['dense', 'int_stack']


def _case_params():
  """Every case with 1 weight shard; a few also with N_WEIGHTS_SHARDS = 2."""
  return [(name, 1) for name in ALL_CASES] + [(name, 2) for name in SHARD_CASES]


@pytest.fixture(
  params=_case_params(), ids=[f'{n}-{s}shard' for n, s in _case_params()]
)
def case(request):
  name, shards = request.param
  old = base.N_WEIGHTS_SHARDS
  base.N_WEIGHTS_SHARDS = shards
  try:
    yield build_pair(name)
  finally:
    base.N_WEIGHTS_SHARDS = old


def test_layer_equivalence(case):
  """forward, init, reverse, reverse_and_grad vs stock and jax.vjp."""
  stock_layer, our_layer, x = case
  # Same rng, same init code path: identical weights and state structure.
  assert max_abs_diff(our_layer.weights, stock_layer.weights) == 0.0
  assert max_abs_diff(our_layer.state, stock_layer.state) == 0.0
  assert (our_layer.n_in, our_layer.n_out) == (
    stock_layer.n_in,
    stock_layer.n_out,
  )
  weights, state = stock_layer.weights, stock_layer.state

  y_stock, ns_stock = stock_layer.pure_fn(x, weights, state, RUN_RNG)
  y_ours, ns_ours = our_layer.pure_fn(x, weights, state, RUN_RNG)
  assert max_abs_diff(y_ours, y_stock) <= FORWARD_TOL
  assert max_abs_diff(ns_ours, ns_stock) <= FORWARD_TOL

  # reverse(forward(x)) == x; stock cannot (its half-residual lacks reverse).
  x_rec = our_layer.reverse(y_stock, weights, state, ns_stock, RUN_RNG)
  scale = max(float(np.max(np.abs(v))) for v in x)
  assert max_abs_diff(x_rec, tuple(x)) <= 1e-5 * scale

  ct = random_ct(y_stock, seed=5)
  stock_x, (stock_x_ct, stock_w_ct) = stock_layer.reverse_and_grad(
    y_stock, ct, weights, state, ns_stock, RUN_RNG
  )
  our_x, (our_x_ct, our_w_ct) = our_layer.reverse_and_grad(
    y_stock, ct, weights, state, ns_stock, RUN_RNG
  )
  assert max_abs_diff(our_x, stock_x) <= 1e-5 * scale
  assert_rel_close(our_x_ct, stock_x_ct, GRAD_TOL)
  assert_rel_close(our_w_ct, stock_w_ct, GRAD_TOL)

  # Against ordinary autodiff of the forward computation.
  y_plain, vjp_fn = jax.vjp(
    lambda x, w: _plain_forward(our_layer, x, w, state, RUN_RNG),
    tuple(x),
    weights,
  )
  assert max_abs_diff(y_plain, y_stock) <= FORWARD_TOL
  vjp_x_ct, vjp_w_ct = vjp_fn(ct)
  assert_rel_close(our_x_ct, vjp_x_ct, GRAD_TOL)
  assert_rel_close(our_w_ct, vjp_w_ct, GRAD_TOL)
  # A zero gradient would make the comparisons above vacuous.
  assert any(
    np.any(np.asarray(g) != 0) for g in leaves(our_w_ct) if is_float(g)
  )


def _plain_forward(layer, x, weights, state, rng):
  """Reversible layer's forward without its custom (reversing) gradient.

  Opens up `ReversibleSerial`s with `Serial.forward`'s rng split and runs
  other reversible layers' `forward` directly, so `jax.vjp` of this is
  ordinary autodiff of the forward computation.
  """
  if isinstance(layer, cb.Serial):
    stack = x
    for sub, w, s, r in zip(
      layer.sublayers, weights, state, cb._split_rngs(rng, len(layer.sublayers))
    ):  # pylint: disable=protected-access
      inputs = cb.inputs_from_stack(stack, sub.n_in)
      outputs = _plain_forward(sub, inputs, w, s, r)
      stack = cb.outputs_onto_stack(outputs, stack, sub.n_in)
    return stack
  return layer._pure_forward(x, weights, state, rng)  # pylint: disable=protected-access
