"""Device memory of trax_revplus's trainer: the programs a real step calls,
what it holds across them, the memory log's figure, and the budget.

References: XLA's memory analysis of the very functions a real `one_step`
calls (recorded by wrapping them, with the arguments it passed); byte
counts of the real arrays (weights, slots, activations from running the
layers); trax's default `Trainer` for the values trained under a budget.
"""

import functools
import json
import os

import jax
import numpy as np
import pytest
from trax import fastmath
from trax import layers as tl
from trax import optimizers

from trax_revplus.device_memory import program
from trax_revplus.device_memory import revplus_trainer
from trax_revplus.trainer import device_plan
from trax_revplus.trainer import trainer as trainer_lib
from tests.trainer import trainer_cases as cases


def _trainer(**kwargs):
  batch = cases.batch()
  first, revs, loss = cases.basic_model()
  model = tl.Serial([first] + revs + [loss])
  model.init(batch, rng=fastmath.random.get_prng(12))
  trainer = trainer_lib.ReversibleSerialTrainer(
      [(first.sublayers, revs)], loss, optimizers.Adam, **kwargs)
  return model, trainer


def _recording(fn, calls):
  def call(*args):
    calls.append((fn, args))
    return fn(*args)
  return call


def _record_step(trainer):
  """Runs one real step, recording each compiled call and its arguments."""
  units = trainer._units  # pylint: disable=protected-access
  calls = []
  for unit in units.forward_units:
    unit.forward_fn = _recording(unit.forward_fn, calls)
  loss_fn = units.loss_unit.fn
  units.loss_unit.fn = _recording(loss_fn, calls)
  for unit in {id(u): u for u in units.backward_units()}.values():
    unit.backward_fn = _recording(unit.backward_fn, calls)
  trainer.one_step(cases.batch(), cases.RNGS[0])
  return calls


@pytest.mark.parametrize('kwargs', [
    {}, {'segment_max_layers': 1}, {'segment_max_layers': 4,
                                    'backward_segment_max_layers': 2}])
def test_accounted_programs_are_those_one_step_calls(kwargs):
  _, trainer = _trainer(**kwargs)
  memory = trainer.device_memory_of(cases.batch())
  calls = _record_step(trainer)
  assert len(memory.calls) == len(calls)
  for accounted, (fn, args) in zip(memory.calls, calls):
    real = program.analyze(fn, *program.abstract(args)).memory
    assert accounted.program == real, accounted.name
  names = [c.name for c in memory.calls]
  assert names[0].startswith('forward layer 0')
  assert [c.phase for c in memory.calls].count('loss') == 1


def _nbytes(tree):
  """Bytes of the leaves as device arrays (int64 batches become int32)."""
  return sum(jax.numpy.asarray(x).nbytes
             for x in jax.tree_util.tree_leaves(tree))


def test_held_parts_match_the_real_arrays():
  model, trainer = _trainer(segment_max_layers=4, n_async_layers=8)
  memory = trainer.device_memory_of(cases.batch())
  layers = trainer.all_layers
  batch = cases.batch()
  # The model's own forward gives the loss layer's inputs: the stack the
  # loss call sees holds them, plus the targets and weights below.
  loss_call = next(c for c in memory.calls if c.phase == 'loss')
  sub = tl.Serial(layers[:-1])
  sub_out = sub(batch, weights=sub.weights, state=sub.state,
                rng=fastmath.random.get_prng(0))
  held = {h.name: h.size_bytes for h in loss_call.held}
  assert held['stack'] == _nbytes(sub_out)
  # Before the first backward call, the loss layer's update waits to be
  # copied back (n_async_layers=8 > its 1 layer): its weights, slots and
  # state, as the host keeps them.
  loss_layer = layers[-1]
  first_bwd = next(c for c in memory.calls if c.phase == 'backward')
  held = {h.name: h.size_bytes for h in first_bwd.held}
  opt = trainer._store.optimizers[-1]  # pylint: disable=protected-access
  assert held['updates not yet copied back'] == (
      _nbytes(loss_layer.weights) + _nbytes(opt.slots) +
      _nbytes(loss_layer.state))
  # At the first forward call the next unit's weights are placed ahead:
  # the segment of reversible layers 1..4.
  first_fwd = memory.calls[0]
  held = {h.name: h.size_bytes for h in first_fwd.held}
  assert held['weights placed ahead'] == _nbytes(
      [l.weights for l in layers[1:5]])
  assert held['stack'] == _nbytes(batch)
  # Saved for the backward pass at the loss: the standard layers' inputs
  # (the batch's first leaf, then each one's outputs) and every state.
  held = {h.name: h.size_bytes for h in loss_call.held}
  assert held['saved block inputs and states'] >= _nbytes(batch[0])
  del model


def test_commit_waits_follows_n_async_layers():
  assert revplus_trainer.commit_waits([1], 8) == 1
  assert revplus_trainer.commit_waits([1, 4, 4], 8) == 2
  assert revplus_trainer.commit_waits([4, 4, 4], 8) == 2
  assert revplus_trainer.commit_waits([3], 0) == 0
  assert revplus_trainer.commit_waits([8, 1], 1) == 1


def test_memory_log_records_the_accounted_peak(tmp_path):
  _, trainer = _trainer(memory_log_every_n_steps=1, output_dir=str(tmp_path),
                        memory_log_tensorboard=False)
  expected = trainer.device_memory_of(cases.batch())
  trainer.one_step(cases.batch(), cases.RNGS[0], step=1)
  trainer.memory_log.close()
  records = [json.loads(l) for l in
             open(os.path.join(tmp_path, 'memory.jsonl'))]
  step = [r for r in records if r['step'] == 1 and
          r['phase'] in ('forward', 'loss', 'backward')]
  assert {r['phase'] for r in step} == {'forward', 'loss', 'backward'}
  for r in step:
    assert r['peak_device_bytes'] == expected.peak_device_bytes
    assert r['phase_peak_device_bytes'] == expected.phase_peaks()[r['phase']]
  assert max(r['phase_peak_device_bytes'] for r in step) == (
      expected.peak_device_bytes)


def test_candidates_rank_by_calls():
  choices = device_plan.candidates([24])
  calls = [c.n_calls for c in choices]
  assert calls == sorted(calls)
  first = choices[0]
  assert (first.segment_max_layers, first.backward_segment_max_layers) == (
      8, 8)
  assert first.n_calls == 2 + 3 + 3 + 1
  assert all(c.backward_segment_max_layers <= c.segment_max_layers
             for c in choices)
  assert len(choices) == 10
  small = device_plan.candidates([4])
  assert {c.segment_max_layers for c in small} == {1, 2, 4}


def _lengths(trainer):
  units = trainer._units  # pylint: disable=protected-access
  segments = [u for u in units.forward_units if len(u.layers) > 1 or
              u.layers[0] != 0]
  return (max(len(u.layers) for u in segments),
          max(len(u.layers) for u in units.backward_units()
              if u.layers != [0]))


# Candidate lengths the budget tests plan with (fewer than the trainer's, to
# compile fewer programs): 3 plans of the 4 reversible layers.
_LENGTHS = (1, 4)


@pytest.fixture
def few_candidates(monkeypatch):
  monkeypatch.setattr(device_plan, 'CANDIDATE_LENGTHS', _LENGTHS)


@functools.lru_cache(maxsize=1)
def _peaks_of_candidates():
  """Each candidate plan's peak, from a trainer given its lengths."""
  peaks = []
  for choice in device_plan.candidates([4], _LENGTHS):
    _, trainer = _trainer(
        segment_max_layers=choice.segment_max_layers,
        backward_segment_max_layers=choice.backward_segment_max_layers)
    peaks.append((choice, trainer.device_memory_of(
        cases.batch()).peak_device_bytes))
  return peaks


def test_budget_chooses_the_fastest_plan_that_fits(few_candidates):
  peaks = _peaks_of_candidates()
  smallest = min(p for _, p in peaks)
  budgets = sorted({smallest, max(p for _, p in peaks)})
  for budget in budgets:
    expected = next(c for c, p in peaks if p <= budget)
    model, trainer = _trainer(device_memory_budget_bytes=budget)
    cases.train(trainer, cases.batch(), 3)
    choice = trainer.device_plan.choice
    assert (choice.segment_max_layers, choice.backward_segment_max_layers) == (
        expected.segment_max_layers, expected.backward_segment_max_layers)
    assert choice.peak_device_bytes <= budget
    assert _lengths(trainer) == (expected.segment_max_layers,
                                 expected.backward_segment_max_layers)
    ref_weights, ref_slots, ref_state = cases.basic_adam_reference_3_steps()
    cases.assert_all_close(ref_weights, model.weights)
    cases.assert_all_close(ref_slots, trainer.slots)
    cases.assert_all_close(ref_state, model.state)


def test_budget_nothing_fits_names_the_smallest_that_would(few_candidates):
  model, trainer = _trainer(device_memory_budget_bytes=1000)
  before = jax.tree_util.tree_map(np.array, model.weights)
  with pytest.raises(device_plan.DeviceMemoryBudgetError) as e:
    trainer.one_step(cases.batch(), cases.RNGS[0])
  message = str(e.value)
  assert '\n' not in message
  assert 'device_memory_budget_bytes=1000 ' in message
  need = int(message.split('device_memory_budget_bytes >= ')[1].split(',')[0])
  assert need == min(p for _, p in _peaks_of_candidates())
  cases.assert_all_close(before, model.weights, tol=0)
  _, trainer = _trainer(device_memory_budget_bytes=need)
  trainer.one_step(cases.batch(), cases.RNGS[0])
  assert trainer.device_plan.choice.peak_device_bytes == need


@pytest.mark.parametrize('name,value', [
    ('device_memory_budget_bytes', 0), ('device_memory_budget_bytes', 1.5),
    ('store_activations', 'sometimes')])
def test_bad_budget_settings_are_rejected(name, value):
  from trax_revplus import validation  # pylint: disable=g-import-not-at-top
  with pytest.raises(validation.TrainerOptionError, match=name):
    _trainer(**{name: value})


@pytest.mark.parametrize('kwargs', [
    {'store_activations': 'always'},
    {'store_activations': 'always', 'segment_max_layers': 2,
     'n_async_layers': 0}])
def test_stored_activations_train_as_the_default_trainer(kwargs):
  """Segments that keep jax.vjp's function instead of reversing: the same
  weights, slots and state as trax's default Trainer after 3 steps."""
  model, trainer = _trainer(**kwargs)
  units = trainer._units  # pylint: disable=protected-access
  segments = [u for u in units.forward_units if u.layers != [0]]
  assert segments and all(u.keep for u in segments)
  cases.train(trainer, cases.batch(), 3)
  ref_weights, ref_slots, ref_state = cases.basic_adam_reference_3_steps()
  cases.assert_all_close(ref_weights, model.weights)
  cases.assert_all_close(ref_slots, trainer.slots)
  cases.assert_all_close(ref_state, model.state)


def test_stored_activations_accounted_as_one_step_calls_them():
  _, trainer = _trainer(store_activations='always')
  memory = trainer.device_memory_of(cases.batch())
  calls = _record_step(trainer)
  assert len(memory.calls) == len(calls)
  for accounted, (fn, args) in zip(memory.calls, calls):
    real = program.analyze(fn, *program.abstract(args)).memory
    assert accounted.program == real, accounted.name
  # The loss call holds the kept residuals: the forward call's vjp
  # function, as the real forward returned it, and the segment's inputs.
  loss_call = next(c for c in memory.calls if c.phase == 'loss')
  held = {h.name: h.size_bytes for h in loss_call.held}
  fwd_fn, fwd_args = next((fn, a) for fn, a in calls
                          if len(a) == 4 and isinstance(a[1], list))
  _, _, vjp_fn = fwd_fn(*fwd_args)
  assert held['kept activations'] == _nbytes(vjp_fn) + _nbytes(fwd_args[0])
