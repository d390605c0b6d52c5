"""Sequence chunks: the loss layer's position-wise tail over k chunks.

References: trax's default `Trainer` on the same dropout-free model and
inputs (dense layers, alone and with batch slices); ours without chunks on
models whose tail trax builds (an LSH `ReformerLM`, whose loss layer is all
tail, and a `ConfigurableTerraformer`, whose loss layer has a head up to
`StripFromConcatenateWithPadding`); the unchunked loss program's XLA
figures for what chunks hold.
"""

import dataclasses

import jax
import numpy as np
import pytest
from trax import fastmath
from trax import layers as tl
from trax import optimizers
from trax import shapes
from trax.models.research import terraformer

import trainer_cases as cases
from trax_revplus import trainer as rev_trainer
from trax_revplus import validation
from trax_revplus.trainer import TrainerOptions
from trax_revplus.trainer._step import loss_tail

pytestmark = pytest.mark.usefixtures('stock_trax')


@pytest.mark.parametrize('chunks,slices', [(2, 1), (3, 1), (6, 2), (2, 4)])
def test_chunks_train_as_the_default_trainer(chunks, slices):
  batch = cases.lm_batch()  # length 6
  model, trainer = cases.lm_trainer(
    batch,
    sequence_chunks=chunks,
    batch_slices=slices,
    device_memory_budget_bytes=None,
  )
  plan = trainer.planned(batch).plan
  assert (plan.sequence_chunks, plan.batch_slices) == (chunks, slices)
  cases.train(trainer, batch, 3)
  ref_weights, ref_slots, _ = cases.lm_reference_3_steps()
  cases.assert_all_close(ref_weights, model.weights)
  cases.assert_all_close(ref_slots, trainer.slots)


def test_a_chunk_whose_loss_weights_are_all_zero_adds_nothing():
  batch = cases.lm_batch()
  batch[2][:, :3] = 0.0  # chunk 0 of 2
  model, trainer = cases.lm_trainer(
    batch, sequence_chunks=2, device_memory_budget_bytes=None
  )
  losses = cases.train(trainer, batch, 3)
  assert all(np.isfinite(float(l)) for l in losses)
  reference, control = cases.lm_trainer(batch, device_memory_budget_bytes=None)
  cases.train(control, batch, 3)
  cases.assert_all_close(reference.weights, model.weights)


def test_dropout_chunks_repeat_across_runs_and_resumes():
  """With dropout in the tail, chunked steps are a function of the
  weights, the step's RNG and the batch: two runs agree, a run resumed
  from the host weights and slots after step 2 ends where the
  uninterrupted one does, and the masks differ from unchunked ones."""
  batch = cases.batch()  # length 4
  first, revs, loss = cases.basic_model()  # Dropout(0.3) in the tail

  def fresh(chunks):
    model = tl.Serial([first] + revs + [loss])
    model.init(batch, rng=fastmath.random.get_prng(12))
    return rev_trainer.ReversibleSerialTrainer(
      [(first.sublayers, revs)],
      loss,
      optimizers.Adam,
      device_memory_budget_bytes=None,
      sequence_chunks=chunks,
      batch_slices=2,
    )

  def host(trainer):
    return jax.tree_util.tree_map(
      np.array, ([l.weights for l in trainer.all_layers], trainer.slots)
    )

  trainer = fresh(2)
  cases.train(trainer, batch, 3)
  uninterrupted = host(trainer)
  trainer = fresh(2)
  cases.train(trainer, batch, 2)
  weights, slots = host(trainer)
  resumed = fresh(2)
  for layer, w in zip(resumed.all_layers, weights):
    layer.weights = w
  resumed.slots = slots
  resumed.one_step(batch, cases.RNGS[2], learning_rate=cases.LRS[2])
  cases.assert_all_close(uninterrupted, host(resumed), tol=0)
  unchunked = fresh(1)
  cases.train(unchunked, batch, 3)
  assert not np.allclose(
    jax.tree_util.tree_leaves(uninterrupted[0])[0],
    jax.tree_util.tree_leaves(host(unchunked)[0])[0],
  )


def _trax_blocks(model, loss, batch):
  blocks, loss_layer = rev_trainer.extract_reversible_blocks([model, loss])
  rev_trainer.init_reversible_blocks(
    blocks, loss_layer, shapes.signature(batch), fastmath.random.get_prng(3)
  )
  return blocks, loss_layer


def _terraformer():
  return terraformer.ConfigurableTerraformer(
    64,
    d_model=8,
    d_ff=16,
    n_heads=1,
    dropout=0.0,
    n_encoder_layers=1,
    n_decoder_layers=1,
    pos_type=None,
    reversible_encoder=True,
  )


MODELS = {
  'lsh_reformer_lm': (cases.lsh_model, 16),
  'terraformer': (_terraformer, 16),
}


def _trained(name, **kwargs):
  make, length = MODELS[name]
  tokens = np.random.RandomState(2).randint(1, 16, size=(4, length))
  tokens = tokens.astype(np.int32)
  batch = (tokens, tokens, np.ones_like(tokens, dtype=np.float32))
  blocks, loss = _trax_blocks(make(), tl.WeightedCategoryCrossEntropy(), batch)
  trainer = rev_trainer.ReversibleSerialTrainer(
    blocks, loss, optimizers.Adam, device_memory_budget_bytes=None, **kwargs
  )
  cases.train(trainer, batch, 2)
  return trainer, batch


@pytest.mark.parametrize('name', sorted(MODELS))
def test_chunks_train_as_unchunked_on_trax_models(name):
  whole, _ = _trained(name)
  chunked, batch = _trained(name, sequence_chunks=4, batch_slices=2)
  plan = chunked.planned(batch).plan
  assert plan.sequence_chunks == 4
  cases.assert_all_close(
    ([l.weights for l in whole.all_layers], whole.slots),
    ([l.weights for l in chunked.all_layers], chunked.slots),
  )


def test_which_tails_run_in_chunks():
  # trax's ReformerLM: the whole loss layer (Concatenate, LayerNorm,
  # Dropout, Dense, the cross-entropy).
  blocks, loss = rev_trainer.extract_reversible_blocks(
    [cases.lsh_model(), tl.CrossEntropyLoss()]
  )
  del blocks
  assert loss_tail.tail_start(loss) == 0
  # ConfigurableTerraformer: after StripFromConcatenateWithPadding.
  _, loss = rev_trainer.extract_reversible_blocks(
    [_terraformer(), tl.CrossEntropyLoss()]
  )
  names = [s.name for s in loss_tail.sublayers_of(loss)]
  start = loss_tail.tail_start(loss)
  assert names[start - 1] == 'StripFromConcatenateWithPadding'
  assert loss_tail.tail_start(tl.WeightedCategoryCrossEntropy()) == 0
  # Position-mixing layers stay in the head.
  assert (
    loss_tail.tail_start(tl.Serial(tl.ShiftRight(), tl.CrossEntropyLoss())) == 1
  )
  assert (
    loss_tail.tail_start(
      tl.Serial(tl.Concatenate(axis=1), tl.CrossEntropyLoss())
    )
    == 1
  )
  # Only the weighted mean follows a part that mixes rows and positions.
  assert loss_tail.tail_start(tl.BinaryCrossEntropyLoss()) == 1
  # A loss that does not combine over parts (an unweighted mean): no tail.
  assert loss_tail.tail_start(tl.CategoryCrossEntropy()) is None


def test_the_sequence_axis_is_never_a_feature_axis():
  f32, i32 = np.float32, np.int32
  spec = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype)
  assert (
    loss_tail.sequence_length(
      [spec((2, 8, 4), f32), spec((2, 8), i32), spec((2, 8), f32)]
    )
    == 8
  )
  # Activations without a sequence axis: axis 1 is what Dense acts on.
  assert (
    loss_tail.sequence_length(
      [spec((2, 8), f32), spec((2,), i32), spec((2,), f32)]
    )
    is None
  )
  assert (
    loss_tail.sequence_length(
      [spec((2, 8), f32), spec((2, 8), f32), spec((2, 8), f32)]
    )
    is None
  )
  assert (
    loss_tail.sequence_length(
      [spec((2, 8, 4), f32), spec((2, 6), i32), spec((2, 6), f32)]
    )
    is None
  )


def _loss_call(trainer, batch, chunks):
  """`ProgramMemory` of the loss call of the leanest unfused plan."""
  p = trainer.planner
  plan = dataclasses.replace(
    p.candidates(p.step_types(batch)).leanest(1), sequence_chunks=chunks
  )
  step = cases.set_plan(trainer, batch, plan)
  [call] = [c for c in step.calls if c.phase == 'loss']
  return call.program


def test_chunks_shrink_the_loss_call():
  """A vocabulary of 1000 over 64 positions: the tail's logits and their
  cotangents are the loss call's temporaries; 4 chunks hold a quarter of
  them, and the call's arguments and results stay as they were."""
  tokens = np.random.RandomState(2).randint(1, 16, size=(2, 64))
  batch = (
    tokens.astype(np.int32),
    tokens.astype(np.int32),
    np.ones((2, 64), np.float32),
  )
  model = tl.Serial(
    tl.Embedding(1000, 8),
    tl.Dup(),
    tl.ReversibleHalfResidual(tl.Dense(8)),
    tl.ReversibleSwap(),
    tl.Concatenate(),
    tl.Dense(1000),
    tl.LogSoftmax(),
  )
  blocks, loss = _trax_blocks(model, tl.CrossEntropyLoss(), batch)
  trainer = rev_trainer.ReversibleSerialTrainer(
    blocks, loss, optimizers.Adam, device_memory_budget_bytes=None
  )
  whole = _loss_call(trainer, batch, 1)
  chunked = _loss_call(trainer, batch, 4)
  logits_bytes = 2 * 64 * 1000 * 4
  assert whole.temp_bytes >= 2 * logits_bytes, whole
  assert chunked.temp_bytes <= whole.temp_bytes / 4 + logits_bytes / 4, (
    whole,
    chunked,
  )
  assert chunked.argument_bytes == whole.argument_bytes
  assert chunked.output_bytes == whole.output_bytes


def test_the_budget_takes_chunks_only_where_nothing_else_fits():
  tokens = np.random.RandomState(2).randint(1, 16, size=(2, 64))
  batch = (
    tokens.astype(np.int32),
    tokens.astype(np.int32),
    np.ones((2, 64), np.float32),
  )

  def trainer_of(**kwargs):
    model = tl.Serial(
      tl.Embedding(1000, 8),
      tl.Dup(),
      tl.ReversibleHalfResidual(tl.Dense(8)),
      tl.ReversibleSwap(),
      tl.Concatenate(),
      tl.Dense(1000),
      tl.LogSoftmax(),
    )
    blocks, loss = _trax_blocks(model, tl.CrossEntropyLoss(), batch)
    return rev_trainer.ReversibleSerialTrainer(
      blocks, loss, optimizers.Adam, **kwargs
    )

  roomy = trainer_of(device_memory_budget_bytes=2**30)
  assert roomy.planned(batch).plan.sequence_chunks == 1
  least_plan, least = roomy.planner.least_plan(batch)
  assert least_plan.sequence_chunks == 64  # the most chunks tried
  unchunked = [
    w.memory.peak_device_bytes
    for w in roomy.planner.weighing(batch).weighed
    if w.plan.sequence_chunks == 1
  ]
  assert least.peak_device_bytes < min(unchunked)
  tight = trainer_of(device_memory_budget_bytes=least.peak_device_bytes)
  plan = tight.planned(batch).plan
  assert plan.sequence_chunks > 1
  losses = cases.train(tight, batch, 2)
  control = trainer_of(device_memory_budget_bytes=None)
  cases.assert_all_close(losses, cases.train(control, batch, 2))


def test_the_memory_log_records_the_accounted_peak_of_a_chunked_step(tmp_path):
  batch = cases.lm_batch()
  _, trainer = cases.lm_trainer(
    batch,
    sequence_chunks=3,
    batch_slices=2,
    device_memory_budget_bytes=None,
    memory_log_every_n_steps=1,
    output_dir=str(tmp_path),
    memory_log_tensorboard=False,
  )
  assert trainer.planned(batch).plan.sequence_chunks == 3
  cases.check_logged_peaks(trainer, batch, tmp_path)


def test_bad_chunks_stop_before_any_update():
  batch = cases.lm_batch()  # length 6
  model, trainer = cases.lm_trainer(batch, sequence_chunks=4)
  before = jax.tree_util.tree_map(np.array, model.weights)
  with pytest.raises(validation.SequenceChunksError) as e:
    trainer.one_step(batch, cases.RNGS[0])
  assert str(e.value) == (
    'trax_revplus.ReversibleSerialTrainer.sequence_chunks = 4 does not '
    "divide the sequence length 6 of the loss layer's inputs; use a "
    'divisor of 6, e.g. one of [1, 2, 3, 6].'
  )
  cases.assert_all_close(before, model.weights, tol=0)
  dense = (
    np.ones((2, 3), np.float32),
    np.ones((2, 4), np.float32),
    np.ones((2, 4), np.float32),
  )
  blocks = [
    (
      [tl.Dense(4), tl.Dup()],
      [tl.ReversibleHalfResidual(tl.Dense(4)), tl.ReversibleSwap()],
    )
  ]
  loss = tl.Serial(tl.Concatenate(), tl.Dense(4), tl.L2Loss())
  rev_trainer.init_reversible_blocks(
    blocks, loss, shapes.signature(dense), fastmath.random.get_prng(0)
  )
  trainer = rev_trainer.ReversibleSerialTrainer(
    blocks, loss, optimizers.Adam, sequence_chunks=2
  )
  with pytest.raises(validation.SequenceChunksError, match='set it to 1'):
    trainer.one_step(dense, cases.RNGS[0])


@pytest.mark.parametrize('value', [0, -2, 1.5, 'two', True])
def test_chunks_that_are_not_positive_ints_are_refused(value):
  with pytest.raises(
    validation.TrainerOptionError, match='sequence_chunks must be an int >= 1'
  ):
    TrainerOptions(sequence_chunks=value)
