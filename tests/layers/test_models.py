"""Reformer and Terraformer built with stock classes and, activated, ours.

Same outputs, gradients and reverse_and_grad as stock; checkpoints move both
ways; `reconstruction_error` measures both alike.
"""

import functools
import os
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from trax import layers as tl
from trax import shapes
from trax.layers import combinators as cb
from trax.layers import reversible as stock
import trax.models
from trax.models.research import terraformer

from layer_pairs import FORWARD_TOL
from layer_pairs import GRAD_TOL
from layer_pairs import INIT_RNG
from layer_pairs import RUN_RNG
from layer_pairs import assert_rel_close
from layer_pairs import is_float
from layer_pairs import leaves
from layer_pairs import max_abs_diff
from layer_pairs import random_ct
import trax_revplus
from trax_revplus import layers as ours


VOCAB = 16


def _reformer():
  return trax.models.ReformerLM(
    VOCAB,
    d_model=16,
    d_ff=32,
    d_attention_key=8,
    d_attention_value=8,
    n_layers=2,
    n_heads=2,
    max_len=32,
    dropout=0.1,
    attention_type=[
      functools.partial(
        tl.SelfAttention, chunk_len=4, n_chunks_before=1, use_python_loop=True
      ),
      functools.partial(
        tl.LSHSelfAttention,
        chunk_len=4,
        n_buckets=4,
        n_hashes=2,
        use_python_loop=True,
      ),
    ],
    mode='train',
  )


# In eager mode, efficient attention's lax loops are recompiled on every call.
_python_loop_self_attention = functools.partial(
  tl.SelfAttention, use_python_loop=True
)


def _terraformer():
  # ff_sparsity: sparse feed-forward with _RememberInReverse state, sized as
  # layer_cases.remember_in_reverse so eagerly compiled ops are shared.
  return terraformer.ConfigurableTerraformer(
    VOCAB,
    d_model=16,
    d_ff=32,
    d_attention_key=8,
    d_attention_value=8,
    n_encoder_layers=1,
    n_decoder_layers=1,
    n_decoder_attention_layers=1,
    n_heads=2,
    max_len=32,
    dropout=0.1,
    ff_sparsity=4,
    encoder_attention_type=_python_loop_self_attention,
    encoder_decoder_attention_type=_python_loop_self_attention,
    mode='train',
  )


def _model_inputs(name):
  rs = np.random.RandomState(11)
  if name == 'reformer':
    return rs.randint(1, VOCAB, size=(2, 16)).astype(np.int32)
  return (
    rs.randint(1, VOCAB, size=(2, 8)).astype(np.int32),
    rs.randint(1, VOCAB, size=(2, 8)).astype(np.int32),
  )


def _all_sublayers(layer):
  yield layer
  for sub in layer.sublayers:
    yield from _all_sublayers(sub)


@pytest.fixture(scope='module', params=['reformer', 'terraformer'])
def model_pair(request):
  build = {'reformer': _reformer, 'terraformer': _terraformer}[request.param]
  stock_model = build()
  trax_revplus.activate()
  try:
    our_model = build()
  finally:
    trax_revplus.deactivate()
  x = _model_inputs(request.param)
  sig = shapes.signature(x)
  stock_model.init(sig, rng=INIT_RNG)
  our_model.init(sig, rng=INIT_RNG)
  return request.param, stock_model, our_model, x


def test_activated_model_uses_our_classes(model_pair):
  _, stock_model, our_model, _ = model_pair
  ours_types = {type(l) for l in _all_sublayers(our_model)}
  stock_types = {type(l) for l in _all_sublayers(stock_model)}
  assert ours.ReversibleHalfResidual in ours_types
  assert ours.ReversibleSerial in ours_types
  assert not ours_types & {stock.ReversibleHalfResidual, stock.ReversibleSerial}
  assert stock.ReversibleHalfResidual in stock_types
  assert not stock_types & {ours.ReversibleHalfResidual, ours.ReversibleSerial}


def _float_outputs(y):
  return tuple(v for v in cb._make_tuple(y) if is_float(v))  # pylint: disable=protected-access


def test_model_outputs_and_gradients_match_stock(model_pair):
  _, stock_model, our_model, x = model_pair
  assert max_abs_diff(our_model.weights, stock_model.weights) == 0.0
  weights, state = stock_model.weights, stock_model.state

  y_stock, _ = stock_model.pure_fn(x, weights, state, RUN_RNG)
  y_ours, _ = our_model.pure_fn(x, weights, state, RUN_RNG)
  assert max_abs_diff(y_ours, y_stock) <= FORWARD_TOL
  ct = random_ct(_float_outputs(y_stock), seed=8)

  # jax.grad runs the layers' custom backward, i.e. reverse_and_grad.
  def loss(model, w):
    y, _ = model.pure_fn(x, w, state, RUN_RNG)
    return sum(jnp.sum(v * c) for v, c in zip(_float_outputs(y), ct))

  g_stock = jax.grad(functools.partial(loss, stock_model))(weights)
  g_ours = jax.grad(functools.partial(loss, our_model))(weights)
  assert_rel_close(g_ours, g_stock, GRAD_TOL)
  assert any(np.any(np.asarray(g) != 0) for g in leaves(g_ours))


def test_model_reversible_part_reverse_and_grad_matches_stock(model_pair):
  """reverse_and_grad of the model's decoder ReversibleSerial directly."""
  _, stock_model, our_model, x = model_pair
  weights, state = stock_model.weights, stock_model.state
  rngs = cb._split_rngs(RUN_RNG, len(stock_model.sublayers))  # pylint: disable=protected-access
  stack = x
  for i, layer in enumerate(stock_model.sublayers):
    if isinstance(layer, stock.ReversibleSerial):
      break
    inputs = cb.inputs_from_stack(stack, layer.n_in)
    outputs, _ = layer.pure_fn(inputs, weights[i], state[i], rngs[i])
    stack = cb.outputs_onto_stack(outputs, stack, layer.n_in)
  our_rev = our_model.sublayers[i]
  assert isinstance(our_rev, ours.ReversibleSerial)
  rev_in = cb.inputs_from_stack(stack, layer.n_in)
  y, ns = layer.pure_fn(rev_in, weights[i], state[i], rngs[i])
  ct = random_ct(y, seed=3)
  stock_out = layer.reverse_and_grad(y, ct, weights[i], state[i], ns, rngs[i])
  our_out = our_rev.reverse_and_grad(y, ct, weights[i], state[i], ns, rngs[i])
  assert_rel_close(our_out, stock_out, GRAD_TOL)
  assert_rel_close(our_out[0], rev_in, GRAD_TOL)


def test_checkpoint_round_trip(model_pair):
  """Saved with stock layers, loaded into ours, saved, loaded into stock.

  Loading follows trax's own flow (`Loop`, `trax.supervised.decoding`): the
  model is initialised, here from another rng, then `init_from_file`.
  """
  name, stock_model, _, x = model_pair
  build = {'reformer': _reformer, 'terraformer': _terraformer}[name]
  sig = shapes.signature(x)
  other_rng = jax.random.PRNGKey(99)
  with tempfile.TemporaryDirectory() as tmp:
    stock_path = os.path.join(tmp, 'stock.pkl.gz')
    ours_path = os.path.join(tmp, 'ours.pkl.gz')
    stock_model.save_to_file(stock_path, input_signature=sig)
    trax_revplus.activate()
    try:
      loaded_ours = build()
    finally:
      trax_revplus.deactivate()
    loaded_ours.init(sig, rng=other_rng)
    assert max_abs_diff(loaded_ours.weights, stock_model.weights) > 0
    loaded_ours.init_from_file(stock_path)
    assert max_abs_diff(loaded_ours.weights, stock_model.weights) == 0.0
    assert max_abs_diff(loaded_ours.state, stock_model.state) == 0.0
    loaded_ours.save_to_file(ours_path, input_signature=sig)
    loaded_stock = build()
    loaded_stock.init(sig, rng=other_rng)
    loaded_stock.init_from_file(ours_path)
    assert max_abs_diff(loaded_stock.weights, stock_model.weights) == 0.0
    assert max_abs_diff(loaded_stock.state, stock_model.state) == 0.0


def test_reconstruction_error_on_models(model_pair):
  _, stock_model, our_model, x = model_pair
  weights, state = stock_model.weights, stock_model.state
  records, summary = trax_revplus.reconstruction_error(
    our_model, x, weights, state, RUN_RNG
  )
  reversible = [
    l
    for l in _all_sublayers(our_model)
    if isinstance(l, tl.ReversibleLayer) and not isinstance(l, tl.Serial)
  ]
  assert [r.name for r in records] == [l.name for l in reversible]
  assert [r.index for r in records] == list(range(len(records)))
  for r in records:
    assert 0.0 <= r.max_rel_error < 1e-5
    assert 0.0 <= r.local_max_rel_error < 1e-5
    layer = our_model
    for i in r.path:
      layer = layer.sublayers[i]
    assert layer.name == r.name
  assert f'{len(records)} reversible layers' in summary
  assert '\n' not in summary
  # Stock layers (no reverse on the half-residual) are measured the same way.
  stock_records, _ = trax_revplus.reconstruction_error(
    stock_model, x, weights, state, RUN_RNG
  )
  assert [r.name for r in stock_records] == [r.name for r in records]
  for a, b in zip(stock_records, records):
    assert abs(a.max_abs_error - b.max_abs_error) < 1e-6
