"""trax_revplus.ReversibleSerialTrainer against trax's default Trainer.

Ports the reversible tests of trax 1.4.1's optimizers/trainer_test.py (basic,
extended with a mid block, Terraformer with loss chunking, slots get/set).
Every reference is trax's own `optimizers.Trainer` on
`tl.Serial(blocks + [loss_layer])`, run on the same inputs and RNGs
(`trainer_cases`).
"""

import functools

import jax
import numpy as np
import pytest

from trax import fastmath
from trax import layers as tl
from trax import optimizers
from trax import shapes
from trax.models.research import terraformer

import trainer_cases as cases
import trax_revplus
from trax_revplus import trainer as rev_trainer

pytestmark = pytest.mark.usefixtures('stock_trax')


def test_slots_get_and_set():
  layers = [tl.Dense(4), tl.Dup()]
  rev_layers = [tl.ReversibleHalfResidual(tl.Dense(4)), tl.ReversibleSwap()]
  loss_layer = tl.Serial(
    tl.Concatenate(), tl.Dense(4), tl.LogSoftmax(), tl.CrossEntropyLoss()
  )
  tl.Serial(layers + rev_layers + [loss_layer]).init(
    (
      shapes.ShapeDtype((2, 4)),
      shapes.ShapeDtype((2,), np.int32),
      shapes.ShapeDtype((2,)),
    )
  )
  trainer = rev_trainer.ReversibleSerialTrainer(
    [(layers, rev_layers)], loss_layer, optimizers.Adam
  )
  slots = trainer.slots
  trainer.slots = slots
  assert fastmath.tree_flatten(trainer.slots)
  for x, y in zip(
    fastmath.tree_flatten(slots), fastmath.tree_flatten(trainer.slots)
  ):
    np.testing.assert_array_equal(x, y)
  # A changed value goes in and comes back out.
  changed = fastmath.nested_map(lambda s: s + 1.0, slots)
  trainer.slots = changed
  cases.assert_all_close(changed, trainer.slots, tol=0)
  # As trax's tl.on_cpu: jax arrays in host memory.
  for x in fastmath.tree_flatten(trainer.slots):
    assert isinstance(x, jax.Array)
    assert {d.platform for d in x.devices()} == {'cpu'}


@pytest.mark.parametrize(
  'optimizer_fn,segment_max_layers',
  [(optimizers.Adam, 1), (optimizers.Adafactor, 8)],
)
def test_same_as_default_basic(optimizer_fn, segment_max_layers):
  """One compiled call per layer (1), or the 4 reversible layers fused (8)."""
  batch = cases.batch()
  first, revs, loss = cases.basic_model()
  model = tl.Serial([first] + revs + [loss])
  rng_init = fastmath.random.get_prng(12)
  init = lambda: model.init(batch, rng=rng_init)
  ref_weights, ref_slots, _ = cases.reference(
    model, init, optimizer_fn, 2, batch
  )

  init()
  trainer = rev_trainer.ReversibleSerialTrainer(
    [(first.sublayers, revs)],
    loss,
    optimizer_fn,
    segment_max_layers=segment_max_layers,
  )
  cases.train(trainer, batch, 2)
  cases.assert_all_close(ref_weights, model.weights)
  # Default Trainer keeps one flat slot tuple per weight; ours per layer.
  cases.assert_all_close(ref_slots, trainer.slots)
  cases.host_leaves_only(model.weights)
  assert not np.allclose(
    np.asarray(fastmath.tree_flatten(ref_weights)[0]),
    np.asarray(fastmath.tree_flatten(_initial_weights(model, init))[0]),
  )


def _initial_weights(model, init):
  init()
  return model.weights


def test_same_as_default_extended():
  """Stock's test turns memoization off (its repr keys break it); ours not.

  Segments of at most 3 layers: block 1 splits into 2 + 2, block 2 is one
  segment of 2.
  """
  batch = cases.batch()
  first, revs1, mid, revs2, loss = cases.extended_model()
  model = tl.Serial([first] + revs1 + [mid] + revs2 + [loss])
  rng_init = fastmath.random.get_prng(12)
  init = lambda: model.init(batch, rng=rng_init)
  ref_weights, ref_slots, ref_state = cases.reference(
    model, init, optimizers.Adam, 3, batch
  )

  init()
  trainer = rev_trainer.ReversibleSerialTrainer(
    [(first.sublayers, revs1), (mid.sublayers, revs2)],
    loss,
    optimizers.Adam,
    memoize_jit=True,
    segment_max_layers=3,
  )
  cases.train(trainer, batch, 3)
  cases.assert_all_close(ref_weights, model.weights)
  cases.assert_all_close(ref_slots, trainer.slots)
  cases.assert_all_close(ref_state, model.state)


def _terraformer_with_loss():
  """(ConfigurableTerraformer, its loss, model + loss, init): 2 + 2 layers,
  a sparse feed-forward, Adafactor's shapes."""
  model = terraformer.ConfigurableTerraformer(
    20,
    d_model=8,
    d_ff=32,
    n_heads=1,
    dropout=0.0,
    n_encoder_layers=2,
    n_decoder_layers=2,
    ff_sparsity=(4, 8, 0.0, 1.0),
    pos_type=None,
    reversible_encoder=True,
  )
  loss = tl.Serial(tl.LogSoftmax(), tl.CrossEntropyLoss())
  model_with_loss = tl.Serial(model, loss)
  int_sig = shapes.ShapeDtype((2, 4), dtype=np.int32)
  rng_init = fastmath.random.get_prng(12)
  init = lambda: model_with_loss.init((int_sig,) * 3, rng=rng_init)
  return model, loss, model_with_loss, init


def _terraformer_batch():
  inputs = np.arange(8).reshape((2, 4)) + 1
  return (inputs, 2 * inputs, np.ones_like(inputs))


@functools.lru_cache(maxsize=1)
def _terraformer_reference_3_steps():
  """trax's default Trainer's weights after 3 Adafactor steps, computed once
  for every plan compared with them."""
  _, _, model_with_loss, init = _terraformer_with_loss()
  weights, _, _ = cases.reference(
    model_with_loss, init, optimizers.Adafactor, 3, _terraformer_batch()
  )
  return weights


@pytest.mark.parametrize(
  'plan',
  [
    {},
    # One layer per call, each in 2 batch slices: the decoder's
    # `ReversibleSelect([0, 0])` reads 1 stack item and writes 2, and
    # `ConcatWithPadding` reshapes its state on its first call.
    dict(segment_max_layers=1, backward_segment_max_layers=1, batch_slices=2),
    # Every layer in the loss's one program, in 2 slices.
    pytest.param('fused_2_slices', marks=pytest.mark.slow),
  ],
  ids=['defaults', 'one_layer_per_call_2_slices', 'fused_2_slices'],
)
def test_same_as_default_terraformer_loss_chunking(plan):
  batch = _terraformer_batch()
  ref_weights = _terraformer_reference_3_steps()
  model, loss, model_with_loss, init = _terraformer_with_loss()
  blocks, loss_layer = trax_revplus.trainer.extract_reversible_blocks(
    [model, loss], loss_chunk_size=4
  )
  init()
  fused = plan == 'fused_2_slices'
  trainer = rev_trainer.ReversibleSerialTrainer(
    blocks, loss_layer, optimizers.Adafactor, **({} if fused else plan)
  )
  if fused:
    cases.set_plan(trainer, batch, cases.fused_plan(trainer, batch, 2))
  cases.train(trainer, batch, 3)
  cases.assert_all_close(ref_weights, model_with_loss.weights)
  cases.host_leaves_only(model_with_loss.weights)
