"""Micro-batches: the step's forward and backward over m parts of the rows.

References: trax's default `Trainer` on the same dropout-free model and
inputs (dense layers; micro-batches alone, with batch slices and with
sequence chunks; weights, slots and the losses each step returns; a batch
whose first part has no loss weight); ours without micro-batches on an LSH
`ReformerLM`, whose attention keeps per-row state (hash buckets and
per-row RNGs) that trax's default `Trainer` cannot split by rows; ours
itself where dropout makes the masks of part shape differ from trax's one
pass (two runs, and a run resumed after step 2); the step's own accounted
device memory for what the memory log records. On 2 devices:
tests/placement/multidevice_worker.py (`micro_batches_main`), against
trax's default `Trainer` on one device.
"""

import dataclasses
import functools

import jax
import numpy as np
import pytest
from trax import fastmath
from trax import layers as tl
from trax import optimizers
from trax import shapes

import trainer_cases as cases
from conftest import run_multidevice_worker
from conftest import reversible_lm_blocks
from trax_revplus import trainer as rev_trainer
from trax_revplus import validation
from trax_revplus.trainer import TrainerOptions
from trax_revplus.trainer._step import batch_parts

pytestmark = pytest.mark.usefixtures('stock_trax')


@functools.lru_cache(maxsize=1)
def _lm_reference_losses():
  """The losses trax's default Trainer returns in the 3 steps of
  `cases.lm_reference_3_steps()` (same model, batch, init, RNGs and
  learning rates)."""
  batch = cases.lm_batch()
  first, revs, loss = reversible_lm_blocks()
  model = tl.Serial([first] + revs + [loss])
  model.init(batch, rng=fastmath.random.get_prng(12))
  trainer, _ = cases.default_trainer(model, optimizers.Adam)
  return [float(np.asarray(l)) for l in cases.train(trainer, batch, 3)]


@pytest.mark.parametrize(
  'micro,slices,chunks', [(2, 1, 1), (4, 1, 1), (2, 2, 1), (2, 1, 2), (2, 2, 2)]
)
def test_micro_batches_train_as_the_default_trainer(micro, slices, chunks):
  batch = cases.lm_batch()  # 4 rows of length 6
  model, trainer = cases.lm_trainer(
    batch,
    micro_batches=micro,
    batch_slices=slices,
    sequence_chunks=chunks,
    device_memory_budget_bytes=None,
  )
  plan = trainer.planned(batch).plan
  assert (plan.micro_batches, plan.batch_slices, plan.sequence_chunks) == (
    micro,
    slices,
    chunks,
  )
  losses = cases.train(trainer, batch, 3)
  ref_weights, ref_slots, _ = cases.lm_reference_3_steps()
  cases.assert_all_close(ref_weights, model.weights)
  cases.assert_all_close(ref_slots, trainer.slots)
  # Each step's loss: the whole batch's, as trax's one pass returns it
  # (the parts' shares of it added).
  ours = [float(np.mean(np.asarray(l))) for l in losses]
  np.testing.assert_allclose(ours, _lm_reference_losses(), rtol=0, atol=1e-5)


@pytest.mark.parametrize('slices,n_async_layers', [(1, 0), (2, 8)])
def test_gradients_added_on_the_host_train_as_the_default_trainer(
  slices, n_async_layers
):
  batch = cases.lm_batch()
  model, trainer = cases.lm_trainer(
    batch,
    micro_batches=2,
    batch_slices=slices,
    n_async_layers=n_async_layers,
    device_memory_budget_bytes=None,
  )
  on_device = trainer.planned(batch).plan
  assert not on_device.grads_on_host
  on_host = cases.set_plan(
    trainer, batch, dataclasses.replace(on_device, grads_on_host=True)
  )
  held = {h.name for call in on_host.calls for h in call.held if h.size_bytes}
  assert 'accumulated gradients' not in held, held
  on_device_memory = trainer.planner.weigh(
    on_device, trainer.planner.step_types(batch)
  )
  assert 'accumulated gradients' in {
    h.name for call in on_device_memory.calls for h in call.held if h.size_bytes
  }
  if n_async_layers == 0:
    assert on_host.peak_device_bytes < on_device_memory.peak_device_bytes
  cases.train(trainer, batch, 3)
  assert trainer.planned(batch).plan.grads_on_host
  ref_weights, ref_slots, _ = cases.lm_reference_3_steps()
  cases.assert_all_close(ref_weights, model.weights)
  cases.assert_all_close(ref_slots, trainer.slots)


def test_a_part_whose_loss_weights_are_all_zero_adds_nothing():
  zero_rows = (0, 1)  # part 0 of 2 on one device
  batch = cases.lm_batch(zero_rows=zero_rows)
  model, trainer = cases.lm_trainer(
    batch, micro_batches=2, device_memory_budget_bytes=None
  )
  assert trainer.planned(batch).plan.micro_batches == 2
  losses = cases.train(trainer, batch, 3)
  assert all(np.all(np.isfinite(np.asarray(l))) for l in losses), losses
  ref_weights, ref_slots, _ = cases.lm_reference_3_steps(zero_rows=zero_rows)
  cases.assert_all_close(ref_weights, model.weights)
  cases.assert_all_close(ref_slots, trainer.slots)
  one_pass, control = cases.lm_trainer(
    batch, micro_batches=1, device_memory_budget_bytes=None
  )
  control_losses = cases.train(control, batch, 3)
  cases.assert_all_close(one_pass.weights, model.weights)
  cases.assert_all_close(control_losses, losses)


def _lsh_trained(micro_batches):
  tokens = np.random.RandomState(2).randint(1, 16, size=(4, 16))
  tokens = tokens.astype(np.int32)
  batch = (tokens, tokens, np.ones_like(tokens, dtype=np.float32))
  blocks, loss = rev_trainer.extract_reversible_blocks(
    [cases.lsh_model(), tl.WeightedCategoryCrossEntropy()]
  )
  rev_trainer.init_reversible_blocks(
    blocks, loss, shapes.signature(batch), fastmath.random.get_prng(3)
  )
  trainer = rev_trainer.ReversibleSerialTrainer(
    blocks,
    loss,
    optimizers.Adam,
    device_memory_budget_bytes=None,
    micro_batches=micro_batches,
  )
  assert trainer.planned(batch).plan.micro_batches == micro_batches
  losses = cases.train(trainer, batch, 2)
  return trainer, losses


def test_micro_batches_train_as_one_pass_on_an_lsh_reformer():
  whole, whole_losses = _lsh_trained(1)
  parts, part_losses = _lsh_trained(2)
  cases.assert_all_close(
    ([l.weights for l in whole.all_layers], whole.slots),
    ([l.weights for l in parts.all_layers], parts.slots),
  )
  cases.assert_all_close(whole_losses, part_losses)
  # The per-row state (LSH buckets, per-row RNGs), joined from the parts'
  # rows, is the one pass's.
  whole_state = [l.state for l in whole.all_layers]
  part_state = [l.state for l in parts.all_layers]
  assert jax.tree_util.tree_structure(
    whole_state
  ) == jax.tree_util.tree_structure(part_state)
  assert any(np.size(x) for x in jax.tree_util.tree_leaves(whole_state))
  cases.assert_all_close(whole_state, part_state, tol=0)


def test_dropout_micro_batches_and_chunks_repeat_across_runs_and_resumes():
  """With dropout, a step over micro-batches (and its loss tail over
  sequence chunks) is a function of the weights, the step's RNGs and the
  batch: two runs agree, a run resumed from the host weights, slots and
  state after step 2 ends where the uninterrupted one does, and the masks
  (of part shape, repeated from part to part) differ from one pass's."""
  batch = cases.batch()  # 2 rows of length 4
  first, revs, loss = cases.basic_model()  # Dropout in every block

  def fresh(micro, chunks=2):
    model = tl.Serial([first] + revs + [loss])
    model.init(batch, rng=fastmath.random.get_prng(12))
    trainer = rev_trainer.ReversibleSerialTrainer(
      [(first.sublayers, revs)],
      loss,
      optimizers.Adam,
      device_memory_budget_bytes=None,
      micro_batches=micro,
      sequence_chunks=chunks,
    )
    plan = trainer.planned(batch).plan
    assert (plan.micro_batches, plan.sequence_chunks) == (micro, chunks)
    return trainer

  def host(trainer):
    return jax.tree_util.tree_map(
      np.array,
      (
        [l.weights for l in trainer.all_layers],
        trainer.slots,
        [l.state for l in trainer.all_layers],
      ),
    )

  trainer = fresh(2)
  first_losses = cases.train(trainer, batch, 3)
  uninterrupted = host(trainer)
  trainer = fresh(2)
  second_losses = cases.train(trainer, batch, 2)
  weights, slots, state = host(trainer)  # after step 2
  second_losses += [
    trainer.one_step(batch, cases.RNGS[2], learning_rate=cases.LRS[2])[0]
  ]
  cases.assert_all_close(uninterrupted, host(trainer), tol=0)
  cases.assert_all_close(first_losses, second_losses, tol=0)
  resumed = fresh(2)
  for layer, w, s in zip(resumed.all_layers, weights, state):
    layer.weights = w
    layer.state = s
  resumed.slots = slots
  resumed.one_step(batch, cases.RNGS[2], learning_rate=cases.LRS[2])
  cases.assert_all_close(uninterrupted, host(resumed), tol=0)
  one_pass = fresh(1, chunks=1)
  cases.train(one_pass, batch, 3)
  assert not np.allclose(
    jax.tree_util.tree_leaves(uninterrupted[0])[0],
    jax.tree_util.tree_leaves(host(one_pass)[0])[0],
  )


@pytest.mark.slow  # 2 devices in a subprocess; CI runs it (slow_tests_smoke)
def test_micro_batches_on_2_devices_train_as_the_default_trainer():
  """tests/placement/multidevice_worker.py's `micro_batches_main` in a fresh
  process on 2 forced CPU devices (see tests/placement/test_multidevice.py)."""
  result = run_multidevice_worker(2, 'micro_batches_main')
  assert result['local_devices'] == 2, result
  assert result['micro_plan']['micro_batches'] == 2, result
  assert result['max_diff_micro_vs_default_1dev'] <= 1e-5, result
  assert result['micro_slices_plan']['micro_batches'] == 2, result
  assert result['micro_slices_plan']['batch_slices'] == 2, result
  assert result['max_diff_micro_slices_vs_default_1dev'] <= 1e-5, result
  assert result['micro_host_plan']['grads_on_host'], result
  assert result['max_diff_micro_host_vs_default_1dev'] <= 1e-5, result
  # Each device's loss of its rows, as without micro-batches; their mean
  # (rows of equal weight) is the default Trainer's loss of the batch.
  assert result['micro_loss_shape'] == [2], result
  assert result['max_diff_micro_loss_vs_ours_nd'] <= 1e-5, result
  assert result['max_diff_micro_loss_vs_default_1dev'] <= 1e-5, result
  assert result['max_diff_lsh_micro'] <= 1e-5, result
  assert result['lsh_state_equal'], result


def test_the_memory_log_records_the_accounted_peak_of_a_micro_batched_step(
  tmp_path,
):
  batch = cases.lm_batch()
  _, trainer = cases.lm_trainer(
    batch,
    micro_batches=2,
    device_memory_budget_bytes=None,
    memory_log_every_n_steps=1,
    output_dir=str(tmp_path),
    memory_log_tensorboard=False,
  )
  assert trainer.planned(batch).plan.micro_batches == 2
  cases.check_logged_peaks(trainer, batch, tmp_path)


@pytest.mark.parametrize(
  'settings,message',
  [
    (dict(micro_batches=3), 'micro_batches = 3 does not divide the 4 rows'),
    (
      dict(micro_batches=2, batch_slices=4),
      'leaves 2 rows per device in each part, which batch_slices = 4',
    ),
    (dict(micro_batches=2, adasum=True), 'adasum .* set it to 1'),
  ],
)
def test_bad_micro_batches_stop_before_any_update(settings, message):
  batch = cases.lm_batch()  # 4 rows
  model, trainer = cases.lm_trainer(
    batch, device_memory_budget_bytes=None, **settings
  )
  before = jax.tree_util.tree_map(np.array, model.weights)
  with pytest.raises(validation.MicroBatchesError, match=message):
    trainer.one_step(batch, cases.RNGS[0])
  cases.assert_all_close(before, model.weights, tol=0)


@pytest.mark.parametrize('value', [0, -2, 1.5, 'two', True])
def test_micro_batches_that_are_not_positive_ints_are_refused(value):
  with pytest.raises(
    validation.TrainerOptionError, match='micro_batches must be an int >= 1'
  ):
    TrainerOptions(micro_batches=value)


def test_the_budget_takes_micro_batches_only_where_nothing_else_fits():
  batch = cases.lm_batch()
  _, roomy = cases.lm_trainer(batch, device_memory_budget_bytes=2**30)
  assert roomy.planned(batch).plan.micro_batches == 1
  _, least = roomy.planner.least_plan(batch)
  one_pass = [
    w.memory.peak_device_bytes
    for w in roomy.planner.weighing(batch).weighed
    if w.plan.micro_batches == 1
  ]
  assert least.peak_device_bytes < min(one_pass)
  model, tight = cases.lm_trainer(
    batch, device_memory_budget_bytes=least.peak_device_bytes
  )
  assert tight.planned(batch).plan.micro_batches > 1
  losses = cases.train(tight, batch, 3)
  ref_weights, ref_slots, _ = cases.lm_reference_3_steps()
  cases.assert_all_close(ref_weights, model.weights)
  cases.assert_all_close(ref_slots, tight.slots)
  np.testing.assert_allclose(
    [float(np.mean(np.asarray(l))) for l in losses],
    _lm_reference_losses(),
    rtol=0,
    atol=1e-5,
  )


def test_a_parts_rows_and_their_types_come_from_one_function():
  """The step's part of the host batch and the walk ahead's part of its
  types (`batch_parts.part_of_batch`): the same rows, dtypes and Part."""
  batch = (
    np.arange(24, dtype=np.int64).reshape(12, 2),
    np.arange(12, dtype=np.float32),
  )
  types = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in batch)
  for index in range(3):
    part, rows = batch_parts.part_of_batch(batch, index, 3, 2)
    part_of_types, row_types = batch_parts.part_of_batch(types, index, 3, 2)
    assert part == part_of_types == batch_parts.Part(index, 3, 6)
    assert (
      [(x.shape, x.dtype) for x in rows]
      == [(x.shape, x.dtype) for x in row_types]
      == [((4, 2), np.int64), ((4,), np.float32)]
    )
    # Device d's rows [2 * index, 2 * index + 2) of its 6, devices in order.
    np.testing.assert_array_equal(
      rows[1], [2 * index, 2 * index + 1, 6 + 2 * index, 7 + 2 * index]
    )
