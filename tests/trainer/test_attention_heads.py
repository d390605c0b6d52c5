"""Attention heads at a time (`parallel_heads`): below the one-row floor.

References: stock trax's `ReversibleSerialTrainer` on the same ReformerLM
(trax's efficient `SelfAttention`, 4 heads, all pairs at once as
configured), inputs and RNGs, with dropout off and on (every (example,
head) pair draws with the same RNG however many run at once); XLA's own
figures for what one pair at a time saves; the layer objects as they were
before tracing.
"""

import dataclasses
import functools

import jax
import numpy as np
import pytest
from trax import layers as tl
from trax import optimizers

import trainer_cases as cases
from conftest import run_multidevice_worker
from trax_revplus import trainer as rev_trainer
from trax_revplus import validation
from trax_revplus.trainer._search import speed_rank
from trax_revplus.trainer._step import attention_heads

pytestmark = pytest.mark.usefixtures('stock_trax')

_batch = cases.self_attention_lm_batch
_blocks = cases.self_attention_lm_blocks
_train = cases.train_self_attention_lm
_stock = cases.stock_self_attention_lm


def _ours(fused, **kwargs):
  def make(blocks, loss):
    trainer = rev_trainer.ReversibleSerialTrainer(
      blocks, loss, optimizers.Adam, **kwargs
    )
    if fused:
      batch = _batch()
      cases.set_plan(
        trainer,
        batch,
        dataclasses.replace(cases.fused_plan(trainer, batch), parallel_heads=1),
      )
    else:
      assert trainer.planned(_batch()).plan.parallel_heads == 1
    return trainer

  return make


@pytest.mark.parametrize('dropout', [0.0, 0.1])
@pytest.mark.parametrize(
  'fused,kwargs',
  [
    (False, {'device_memory_budget_bytes': None, 'parallel_heads': 1}),
    (
      False,
      {
        'device_memory_budget_bytes': None,
        'parallel_heads': 1,
        'segment_max_layers': 1,
        'micro_batches': 2,
      },
    ),
    (True, {'parallel_heads': 1}),
  ],
  ids=['configured', 'one-layer-per-call-micro-batches', 'fused'],
)
def test_one_head_at_a_time_trains_as_stock(fused, kwargs, dropout):
  if dropout and kwargs.get('micro_batches'):
    pytest.skip('micro-batches draw their masks per part (documented)')
  expected_weights, expected_losses = _stock(dropout)
  weights, losses = _train(_ours(fused, **kwargs), dropout)
  np.testing.assert_allclose(losses, expected_losses, rtol=0, atol=1e-5)
  assert len(weights) == len(expected_weights)
  # Micro-batches add their parts' gradients in another float32 order
  # than one pass, and Adam's first steps (a step of about the learning
  # rate whatever the gradient's size) carry that rounding into weights
  # near zero: seen 1.2e-5 apart on one of 512 weights after 3 steps.
  atol = 3e-5 if kwargs.get('micro_batches') else 1e-5
  for got, expected in zip(weights, expected_weights):
    np.testing.assert_allclose(got, expected, rtol=0, atol=atol)


def test_the_layers_are_left_as_found():
  blocks, loss = _blocks(0.0)
  found = attention_heads.attention_layers(
    [l for std, revs in blocks for l in std + revs]
  )
  assert len(found) == 2 and all(a._n_parallel_heads is None for a in found)  # pylint: disable=protected-access
  trainer = rev_trainer.ReversibleSerialTrainer(
    blocks,
    loss,
    optimizers.Adam,
    device_memory_budget_bytes=None,
    parallel_heads=1,
  )
  cases.train(trainer, _batch(), 1)
  assert all(a._n_parallel_heads is None for a in found)  # pylint: disable=protected-access
  with pytest.raises(RuntimeError):
    with attention_heads.at_once(found, 2):
      assert all(a._n_parallel_heads == 2 for a in found)  # pylint: disable=protected-access
      raise RuntimeError('inside')
  assert all(a._n_parallel_heads is None for a in found)  # pylint: disable=protected-access


def _peak_attention_call_bytes(trainer, batch, plan):
  step = trainer.planner.weigh(plan, trainer.planner.step_types(batch))
  return step.peak_device_bytes, max(
    c.device_bytes for c in step.calls if 'Attn' in c.name
  )


def test_one_head_at_a_time_shrinks_the_attention_calls_and_the_least():
  batch = _batch(64)
  blocks, loss = _blocks(0.0, 64)
  trainer = rev_trainer.ReversibleSerialTrainer(
    blocks, loss, optimizers.Adam, device_memory_budget_bytes=None
  )
  plan, least = trainer.planner.least_plan(batch)
  assert plan.parallel_heads == 1
  configured = dataclasses.replace(plan, parallel_heads=None)
  peak, attention = _peak_attention_call_bytes(trainer, batch, configured)
  peak_1, attention_1 = _peak_attention_call_bytes(trainer, batch, plan)
  assert least.peak_device_bytes == peak_1 < peak
  # All (example, head) pairs of a call's rows at once hold an attention
  # matrix of 64 x 64 floats (16 KiB) each; one pair at a time, one.
  rows = 4 // (plan.micro_batches * plan.batch_slices)
  assert attention - attention_1 >= (rows * 4 - 1) * 64 * 64 * 4


def test_a_budget_takes_one_head_at_a_time_only_where_nothing_else_fits(
  monkeypatch,
):
  # The rank of a backend without `SPEED_PARALLEL_HEADS` (an accelerator's).
  monkeypatch.setattr(speed_rank, 'SPEED_PARALLEL_HEADS', {})
  batch = _batch(64)
  # One pass, unsliced, without chunks: fewer plans to compile.
  pins = dict(batch_slices=1, micro_batches=1, sequence_chunks=1)
  roomy = rev_trainer.ReversibleSerialTrainer(
    *_blocks(0.0, 64), optimizers.Adam, device_memory_budget_bytes=2**30, **pins
  )
  assert roomy.planned(batch).plan.parallel_heads is None
  plan, least = roomy.planner.least_plan(batch)
  assert plan.parallel_heads == 1
  tight = rev_trainer.ReversibleSerialTrainer(
    *_blocks(0.0, 64),
    optimizers.Adam,
    device_memory_budget_bytes=least.peak_device_bytes,
    **pins,
  )
  chosen = tight.planned(batch)
  assert chosen.plan.parallel_heads == 1
  assert chosen.memory.peak_device_bytes <= least.peak_device_bytes
  # Nothing with the heads as configured fits this budget.
  assert all(
    w.memory.peak_device_bytes > least.peak_device_bytes
    for w in tight.planner.weighing(batch).weighed
    if w.plan.parallel_heads is None
  )


def test_one_head_at_a_time_ranks_first_on_the_cpu():
  batch = _batch(64)
  trainer = rev_trainer.ReversibleSerialTrainer(
    *_blocks(0.0, 64),
    optimizers.Adam,
    device_memory_budget_bytes=2**30,
    batch_slices=1,
    micro_batches=1,
    sequence_chunks=1,
  )
  heads = trainer.planned(batch).plan.parallel_heads
  assert speed_rank.SPEED_PARALLEL_HEADS[jax.default_backend()] == (
    speed_rank.FEWEST
  )
  assert heads == 1


def _ours_pinned(**kwargs):
  def make(blocks, loss):
    return rev_trainer.ReversibleSerialTrainer(
      blocks, loss, optimizers.Adam, device_memory_budget_bytes=None, **kwargs
    )

  return make


@pytest.mark.parametrize('dropout', [0.0, 0.1])
@pytest.mark.parametrize(
  'kwargs',
  [
    {'parallel_heads': 16},
    {'parallel_heads': 8},
    {'parallel_heads': 16, 'batch_slices': 2},
  ],
  ids=['all-pairs', 'two-rows-at-once', 'all-pairs-of-each-slice'],
)
def test_more_heads_at_once_than_configured_trains_as_stock(kwargs, dropout):
  # trax's SelfAttention configured one pair at a time, as trax's enwik8
  # config sets it; stock runs it so, ours raises it.
  expected_weights, expected_losses = _stock(dropout, 1)
  weights, losses = _train(_ours_pinned(**kwargs), dropout, 1)
  np.testing.assert_allclose(losses, expected_losses, rtol=0, atol=1e-5)
  assert len(weights) == len(expected_weights)
  # Slices add their gradients in another float32 order, which Adam's
  # first steps carry into weights near zero (as micro-batches, above):
  # seen 1.02e-5 apart on one of 512 weights.
  atol = 3e-5 if kwargs.get('batch_slices') else 1e-5
  for got, expected in zip(weights, expected_weights):
    np.testing.assert_allclose(got, expected, rtol=0, atol=atol)


def test_more_heads_at_once_grows_the_attention_calls():
  # What all pairs at once costs a call: XLA's own figures, the layers
  # configured one pair at a time.
  batch = _batch(64)
  blocks, loss = _blocks(0.0, 64, n_parallel_heads=1)
  trainer = rev_trainer.ReversibleSerialTrainer(
    blocks, loss, optimizers.Adam, device_memory_budget_bytes=None
  )
  plan, _ = trainer.planner.least_plan(batch)
  assert plan.parallel_heads is None
  raised = dataclasses.replace(plan, parallel_heads=16)
  _, attention = _peak_attention_call_bytes(trainer, batch, plan)
  _, attention_16 = _peak_attention_call_bytes(trainer, batch, raised)
  # 16 pairs at once hold 16 attention matrices of 64 x 64 floats where
  # one pair at a time holds one: of 15 more, XLA keeps at least 13 (seen
  # 13.9) live at once.
  assert attention_16 - attention >= 13 * 64 * 64 * 4


def test_all_pairs_at_once_ranks_first_where_the_rule_says(monkeypatch):
  # A backend whose rule is MOST, on the CPU's devices: the model
  # configured one pair at a time plans all of a call's pairs at once.
  batch = _batch(64)
  blocks, loss = _blocks(0.0, 64, n_parallel_heads=1)
  monkeypatch.setitem(
    speed_rank.SPEED_PARALLEL_HEADS,
    jax.default_backend(),
    speed_rank.MOST,
  )
  trainer = rev_trainer.ReversibleSerialTrainer(
    blocks,
    loss,
    optimizers.Adam,
    device_memory_budget_bytes=2**30,
    batch_slices=1,
    micro_batches=1,
    sequence_chunks=1,
  )
  # 4 rows of 4 heads each.
  assert trainer.planned(batch).plan.parallel_heads == 16


def test_bad_parallel_heads_are_one_line_errors():
  with pytest.raises(validation.TrainerOptionError, match='parallel_heads'):
    rev_trainer.ReversibleSerialTrainer(
      *_blocks(0.0), optimizers.Adam, parallel_heads=0
    )
  trainer = rev_trainer.ReversibleSerialTrainer(
    *_blocks(0.0),
    optimizers.Adam,
    device_memory_budget_bytes=None,
    parallel_heads=3,
  )
  with pytest.raises(validation.TrainerOptionError) as raised:
    trainer.planned(_batch())
  message = str(raised.value)
  assert '\n' not in message
  assert 'parallel_heads = 3 does not divide the 4 heads' in message
  # 8 pairs at once: a multiple of the heads, but not a divisor of the 12
  # pairs of 3 rows.
  trainer = rev_trainer.ReversibleSerialTrainer(
    *_blocks(0.0),
    optimizers.Adam,
    device_memory_budget_bytes=None,
    parallel_heads=8,
  )
  rows_3 = tuple(x[:3] for x in _batch())
  with pytest.raises(validation.TrainerOptionError) as raised:
    trainer.planned(rows_3)
  message = str(raised.value)
  assert '\n' not in message
  assert 'parallel_heads = 8 does not divide the 12 (example, head) pairs' in (
    message
  )


def test_one_head_at_a_time_on_2_devices_trains_as_the_default_trainer():
  """tests/placement/multidevice_worker.py's `attention_heads_main` in a
  fresh process on 2 forced CPU devices."""
  result = run_multidevice_worker(2, 'attention_heads_main')
  assert result['local_devices'] == 2, result
  assert result['heads_plan']['parallel_heads'] == 1, result
  assert result['max_diff_heads_vs_default_1dev'] <= 1e-5, result


def test_the_memory_log_records_the_accounted_peak_of_a_step(tmp_path):
  trainer = rev_trainer.ReversibleSerialTrainer(
    *_blocks(0.0),
    optimizers.Adam,
    device_memory_budget_bytes=None,
    parallel_heads=1,
    memory_log_every_n_steps=1,
    output_dir=str(tmp_path),
    memory_log_tensorboard=False,
  )
  assert trainer.planned(_batch()).plan.parallel_heads == 1
  cases.check_logged_peaks(trainer, _batch(), tmp_path)


def _mixed_attention_lm(dropout):
  """A 2-layer ReformerLM alternating trax's SelfAttention and
  LSHSelfAttention, each configured one pair at a time (as trax's enwik8
  config sets them), vocab 16, rows of 16."""
  return cases.small_reformer_lm(
    [
      functools.partial(
        tl.SelfAttention, chunk_len=4, n_chunks_before=1, n_parallel_heads=1
      ),
      functools.partial(
        tl.LSHSelfAttention,
        chunk_len=4,
        n_buckets=4,
        n_hashes=2,
        n_parallel_heads=1,
      ),
    ],
    dropout=dropout,
  )


@pytest.mark.parametrize('dropout', [0.0, 0.1])
def test_pairs_by_kind_train_as_stock(monkeypatch, dropout):
  # A backend whose rule raises SelfAttention to one row's heads at once
  # (as a TPU's does) on the CPU's devices: the plan sets SelfAttention's
  # layers to 2 pairs at once and leaves LSHSelfAttention's as
  # configured; the weights and losses are stock trax's, which runs both
  # one pair at a time.
  monkeypatch.setitem(
    speed_rank.SPEED_PARALLEL_HEADS_BY_KIND,
    jax.default_backend(),
    {'SelfAttention': speed_rank.ROW},
  )
  plans = []

  def ours(blocks, loss):
    trainer = rev_trainer.ReversibleSerialTrainer(
      blocks, loss, optimizers.Adam, device_memory_budget_bytes=2**30
    )
    plans.append(trainer.planned(_batch()).plan)
    return trainer

  batch = _batch()
  expected_weights, expected_losses = cases.train_lm(
    cases.stock_trainer, _mixed_attention_lm(dropout), batch, 2
  )
  weights, losses = cases.train_lm(ours, _mixed_attention_lm(dropout), batch, 2)
  assert plans[0].parallel_heads == (('SelfAttention', 2),)
  np.testing.assert_allclose(losses, expected_losses, rtol=0, atol=1e-5)
  cases.assert_all_close(expected_weights, weights)


def test_pairs_by_kind_set_each_kind_and_leave_the_layers_as_found():
  model = _mixed_attention_lm(0.0)
  found = attention_heads.attention_layers([model])
  kinds = sorted(attention_heads.kind(a) for a in found)
  assert kinds == ['LSHSelfAttention', 'SelfAttention']
  by_kind = attention_heads.by_kind({'SelfAttention': 2})
  with attention_heads.at_once(found, by_kind):
    assert {
      attention_heads.kind(a): a._n_parallel_heads  # pylint: disable=protected-access
      for a in found
    } == {'SelfAttention': 2, 'LSHSelfAttention': 1}
  assert all(a._n_parallel_heads == 1 for a in found)  # pylint: disable=protected-access
  kinds_heads = attention_heads.layer_kinds(found)
  assert attention_heads.changes_kinds(kinds_heads, by_kind, rows=4)
  assert not attention_heads.changes_kinds(
    kinds_heads, attention_heads.by_kind({'LSHSelfAttention': 1}), rows=4
  )
  # A kind's number is checked against its own layers only.
  with pytest.raises(validation.TrainerOptionError, match='= 3 does not'):
    attention_heads.check(
      found, attention_heads.by_kind({'SelfAttention': 3}), 'x', rows=4
    )
  attention_heads.check(
    found, attention_heads.by_kind({'SelfAttention': 2}), 'x', rows=4
  )
