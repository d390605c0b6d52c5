"""`ReversibleHalfResidual`: remat with sharded weights; numpy arguments."""

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest
from trax import layers as tl
from trax import shapes
from trax.layers import base
from trax.layers import reversible as stock

import layer_cases
from layer_pairs import FORWARD_TOL
from layer_pairs import GRAD_TOL
from layer_pairs import INIT_RNG
from layer_pairs import RUN_RNG
from layer_pairs import assert_rel_close
from layer_pairs import build_pair
from layer_pairs import max_abs_diff
from layer_pairs import random_ct
from trax_revplus import layers as ours


@pytest.fixture(params=[1, 2], ids=['1shard', '2shards'])
def n_weights_shards(request):
  old = base.N_WEIGHTS_SHARDS
  base.N_WEIGHTS_SHARDS = request.param
  try:
    yield request.param
  finally:
    base.N_WEIGHTS_SHARDS = old


def _primitive_names(jaxpr):
  names = set()
  for eqn in jaxpr.eqns:
    names.add(eqn.primitive.name)
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      names |= _primitive_names(sub)
  return names


def test_weight_sharding_rematerialises_residual(n_weights_shards):
  """With N_WEIGHTS_SHARDS > 1 the residual runs under jax.checkpoint."""
  _, layer, x = build_pair('dense')
  half = layer.sublayers[0]
  xs = tuple(x)
  w, s = half.weights, half.state
  y, ns = half.pure_fn(xs, w, s, RUN_RNG)
  fwd = jax.make_jaxpr(lambda xs: half.pure_fn(xs, w, s, RUN_RNG)[0])(xs)
  ct = random_ct(y, 1)
  bwd = jax.make_jaxpr(
    lambda y: half.reverse_and_grad(y, ct, w, s, ns, RUN_RNG)
  )(y)
  remat = {'checkpoint', 'remat', 'remat2'}
  for jaxpr in (fwd, bwd):
    found = bool(_primitive_names(jaxpr.jaxpr) & remat)
    assert found == (n_weights_shards > 1)


def _lsh_half_residual(hr):
  """LSH attention running its `lax.fori_loop` (no use_python_loop)."""
  attn = tl.LSHSelfAttention(
    n_heads=2,
    d_qk=8,
    d_v=8,
    causal=True,
    chunk_len=4,
    n_hashes=2,
    n_buckets=4,
    attention_dropout=0.1,
    output_dropout=0.1,
    mode='train',
  )
  return hr(tl.LayerNorm(), attention_layer=attn)


def test_lsh_reverse_and_grad_takes_numpy_and_jax_arrays():
  """Stock raises TracerArrayConversionError on numpy cotangents, weights or
  state; ours takes them and gives what stock gives for jax arrays."""
  x = layer_cases._pair()  # pylint: disable=protected-access
  stock_layer = _lsh_half_residual(stock.ReversibleHalfResidual)
  our_layer = _lsh_half_residual(ours.ReversibleHalfResidual)
  sig = shapes.signature(x)
  stock_layer.init(sig, rng=INIT_RNG)
  our_layer.init(sig, rng=INIT_RNG)
  weights, state = stock_layer.weights, stock_layer.state
  as_jax = lambda t: jax.tree_util.tree_map(jnp.asarray, t)
  as_numpy = lambda t: jax.tree_util.tree_map(np.asarray, t)

  y, new_state = stock_layer.pure_fn(x, weights, state, RUN_RNG)
  ct = random_ct(y, seed=6)  # numpy
  reference = stock_layer.reverse_and_grad(
    as_jax(y), as_jax(ct), weights, state, new_state, RUN_RNG
  )
  with pytest.raises(jax.errors.TracerArrayConversionError):
    stock_layer.reverse_and_grad(
      as_numpy(y), ct, weights, state, new_state, RUN_RNG
    )
  arguments = (y, ct, weights, state, new_state)
  for convert in (as_numpy, as_jax):
    got = our_layer.reverse_and_grad(*convert(arguments), RUN_RNG)
    assert_rel_close(got, reference, GRAD_TOL)
  # Forward and reverse take numpy weights and state too.
  y_ours, _ = our_layer.pure_fn(x, as_numpy(weights), as_numpy(state), RUN_RNG)
  assert max_abs_diff(y_ours, y) <= FORWARD_TOL
  x_rec = our_layer.reverse(
    *as_numpy((y, weights, state, new_state)), rng=RUN_RNG
  )
  assert max_abs_diff(x_rec, tuple(x)) <= 1e-5 * max(
    float(np.max(np.abs(v))) for v in x
  )
