"""Batch slices: the same step over k slices of each device's rows.

References: trax's default `Trainer` on the same model and inputs (dense
layers, with and without dropout), stock trax's `ReversibleSerialTrainer`
(a ReformerLM with dropout), ours without slices (LSH attention, whose
hashes come from per-row state), and `jax.vjp` of the whole loss (the loss
combination).
"""

import dataclasses

import jax
import numpy as np
import pytest
import trax
from trax import fastmath
from trax import layers as tl
from trax.layers import core
from trax import optimizers
from trax import shapes

import trainer_cases as cases
from trax_revplus import trainer as rev_trainer
from trax_revplus import validation
from trax_revplus.trainer._step import attention_heads
from trax_revplus.trainer._step import loss_combination

pytestmark = pytest.mark.usefixtures('stock_trax')


@pytest.mark.parametrize(
  'kwargs', [{'batch_slices': 2}, {'batch_slices': 4, 'segment_max_layers': 1}]
)
def test_slices_train_as_the_default_trainer(kwargs):
  batch = cases.lm_batch()
  model, trainer = cases.lm_trainer(batch, **kwargs)
  planned = trainer.planned(batch)
  assert planned.plan.batch_slices == kwargs['batch_slices']
  cases.train(trainer, batch, 3)
  # The model is stateless.
  ref_weights, ref_slots, _ = cases.lm_reference_3_steps()
  cases.assert_all_close(ref_weights, model.weights)
  cases.assert_all_close(ref_slots, trainer.slots)


def test_a_slice_whose_loss_weights_are_all_zero_adds_nothing():
  batch = cases.lm_batch(zero_rows=(0, 1))  # slice 0 of 2
  model, trainer = cases.lm_trainer(batch, batch_slices=2)
  losses = cases.train(trainer, batch, 3)
  assert all(np.isfinite(float(l)) for l in losses)
  ref_weights, ref_slots, _ = cases.lm_reference_3_steps(zero_rows=(0, 1))
  cases.assert_all_close(ref_weights, model.weights)
  cases.assert_all_close(ref_slots, trainer.slots)


def _lsh_trainer(batch, **kwargs):
  blocks, loss = rev_trainer.extract_reversible_blocks(
    [cases.lsh_model(), tl.WeightedCategoryCrossEntropy()]
  )
  rev_trainer.init_reversible_blocks(
    blocks, loss, shapes.signature(batch), fastmath.random.get_prng(3)
  )
  trainer = rev_trainer.ReversibleSerialTrainer(
    blocks, loss, optimizers.Adam, **kwargs
  )
  return trainer


def test_lsh_slices_hash_each_row_as_unsliced():
  rs = np.random.RandomState(2)
  tokens = rs.randint(1, 16, size=(4, 16)).astype(np.int32)
  batch = (tokens, tokens, np.ones_like(tokens, dtype=np.float32))
  results = []
  for k in (1, 2):
    trainer = _lsh_trainer(batch, batch_slices=k)
    cases.train(trainer, batch, 2)
    results.append(
      (
        [l.weights for l in trainer.all_layers],
        [l.state for l in trainer.all_layers],
        trainer.slots,
      )
    )
  # Each LSH layer's state holds one hash RNG and bucket row per example
  # and head: the sliced step split them with the rows.
  cases.assert_all_close(results[0], results[1])


@pytest.mark.parametrize(
  'kwargs',
  [{}, {'segment_max_layers': 1, 'device_memory_budget_bytes': None}],
  ids=['fused', 'one-layer-per-call'],
)
def test_dropout_slices_draw_the_unsliced_masks(kwargs):
  """trax's `Dropout` in the first layer, in reversible blocks and in the
  loss layer: each slice draws its rows of the unsliced masks, so 2 slices
  give the default Trainer's weights and slots on the same RNGs."""
  model, trainer, _ = cases.train_basic(n_steps=3, batch_slices=2, **kwargs)
  plan = trainer.planned(cases.batch()).plan
  assert plan.batch_slices == 2
  assert (plan.fused_from == 0) == (not kwargs)
  ref_weights, ref_slots, _ = cases.basic_adam_reference_3_steps()
  cases.assert_all_close(ref_weights, model.weights)
  cases.assert_all_close(ref_slots, trainer.slots)


@pytest.mark.parametrize('fused', [True, False], ids=['fused', 'unfused'])
def test_slices_of_a_reformer_lm_with_dropout_train_as_stock(fused):
  """trax's ReformerLM, dropout 0.1: `Dropout`, `PositionalEncoding`'s
  dropout and `SelfAttention`'s per-pair draws, in 2 slices, against stock
  trax's `ReversibleSerialTrainer`; the planner sees that slices change no
  draw and, on the CPU, plans 2 slices with no settings."""

  def make(blocks, loss):
    kwargs = {} if fused else {'segment_max_layers': 1}
    trainer = rev_trainer.ReversibleSerialTrainer(
      blocks, loss, optimizers.Adam, **kwargs
    )
    plan = trainer.planned(cases.self_attention_lm_batch()).plan
    if jax.default_backend() == 'cpu':
      assert plan.batch_slices == 2
    if plan.batch_slices != 2:
      cases.set_plan(
        trainer,
        cases.self_attention_lm_batch(),
        dataclasses.replace(plan, batch_slices=2),
      )
    assert (plan.fused_from == 0) == fused
    return trainer

  expected_weights, expected_losses = cases.stock_self_attention_lm(0.1)
  weights, losses = cases.train_self_attention_lm(make, 0.1)
  np.testing.assert_allclose(losses, expected_losses, rtol=0, atol=1e-5)
  cases.assert_all_close(expected_weights, weights)


def test_the_dropout_and_attention_layers_are_left_as_found():
  """Planning and sliced steps patch trax's `Dropout.forward` and the
  attention layers' `forward` only while they trace."""
  found = core.Dropout.__dict__['forward']
  blocks, loss = cases.self_attention_lm_blocks(0.1)
  trainer = rev_trainer.ReversibleSerialTrainer(
    blocks, loss, optimizers.Adam, batch_slices=2
  )
  cases.train(trainer, cases.self_attention_lm_batch(), 1)
  assert core.Dropout.__dict__['forward'] is found
  assert all(
    'forward' not in vars(layer)
    for layer in attention_heads.sublayers(trainer.all_layers)
  )
  assert 'bernoulli' not in vars(fastmath.random)


def test_slices_change_a_draw_of_slice_shape_elsewhere():
  """`tl.Attention`'s dropout draws (rows x heads, length, length): slices
  would change it, so the trace says so; trax's `Dropout`, efficient
  attention and `PositionalEncoding` do not."""

  def trace(attention, dropout=0.1):
    model = (
      trax.models.TransformerLM(
        16,
        d_model=16,
        d_ff=32,
        n_layers=1,
        n_heads=2,
        dropout=dropout,
        mode='train',
      )
      if attention
      else cases.self_attention_lm(dropout)
    )
    blocks, loss = rev_trainer.extract_reversible_blocks(
      [model, tl.WeightedCategoryCrossEntropy()]
    )
    batch = cases.self_attention_lm_batch()
    rev_trainer.init_reversible_blocks(
      blocks, loss, shapes.signature(batch), fastmath.random.get_prng(3)
    )
    trainer = rev_trainer.ReversibleSerialTrainer(blocks, loss, optimizers.Adam)
    return trainer.planned(batch)

  assert trace(False).plan.batch_slices == 2
  assert trace(True).plan.batch_slices == 1
  assert trace(True, dropout=0.0).plan.batch_slices == 2


def test_slices_that_do_not_divide_the_rows_stop_before_any_update():
  batch = cases.lm_batch(rows=4)
  model, trainer = cases.lm_trainer(batch, batch_slices=3)
  before = jax.tree_util.tree_map(np.array, model.weights)
  with pytest.raises(validation.BatchSlicesError) as e:
    trainer.one_step(batch, cases.RNGS[0])
  assert str(e.value) == (
    'trax_revplus.ReversibleSerialTrainer.batch_slices = 3 does not divide '
    'the 4 rows of the batch each device gets; use one of [1, 2, 4], or a '
    'batch whose rows per device are a multiple of 3.'
  )
  cases.assert_all_close(before, model.weights, tol=0)


@pytest.mark.parametrize(
  'loss,combines',
  [
    (tl.WeightedCategoryCrossEntropy(), True),
    (tl.Serial(tl.Dense(4), tl.LogSoftmax(), tl.CrossEntropyLoss()), True),
    (tl.L2Loss(), True),
    (tl.Serial(tl.Dense(3), tl.CrossEntropySum()), True),
    (tl.BinaryCrossEntropyLoss(), False),  # mixes rows
    (tl.CategoryCrossEntropy(), False),  # no weights
    # Weights consumed before the loss: not the loss's weights.
    (tl.Serial(tl.Select([0, 1, 1]), tl.WeightedCategoryCrossEntropy()), False),
  ],
)
def test_which_losses_combine_over_slices(loss, combines):
  assert (loss_combination.loss_combination([loss]) is not None) == combines


def test_combined_slices_give_the_whole_loss_and_its_gradient():
  """`vjp` of the whole weighted mean against the sum of scaled slices."""
  loss = tl.WeightedCategoryCrossEntropy()
  rs = np.random.RandomState(0)
  logits = rs.randn(4, 5, 7).astype(np.float32)
  targets = rs.randint(0, 7, size=(4, 5))
  weights = rs.randint(0, 3, size=(4, 5)).astype(np.float32)
  whole, vjp_fn = jax.vjp(lambda x: loss((x, targets, weights)), logits)
  (grad,) = vjp_fn(np.float32(1))
  combine = loss_combination.loss_combination([loss])
  parts, grads = [], []
  for s in range(2):
    rows = slice(2 * s, 2 * s + 2)
    factor = combine(weights[rows], weights)
    part, vjp_fn = jax.vjp(
      lambda x, r=rows, f=factor: loss((x, targets[r], weights[r])) * f,
      logits[rows],
    )
    parts.append(part)
    grads.append(vjp_fn(np.float32(1))[0])
  np.testing.assert_allclose(sum(parts), whole, rtol=1e-6)
  np.testing.assert_allclose(np.concatenate(grads), grad, atol=1e-7)
