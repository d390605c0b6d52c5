"""Models and block layouts stock trax accepts, with trax_revplus's trainer.

- A Terraformer with fixed-base positions (an embedding shared between two
  standard layers, each with a positional encoding of its own): initialized
  exactly as stock `init_reversible_blocks` does (trained from trax's own
  Terraformer configs in test_trax_configs.py); loaded weights kept only
  where the user loaded them, the rest as stock initializes it.
- Layers never initialized: the trainer is built as stock's is (trax's own
  `test_run_reversible_slots`).
- A block whose standard part is a `tl.Serial`, not a list (trax's own
  large-weights tests): trained as trax's default `Trainer` trains the same
  layers.

References are stock trax's `init_reversible_blocks` and trainer, and trax's
default `Trainer`.
"""

import jax
import numpy as np
import pytest

from trax import fastmath
from trax import layers as tl
from trax import optimizers
from trax import shapes
from trax.layers import base
from trax.models.research import terraformer
from trax.optimizers import trainer as stock_trainer

import trax_revplus
from trax_revplus import trainer as rev_trainer
from trax_revplus.trainer import init as rev_init
from trax_revplus import validation

pytestmark = pytest.mark.usefixtures('stock_trax_and_empty_gin')

_INIT_RNG = fastmath.random.get_prng(3)


def _leaves(tree):
  return jax.tree_util.tree_leaves(tree)


def _assert_equal(a, b):
  la, lb = _leaves(a), _leaves(b)
  assert la, 'nothing to compare'
  assert len(la) == len(lb)
  for x, y in zip(la, lb):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _all_layers(blocks, loss):
  return [l for std, rev in blocks for l in list(std) + list(rev)] + [loss]


def _terraformer(ours):
  """A small ConfigurableTerraformer as trax's terraformer_copy.gin has it."""
  if ours:
    trax_revplus.activate()
  try:
    model = terraformer.ConfigurableTerraformer(
      13,
      d_model=16,
      d_ff=32,
      d_attention_key=8,
      d_attention_value=8,
      n_encoder_layers=1,
      n_decoder_layers=1,
      n_heads=2,
      max_len=16,
      dropout=0.05,
      pos_type='fixed-base',
      mode='train',
    )
  finally:
    trax_revplus.deactivate()
  return stock_trainer.extract_reversible_blocks(
    [model, tl.WeightedCategoryCrossEntropy()]
  )


def _copy_batch():
  x = np.random.RandomState(1).randint(1, 13, size=(2, 16)).astype(np.int32)
  return (x, x, x, np.ones_like(x, dtype=np.float32))


def test_terraformer_initializes_as_stock():
  sig = shapes.signature(_copy_batch())
  stock_blocks, stock_loss = _terraformer(ours=False)
  stock_trainer.init_reversible_blocks(stock_blocks, stock_loss, sig, _INIT_RNG)
  blocks, loss = _terraformer(ours=True)
  rev_trainer.init_reversible_blocks(blocks, loss, sig, _INIT_RNG)
  for stock_layer, layer in zip(
    _all_layers(stock_blocks, stock_loss), _all_layers(blocks, loss)
  ):
    if _leaves(stock_layer.weights):
      _assert_equal(layer.weights, stock_layer.weights)
    assert jax.tree_util.tree_structure(
      layer.state
    ) == jax.tree_util.tree_structure(stock_layer.state)
    for x in _leaves((layer.weights, layer.state)):
      assert isinstance(x, np.ndarray), type(x)
  # The positional encoding beside the shared embedding got its weights.
  leaf_layers = rev_init._leaf_layers  # pylint: disable=protected-access
  leaves = leaf_layers(tl.Serial(_all_layers(blocks, loss)))
  positions = [
    l for l in leaves if type(l).__name__ == 'FixedBasePositionalEncoding'
  ]
  assert len(positions) == 2
  for layer in positions:
    assert len(layer.weights) == 2  # (base weights, start vector)


def _shared_embedding_blocks():
  """An embedding shared by two standard layers, the second of which has a
  Dense of its own; then a reversible block and a loss layer."""
  embedding = tl.Embedding(9, 4)
  std = [
    tl.Select([0, 0]),
    tl.Parallel(embedding, []),
    tl.Parallel([], [embedding, tl.Dense(4)]),
  ]
  rev = [
    tl.ReversibleHalfResidual(tl.Dense(4), tl.Dropout(0.1)),
    tl.ReversibleSwap(),
  ]
  loss = tl.Serial(
    tl.Concatenate(), tl.Dense(9), tl.LogSoftmax(), tl.CrossEntropyLoss()
  )
  return [(std, rev)], loss, embedding


def _batch():
  x = np.arange(8).reshape((2, 4)) % 9
  return (x, x, np.ones_like(x, dtype=np.float32))


def test_loaded_weights_are_kept_and_only_empty_layers_initialized(monkeypatch):
  sig = shapes.signature(_batch())
  stock_blocks, stock_loss, _ = _shared_embedding_blocks()
  stock_trainer.init_reversible_blocks(stock_blocks, stock_loss, sig, _INIT_RNG)
  # Nothing loaded: exactly stock (the shared embedding initialized twice,
  # the second time counting).
  fresh_blocks, fresh_loss, _ = _shared_embedding_blocks()
  rev_trainer.init_reversible_blocks(fresh_blocks, fresh_loss, sig, _INIT_RNG)
  _assert_equal(
    [l.weights for l in _all_layers(fresh_blocks, fresh_loss)],
    [l.weights for l in _all_layers(stock_blocks, stock_loss)],
  )

  # The user loaded the embedding and the first reversible layer.
  blocks, loss, embedding = _shared_embedding_blocks()
  embedding.init(shapes.signature(_batch()[0]))
  embedding.weights = np.full((9, 4), 0.25, np.float32)
  half_residual = blocks[0][1][0]
  half_residual.init((shapes.ShapeDtype((2, 4, 4)),) * 2)
  half_residual.weights = fastmath.nested_map(
    lambda w: np.full_like(w, 0.5), half_residual.weights
  )
  calls = []
  layer_init = base.Layer.init

  def recording_init(layer, *args, **kwargs):
    calls.append(layer)
    return layer_init(layer, *args, **kwargs)

  monkeypatch.setattr(base.Layer, 'init', recording_init)
  rev_trainer.init_reversible_blocks(blocks, loss, sig, _INIT_RNG)
  monkeypatch.undo()

  np.testing.assert_array_equal(embedding.weights, 0.25)
  for w in _leaves(half_residual.weights):
    np.testing.assert_array_equal(w, 0.5)
  # The standard layers around the embedding: the Dense beside it as stock
  # initializes it; the first one holds only the loaded embedding and is
  # not initialized again, nor is the loaded reversible layer.
  std, stock_std = blocks[0][0], stock_blocks[0][0]
  _assert_equal(
    std[2].sublayers[1].sublayers[1].weights,
    stock_std[2].sublayers[1].sublayers[1].weights,
  )
  assert std[1] not in calls and half_residual not in calls
  assert std[2] in calls
  _assert_equal(loss.weights, stock_loss.weights)


def test_trainer_accepts_uninitialized_layers_as_stock():
  """trax's own test_run_reversible_slots: the trainer is built before any
  layer is initialized."""

  def build(trainer_class):
    layers = [tl.Dense(4), tl.Dup()]
    rev_layers = [tl.ReversibleHalfResidual(tl.Dense(4)), tl.ReversibleSwap()]
    loss_layer = tl.Serial(
      tl.Concatenate(), tl.Dense(4), tl.LogSoftmax(), tl.CrossEntropyLoss()
    )
    return trainer_class([(layers, rev_layers)], loss_layer, optimizers.Adam)

  stock = build(stock_trainer.ReversibleSerialTrainer)
  trax_revplus.activate()
  ours = build(rev_trainer.ReversibleSerialTrainer)
  assert jax.tree_util.tree_structure(
    ours.slots
  ) == jax.tree_util.tree_structure(stock.slots)
  ours.slots = ours.slots
  assert jax.tree_util.tree_structure(
    ours.slots
  ) == jax.tree_util.tree_structure(stock.slots)
  assert [l.name for l in ours.all_layers] == [l.name for l in stock.all_layers]


def _serial_first_model():
  """trax's large-weights layout, small: the standard part is a tl.Serial."""
  first = tl.Serial(tl.Embedding(9, 8), tl.Dup())
  revs = [
    tl.ReversibleHalfResidual(tl.Dense(8), tl.Dropout(0.3)),
    tl.ReversibleSwap(),
    tl.ReversibleHalfResidual(tl.Dense(8)),
    tl.ReversibleSwap(),
  ]
  loss = tl.Serial(
    tl.Concatenate(), tl.Dense(9), tl.LogSoftmax(), tl.CrossEntropyLoss()
  )
  return first, revs, loss


def test_standard_part_as_a_serial_trains_as_the_default_trainer():
  batch = _batch()
  rngs = [fastmath.random.get_prng(7), fastmath.random.get_prng(8)]
  first, revs, loss = _serial_first_model()
  model = tl.Serial([first] + revs + [loss])
  model.init(shapes.signature(batch), rng=_INIT_RNG)
  initial = (model.weights, model.state)
  optimizer = optimizers.Adam()
  optimizer.tree_init(model.weights)
  default = optimizers.Trainer(model, optimizer, n_devices=1)
  for rng in rngs:
    default.one_step(batch, rng)
  expected = [l.weights for l in [first] + revs + [loss]]

  model.weights, model.state = initial
  validation.check_blocks([(first, revs)])
  trainer = rev_trainer.ReversibleSerialTrainer(
    [(first, revs)], loss, optimizers.Adam
  )
  for rng in rngs:
    trainer.one_step(batch, rng)
  for got, want in zip([l.weights for l in [first] + revs + [loss]], expected):
    for x, y in zip(_leaves(got), _leaves(want)):
      np.testing.assert_allclose(x, y, rtol=0, atol=1e-5)


def test_init_reversible_blocks_takes_a_serial_standard_part():
  """Stock's init fails on it (Serial + list); ours initializes the Serial
  as stock initializes a one-layer list holding it."""
  sig = shapes.signature(_batch())
  stock_first, stock_revs, stock_loss = _serial_first_model()
  with pytest.raises(TypeError):
    stock_trainer.init_reversible_blocks(
      [(stock_first, stock_revs)], stock_loss, sig, _INIT_RNG
    )
  stock_trainer.init_reversible_blocks(
    [([stock_first], stock_revs)], stock_loss, sig, _INIT_RNG
  )
  first, revs, loss = _serial_first_model()
  rev_trainer.init_reversible_blocks([(first, revs)], loss, sig, _INIT_RNG)
  _assert_equal(
    [l.weights for l in [first] + revs + [loss]],
    [l.weights for l in [stock_first] + stock_revs + [stock_loss]],
  )
