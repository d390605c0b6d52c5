"""trax_revplus.layers versus stock trax 1.4.1 and jax.vjp.

Every check builds the same layer mix twice, once from stock
`trax.layers.reversible` classes and once from ours, gives both the same
weights, state and rng, and compares with the stock result or with `jax.vjp`
of the plain (non-reversible) forward computation.
"""

import functools
import os
import tempfile

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest
from trax import layers as tl
from trax import shapes
from trax.layers import base
from trax.layers import combinators as cb
from trax.layers import reversible as stock
from trax.optimizers import trainer as stock_trainer
import trax.models
from trax.models.research import terraformer

import layer_cases
import trax_revplus
from trax_revplus import layers as ours

INIT_RNG = jax.random.PRNGKey(17)
RUN_RNG = jax.random.PRNGKey(4)

# Same code path and backend: only reordering by XLA may differ.
FORWARD_TOL = 1e-6
GRAD_TOL = 1e-5


def _leaves(tree):
  return jax.tree_util.tree_leaves(tree)


def _is_float(x):
  return jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact)


def _max_abs_diff(a, b):
  """Max |a - b| over matching leaves; asserts same structure, exact ints."""
  la, lb = _leaves(a), _leaves(b)
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


def _assert_rel_close(actual, expected, tol):
  """max |actual - expected| <= tol * max(1, max |expected|), per leaf."""
  for x, y in zip(_leaves(actual), _leaves(expected)):
    y = np.asarray(y)
    if y.dtype == jax.dtypes.float0 or not y.size:
      continue
    scale = max(1.0, float(np.max(np.abs(y.astype(np.float64)))))
    assert _max_abs_diff(x, y) <= tol * scale


def _random_ct(tree, seed):
  """Random float cotangents; float0 zeros for int/bool leaves."""
  rs = np.random.RandomState(seed)
  def ct(x):
    x = np.asarray(x)
    if np.issubdtype(x.dtype, np.inexact):
      return rs.normal(size=x.shape).astype(x.dtype)
    return np.zeros(x.shape, dtype=jax.dtypes.float0)
  return jax.tree_util.tree_map(ct, tree)


def _plain_forward(layer, x, weights, state, rng):
  """Reversible layer's forward without its custom (reversing) gradient.

  Opens up `ReversibleSerial`s with `Serial.forward`'s rng split and runs
  other reversible layers' `forward` directly, so `jax.vjp` of this is
  ordinary autodiff of the forward computation.
  """
  if isinstance(layer, cb.Serial):
    stack = x
    for sub, w, s, r in zip(layer.sublayers, weights, state,
                            cb._split_rngs(rng, len(layer.sublayers))):  # pylint: disable=protected-access
      inputs = cb.inputs_from_stack(stack, sub.n_in)
      outputs = _plain_forward(sub, inputs, w, s, r)
      stack = cb.outputs_onto_stack(outputs, stack, sub.n_in)
    return stack
  return layer._pure_forward(x, weights, state, rng)  # pylint: disable=protected-access


def _build_pair(case_name):
  case = layer_cases.CASES[case_name]
  stock_layer, x = case(stock.ReversibleHalfResidual, stock.ReversibleSerial)
  our_layer, _ = case(ours.ReversibleHalfResidual, ours.ReversibleSerial)
  sig = shapes.signature(x)
  stock_layer.init(sig, rng=INIT_RNG)
  our_layer.init(sig, rng=INIT_RNG)
  return stock_layer, our_layer, x


@pytest.fixture(params=[1, 2], ids=['1shard', '2shards'])
def n_weights_shards(request):
  old = base.N_WEIGHTS_SHARDS
  base.N_WEIGHTS_SHARDS = request.param
  try:
    yield request.param
  finally:
    base.N_WEIGHTS_SHARDS = old


ALL_CASES = sorted(layer_cases.CASES)
SHARD_CASES = ['dense', 'int_stack']


def _case_params():
  """Every case with 1 weight shard; a few also with N_WEIGHTS_SHARDS = 2."""
  return ([(name, 1) for name in ALL_CASES] +
          [(name, 2) for name in SHARD_CASES])


@pytest.fixture(params=_case_params(),
                ids=[f'{n}-{s}shard' for n, s in _case_params()])
def case(request):
  name, shards = request.param
  old = base.N_WEIGHTS_SHARDS
  base.N_WEIGHTS_SHARDS = shards
  try:
    yield _build_pair(name)
  finally:
    base.N_WEIGHTS_SHARDS = old


def test_layer_equivalence(case):
  """forward, init, reverse, reverse_and_grad vs stock and jax.vjp."""
  stock_layer, our_layer, x = case
  # Same rng, same init code path: identical weights and state structure.
  assert _max_abs_diff(our_layer.weights, stock_layer.weights) == 0.0
  assert _max_abs_diff(our_layer.state, stock_layer.state) == 0.0
  assert (our_layer.n_in, our_layer.n_out) == (stock_layer.n_in,
                                               stock_layer.n_out)
  weights, state = stock_layer.weights, stock_layer.state

  y_stock, ns_stock = stock_layer.pure_fn(x, weights, state, RUN_RNG)
  y_ours, ns_ours = our_layer.pure_fn(x, weights, state, RUN_RNG)
  assert _max_abs_diff(y_ours, y_stock) <= FORWARD_TOL
  assert _max_abs_diff(ns_ours, ns_stock) <= FORWARD_TOL

  # reverse(forward(x)) == x; stock cannot (its half-residual lacks reverse).
  x_rec = our_layer.reverse(y_stock, weights, state, ns_stock, RUN_RNG)
  scale = max(float(np.max(np.abs(v))) for v in x)
  assert _max_abs_diff(x_rec, tuple(x)) <= 1e-5 * scale

  ct = _random_ct(y_stock, seed=5)
  stock_x, (stock_x_ct, stock_w_ct) = stock_layer.reverse_and_grad(
      y_stock, ct, weights, state, ns_stock, RUN_RNG)
  our_x, (our_x_ct, our_w_ct) = our_layer.reverse_and_grad(
      y_stock, ct, weights, state, ns_stock, RUN_RNG)
  assert _max_abs_diff(our_x, stock_x) <= 1e-5 * scale
  _assert_rel_close(our_x_ct, stock_x_ct, GRAD_TOL)
  _assert_rel_close(our_w_ct, stock_w_ct, GRAD_TOL)

  # Against ordinary autodiff of the forward computation.
  y_plain, vjp_fn = jax.vjp(
      lambda x, w: _plain_forward(our_layer, x, w, state, RUN_RNG),
      tuple(x), weights)
  assert _max_abs_diff(y_plain, y_stock) <= FORWARD_TOL
  vjp_x_ct, vjp_w_ct = vjp_fn(ct)
  _assert_rel_close(our_x_ct, vjp_x_ct, GRAD_TOL)
  _assert_rel_close(our_w_ct, vjp_w_ct, GRAD_TOL)
  # A zero gradient would make the comparisons above vacuous.
  assert any(np.any(np.asarray(g) != 0) for g in _leaves(our_w_ct)
             if _is_float(g))


def _primitive_names(jaxpr):
  names = set()
  for eqn in jaxpr.eqns:
    names.add(eqn.primitive.name)
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      names |= _primitive_names(sub)
  return names


def test_weight_sharding_rematerialises_residual(n_weights_shards):
  """With N_WEIGHTS_SHARDS > 1 the residual runs under jax.checkpoint."""
  _, layer, x = _build_pair('dense')
  half = layer.sublayers[0]
  xs = tuple(x)
  w, s = half.weights, half.state
  y, ns = half.pure_fn(xs, w, s, RUN_RNG)
  fwd = jax.make_jaxpr(lambda xs: half.pure_fn(xs, w, s, RUN_RNG)[0])(xs)
  ct = _random_ct(y, 1)
  bwd = jax.make_jaxpr(lambda y: half.reverse_and_grad(
      y, ct, w, s, ns, RUN_RNG))(y)
  remat = {'checkpoint', 'remat', 'remat2'}
  for jaxpr in (fwd, bwd):
    found = bool(_primitive_names(jaxpr.jaxpr) & remat)
    assert found == (n_weights_shards > 1)


def test_classes_are_reversible_layers():
  layer, _ = layer_cases.nested_serial(ours.ReversibleHalfResidual,
                                       ours.ReversibleSerial)
  assert isinstance(layer, tl.ReversibleLayer)
  assert isinstance(layer, tl.Serial)
  assert isinstance(layer.sublayers[0].sublayers[0], tl.ReversibleLayer)
  assert trax_revplus.ReversibleHalfResidual is ours.ReversibleHalfResidual
  assert trax_revplus.ReversibleSerial is ours.ReversibleSerial


def test_extract_reversible_blocks_flattens_ours_like_stock():
  def model(hr, rs):
    layer, _ = layer_cases.nested_serial(hr, rs)
    return tl.Serial(tl.Dense(layer_cases.D), tl.Dup(), layer,
                     tl.Concatenate(), tl.Dense(3), tl.Relu())
  blocks_stock, loss_stock = stock_trainer.extract_reversible_blocks(
      model(stock.ReversibleHalfResidual, stock.ReversibleSerial))
  blocks_ours, loss_ours = stock_trainer.extract_reversible_blocks(
      model(ours.ReversibleHalfResidual, ours.ReversibleSerial))
  def names(blocks):
    return [([l.name for l in std], [l.name for l in rev])
            for std, rev in blocks]
  assert names(blocks_ours) == names(blocks_stock)
  assert len(blocks_ours[0][1]) == 6  # three half-residuals, three swaps
  assert all(isinstance(l, ours.ReversibleHalfResidual)
             for l in blocks_ours[0][1][::2])
  assert loss_ours.name == loss_stock.name


def test_errors():
  with pytest.raises(ValueError, match='not reversible'):
    ours.ReversibleSerial(ours.ReversibleHalfResidual(tl.Dense(2)),
                          tl.Dense(2))
  _, layer, x = _build_pair('dense')
  y, ns = layer.pure_fn(x, layer.weights, layer.state, RUN_RNG)
  # Stock zips silently over a short tuple and returns wrong inputs.
  with pytest.raises(ValueError, match='one entry per sublayer'):
    layer.reverse(y, layer.weights[:2], layer.state, ns, RUN_RNG)
  with pytest.raises(ValueError, match='one entry per sublayer'):
    layer.sublayers[0].reverse_and_grad(y, y, (), (), (), RUN_RNG)


# ---------------------------------------------------------------------------
# Models built with stock classes and, after trax_revplus.activate(), ours.

VOCAB = 16


def _reformer():
  return trax.models.ReformerLM(
      VOCAB, d_model=16, d_ff=32, d_attention_key=8, d_attention_value=8,
      n_layers=2, n_heads=2, max_len=32, dropout=0.1,
      attention_type=[
          functools.partial(tl.SelfAttention, chunk_len=4, n_chunks_before=1,
                            use_python_loop=True),
          functools.partial(tl.LSHSelfAttention, chunk_len=4, n_buckets=4,
                            n_hashes=2, use_python_loop=True)],
      mode='train')


# In eager mode, efficient attention's lax loops are recompiled on every call.
_python_loop_self_attention = functools.partial(tl.SelfAttention,
                                                use_python_loop=True)


def _terraformer():
  # ff_sparsity: sparse feed-forward with _RememberInReverse state, sized as
  # layer_cases.remember_in_reverse so eagerly compiled ops are shared.
  return terraformer.ConfigurableTerraformer(
      VOCAB, d_model=16, d_ff=32, d_attention_key=8, d_attention_value=8,
      n_encoder_layers=1, n_decoder_layers=1, n_decoder_attention_layers=1,
      n_heads=2, max_len=32, dropout=0.1, ff_sparsity=4,
      encoder_attention_type=_python_loop_self_attention,
      encoder_decoder_attention_type=_python_loop_self_attention,
      mode='train')


def _model_inputs(name):
  rs = np.random.RandomState(11)
  if name == 'reformer':
    return rs.randint(1, VOCAB, size=(2, 16)).astype(np.int32)
  return (rs.randint(1, VOCAB, size=(2, 8)).astype(np.int32),
          rs.randint(1, VOCAB, size=(2, 8)).astype(np.int32))


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
  assert not ours_types & {stock.ReversibleHalfResidual,
                           stock.ReversibleSerial}
  assert stock.ReversibleHalfResidual in stock_types
  assert not stock_types & {ours.ReversibleHalfResidual,
                            ours.ReversibleSerial}


def _float_outputs(y):
  return tuple(v for v in cb._make_tuple(y) if _is_float(v))  # pylint: disable=protected-access


def test_model_outputs_and_gradients_match_stock(model_pair):
  _, stock_model, our_model, x = model_pair
  assert _max_abs_diff(our_model.weights, stock_model.weights) == 0.0
  weights, state = stock_model.weights, stock_model.state

  y_stock, _ = stock_model.pure_fn(x, weights, state, RUN_RNG)
  y_ours, _ = our_model.pure_fn(x, weights, state, RUN_RNG)
  assert _max_abs_diff(y_ours, y_stock) <= FORWARD_TOL
  ct = _random_ct(_float_outputs(y_stock), seed=8)

  # jax.grad runs the layers' custom backward, i.e. reverse_and_grad.
  def loss(model, w):
    y, _ = model.pure_fn(x, w, state, RUN_RNG)
    return sum(jnp.sum(v * c) for v, c in zip(_float_outputs(y), ct))
  g_stock = jax.grad(functools.partial(loss, stock_model))(weights)
  g_ours = jax.grad(functools.partial(loss, our_model))(weights)
  _assert_rel_close(g_ours, g_stock, GRAD_TOL)
  assert any(np.any(np.asarray(g) != 0) for g in _leaves(g_ours))


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
  ct = _random_ct(y, seed=3)
  stock_out = layer.reverse_and_grad(y, ct, weights[i], state[i], ns, rngs[i])
  our_out = our_rev.reverse_and_grad(y, ct, weights[i], state[i], ns, rngs[i])
  _assert_rel_close(our_out, stock_out, GRAD_TOL)
  _assert_rel_close(our_out[0], rev_in, GRAD_TOL)


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
    assert _max_abs_diff(loaded_ours.weights, stock_model.weights) > 0
    loaded_ours.init_from_file(stock_path)
    assert _max_abs_diff(loaded_ours.weights, stock_model.weights) == 0.0
    assert _max_abs_diff(loaded_ours.state, stock_model.state) == 0.0
    loaded_ours.save_to_file(ours_path, input_signature=sig)
    loaded_stock = build()
    loaded_stock.init(sig, rng=other_rng)
    loaded_stock.init_from_file(ours_path)
    assert _max_abs_diff(loaded_stock.weights, stock_model.weights) == 0.0
    assert _max_abs_diff(loaded_stock.state, stock_model.state) == 0.0


# ---------------------------------------------------------------------------
# reconstruction_error


def test_reconstruction_error_on_models(model_pair):
  _, stock_model, our_model, x = model_pair
  weights, state = stock_model.weights, stock_model.state
  records, summary = trax_revplus.reconstruction_error(
      our_model, x, weights, state, RUN_RNG)
  reversible = [l for l in _all_sublayers(our_model)
                if isinstance(l, tl.ReversibleLayer)
                and not isinstance(l, tl.Serial)]
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
      stock_model, x, weights, state, RUN_RNG)
  assert [r.name for r in stock_records] == [r.name for r in records]
  for a, b in zip(stock_records, records):
    assert abs(a.max_abs_error - b.max_abs_error) < 1e-6


class _LossyReverse(tl.ReversibleLayer):
  """Identity whose reverse is off by a known amount."""

  def __init__(self, offset):
    super().__init__(n_in=2, n_out=2)
    self._offset = offset

  def forward(self, xs):
    return xs

  def reverse(self, output, weights=(), state=(), new_state=(), rng=None):
    return (output[0] + self._offset, output[1])


def test_reconstruction_error_locates_drift():
  x1, x2 = layer_cases._pair()  # pylint: disable=protected-access
  d = layer_cases.D
  model = tl.Serial(
      tl.Dense(d),  # non-reversible: runs forward only
      ours.ReversibleSerial(
          ours.ReversibleHalfResidual(tl.Dense(d)), tl.ReversibleSwap(),
          _LossyReverse(0.25),
          ours.ReversibleHalfResidual(tl.Dense(d)), tl.ReversibleSwap()),
      tl.Concatenate(), tl.Relu(), tl.Dup(),
      ours.ReversibleSerial(ours.ReversibleHalfResidual(tl.LayerNorm())))
  model.init(shapes.signature((x1, x2)), rng=INIT_RNG)
  records, summary = trax_revplus.reconstruction_error(model, (x1, x2))
  assert [r.name for r in records] == [
      'ReversibleHalfResidual', 'ReversibleSwap', '_LossyReverse',
      'ReversibleHalfResidual', 'ReversibleSwap', 'ReversibleHalfResidual']
  assert [r.block for r in records] == [0, 0, 0, 0, 0, 1]
  assert records[2].path == (1, 2)
  lossy = records[2]
  assert lossy.local_max_abs_error == pytest.approx(0.25, rel=1e-5)
  assert lossy.max_abs_error == pytest.approx(0.25, rel=1e-5)
  # Layers after the lossy one are exact; drift shows in those before it.
  for r in records[3:]:
    assert r.max_abs_error < 1e-5 and r.local_max_abs_error < 1e-5
  for r in records[:2]:
    assert r.max_abs_error >= 0.2 and r.local_max_abs_error < 1e-5
  assert 'worst max_rel_error' in summary
  assert records[0].as_dict()['name'] == 'ReversibleHalfResidual'


def test_reconstruction_error_initialises_and_rejects():
  layer, x = layer_cases.dense(ours.ReversibleHalfResidual,
                               ours.ReversibleSerial)
  records, _ = trax_revplus.reconstruction_error(layer, x)
  assert len(records) == 4
  assert _leaves(layer.weights)  # initialised on the way
  assert all(r.max_rel_error < 1e-5 for r in records)
  with pytest.raises(ValueError, match='no reversible layer'):
    trax_revplus.reconstruction_error(tl.Serial(tl.Dense(2)),
                                      np.ones((1, 2), np.float32))
  with pytest.raises(ValueError, match='one entry per sublayer'):
    trax_revplus.reconstruction_error(layer, x, layer.weights[:1],
                                      layer.state)


# ---------------------------------------------------------------------------
# numpy and jax arrays alike


def _lsh_half_residual(hr):
  """LSH attention running its `lax.fori_loop` (no use_python_loop)."""
  attn = tl.LSHSelfAttention(
      n_heads=2, d_qk=8, d_v=8, causal=True, chunk_len=4, n_hashes=2,
      n_buckets=4, attention_dropout=0.1, output_dropout=0.1, mode='train')
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
  ct = _random_ct(y, seed=6)  # numpy
  reference = stock_layer.reverse_and_grad(
      as_jax(y), as_jax(ct), weights, state, new_state, RUN_RNG)
  with pytest.raises(jax.errors.TracerArrayConversionError):
    stock_layer.reverse_and_grad(as_numpy(y), ct, weights, state, new_state,
                                 RUN_RNG)
  arguments = (y, ct, weights, state, new_state)
  for convert in (as_numpy, as_jax):
    got = our_layer.reverse_and_grad(*convert(arguments), RUN_RNG)
    _assert_rel_close(got, reference, GRAD_TOL)
  # Forward and reverse take numpy weights and state too.
  y_ours, _ = our_layer.pure_fn(x, as_numpy(weights), as_numpy(state),
                                RUN_RNG)
  assert _max_abs_diff(y_ours, y) <= FORWARD_TOL
  x_rec = our_layer.reverse(*as_numpy((y, weights, state, new_state)),
                            rng=RUN_RNG)
  assert _max_abs_diff(x_rec, tuple(x)) <= 1e-5 * max(
      float(np.max(np.abs(v))) for v in x)
