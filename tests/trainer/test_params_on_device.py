"""Weights and slots kept on the device across steps
(`StepPlan.params_on_device`).

References: trax's default `Trainer` on the same dropout-free model and
inputs (the values trained), which keeps its weights and slots on the
device as these plans do; the same plan with them on the host for what
the step holds and copies.
"""

import dataclasses

import jax
import numpy as np
import pytest
from trax import optimizers

from conftest import reversible_lm_blocks
from conftest import run_multidevice_worker
import trainer_cases as cases
from trax_revplus import notices
from trax_revplus import trainer as rev_trainer
from trax_revplus import validation
from trax_revplus.trainer._search import plan_timing
from trax_revplus.trainer._search import speed_rank

pytestmark = pytest.mark.usefixtures('stock_trax')

_KEPT = 'weights and slots kept on the device'


def _unfused(trainer, batch, on_device, **changes):
  """The widest unfused plan of one slice, weights and slots where asked."""
  p = trainer.planner
  group = next(
    g
    for g in p.candidates(p.step_types(batch)).groups()
    if not g.fused_reversible_layers
  )
  return dataclasses.replace(
    group.plans[0], params_on_device=on_device, **changes
  )


def _train(trainer, batch, plans):
  """Steps `trainer` on `batch` with `plans[i]` at step i (cases.RNGS and
  cases.LRS); returns the H2D and D2H bytes of each step."""
  moved = []
  transfers = trainer.placement.transfers
  for plan, rng, lr in zip(plans, cases.RNGS, cases.LRS):
    cases.set_plan(trainer, batch, plan)
    h2d, d2h = transfers.h2d_bytes, transfers.d2h_bytes
    trainer.one_step(batch, rng, learning_rate=lr)
    moved.append((transfers.h2d_bytes - h2d, transfers.d2h_bytes - d2h))
  return moved


def _params_bytes(trainer):
  return sum(trainer._store.params_bytes().values())  # pylint: disable=protected-access


@pytest.mark.parametrize('fused', [False, True])
def test_trains_as_the_default_trainer_and_copies_no_weights(fused):
  """Kept on the device for three steps (switched to the host and back
  between them where unfused): trax's default Trainer's weights and slots,
  and a step after the first copies none of them either way."""
  batch = cases.lm_batch()
  model, trainer = cases.lm_trainer(batch, device_memory_budget_bytes=None)
  if fused:
    plan = dataclasses.replace(
      cases.fused_plan(trainer, batch), params_on_device=True
    )
    plans = [plan] * 3
  else:
    plans = [
      _unfused(trainer, batch, True),
      _unfused(trainer, batch, True, prefetch=False, n_async_layers=0),
      _unfused(trainer, batch, True),
    ]
  moved = _train(trainer, batch, plans)
  ref_weights, ref_slots, _ = cases.lm_reference_3_steps()
  cases.assert_all_close(ref_weights, model.weights)
  cases.assert_all_close(ref_slots, trainer.slots)
  leaves = jax.tree_util.tree_leaves(model.weights)
  assert leaves and all(isinstance(x, jax.Array) for x in leaves)
  params = _params_bytes(trainer)
  # The first step places them; later ones move the batch and the states.
  assert moved[0][0] >= params
  for h2d, d2h in moved[1:]:
    assert h2d < params / 4 and d2h < params / 4, (moved, params)


def test_switching_to_the_host_and_back_trains_as_the_default_trainer():
  batch = cases.lm_batch()
  model, trainer = cases.lm_trainer(batch, device_memory_budget_bytes=None)
  moved = _train(
    trainer,
    batch,
    [
      _unfused(trainer, batch, True),
      _unfused(trainer, batch, False),
      _unfused(trainer, batch, True),
    ],
  )
  ref_weights, ref_slots, _ = cases.lm_reference_3_steps()
  cases.assert_all_close(ref_weights, model.weights)
  cases.assert_all_close(ref_slots, trainer.slots)
  params = _params_bytes(trainer)
  assert moved[1][1] >= params  # on the host: every update copied back


def test_micro_batches_train_as_the_default_trainer():
  batch = cases.lm_batch()
  model, trainer = cases.lm_trainer(batch, device_memory_budget_bytes=None)
  plan = _unfused(trainer, batch, True, micro_batches=2)
  _train(trainer, batch, [plan] * 3)
  ref_weights, ref_slots, _ = cases.lm_reference_3_steps()
  cases.assert_all_close(ref_weights, model.weights)
  cases.assert_all_close(ref_slots, trainer.slots)


def test_the_step_holds_every_other_layers_weights_and_slots():
  """Across each call, the weights and slots of every layer it does not
  take (or update) are held on the device; on the host the step holds
  them no more."""
  batch = cases.lm_batch()
  _, trainer = cases.lm_trainer(batch, device_memory_budget_bytes=None)
  p = trainer.planner
  leanest = p.candidates(p.step_types(batch)).leanest(1)
  on_device = cases.set_plan(
    trainer, batch, dataclasses.replace(leanest, params_on_device=True)
  )
  on_host = cases.set_plan(trainer, batch, leanest)
  params = trainer._store.params_bytes()  # pylint: disable=protected-access
  weights_bytes = {
    i: sum(x.nbytes for x in jax.tree_util.tree_leaves(layer.weights))
    for i, layer in enumerate(trainer.all_layers)
  }
  first = on_device.calls[0]
  assert first.phase == 'forward'
  (kept,) = [h for h in first.held if h.name == _KEPT]
  # Every layer's weights and slots are held; layer 0's weights are the
  # call's arguments too (counted once).
  assert kept.size_bytes == sum(params.values())
  assert kept.passed_bytes == weights_bytes[0] > 0
  assert on_device.peak_device_bytes > on_host.peak_device_bytes
  for call in on_host.calls:
    assert _KEPT not in {h.name for h in call.held if h.size_bytes}


def test_a_fused_step_holds_nothing_beside_its_arguments():
  batch = cases.lm_batch()
  _, trainer = cases.lm_trainer(batch, device_memory_budget_bytes=None)
  plan = dataclasses.replace(
    cases.fused_plan(trainer, batch), params_on_device=True
  )
  memory = cases.set_plan(trainer, batch, plan)
  (call,) = memory.calls
  (kept,) = [h for h in call.held if h.name == _KEPT]
  assert kept.passed_bytes == kept.size_bytes > 0


def test_the_speed_model_keeps_them_on_the_host_on_the_cpu():
  assert speed_rank.ranked_params_on_device('cpu', None, None) == [False]
  assert speed_rank.ranked_params_on_device('tpu', None, None) == [True, False]
  assert speed_rank.ranked_params_on_device('tpu', False, None) == [False]
  assert speed_rank.ranked_params_on_device('cpu', True, None) == [True]
  assert speed_rank.ranked_params_on_device('tpu', None, 'ties') == [False]


def test_candidates_list_each_plan_on_the_device_first_where_it_ranks_first(
  monkeypatch,
):
  monkeypatch.setitem(speed_rank.SPEED_PARAMS_ON_DEVICE, 'cpu', True)
  batch = cases.lm_batch()
  _, trainer = cases.lm_trainer(batch)
  p = trainer.planner
  groups = list(p.candidates(p.step_types(batch)).groups())
  for group in groups:
    flags = [plan.params_on_device for plan in group.plans]
    assert flags[0::2] == [True] * (len(flags) // 2)
    assert flags[1::2] == [False] * (len(flags) // 2)
    assert not group.leanest.params_on_device
  # With a budget and room, the planner runs the first: on the device.
  planned = trainer.planned(batch)
  assert planned.plan.params_on_device


def test_on_the_cpu_the_planner_keeps_them_on_the_host():
  batch = cases.lm_batch()
  _, trainer = cases.lm_trainer(batch)
  p = trainer.planner
  for group in p.candidates(p.step_types(batch)).groups():
    assert not any(plan.params_on_device for plan in group.plans)
  _, pinned = cases.lm_trainer(batch, params_on_device=True)
  assert pinned.planned(batch).plan.params_on_device


@pytest.mark.parametrize('value', ['yes', 1, None])
def test_a_setting_other_than_a_bool_or_auto_is_one_line(value):
  with pytest.raises(validation.TrainerOptionError, match='params_on_device'):
    cases.lm_trainer(cases.lm_batch(), params_on_device=value)


def test_pinned_on_the_device_where_they_cannot_stay_is_one_line():
  with pytest.raises(
    validation.TrainerOptionError, match="on_non_finite = 'skip'"
  ):
    cases.lm_trainer(
      cases.lm_batch(), params_on_device=True, on_non_finite='skip'
    )
  # Under 'skip', 'auto' keeps them on the host.
  batch = cases.lm_batch()
  _, trainer = cases.lm_trainer(batch, on_non_finite='skip')
  p = trainer.planner
  assert p._facts.params_on_device_refusal()  # pylint: disable=protected-access


def test_a_non_finite_loss_names_the_layers_given_up_and_stops_the_trainer():
  """Under 'raise', a step that kept them on the device and met a NaN
  says which layers' weights and slots its calls gave up; the next step
  is one line, not a read of deleted buffers."""
  batch = cases.lm_batch()
  first, revs, loss = reversible_lm_blocks()
  model_batch = batch
  import trax.layers as tl  # pylint: disable=g-import-not-at-top
  from trax import fastmath  # pylint: disable=g-import-not-at-top

  model = tl.Serial([first] + revs + [loss])
  model.init(model_batch, rng=fastmath.random.get_prng(12))
  trainer = rev_trainer.ReversibleSerialTrainer(
    [(first.sublayers, revs)],
    loss,
    optimizers.Adam,
    device_memory_budget_bytes=None,
    params_on_device=True,
    n_async_layers=8,
  )
  trainer.one_step(batch, cases.RNGS[0])
  # A NaN in the first layer's weights: every gradient norm turns NaN.
  weights = trainer.all_layers[0].weights
  leaves, treedef = jax.tree_util.tree_flatten(weights)
  leaves[0] = leaves[0] * np.nan
  trainer.all_layers[0].weights = jax.tree_util.tree_unflatten(treedef, leaves)
  with pytest.raises(validation.NonFiniteError) as raised:
    trainer.one_step(batch, cases.RNGS[1])
  assert 'given up' in str(raised.value)
  with pytest.raises(RuntimeError, match='cannot step again'):
    trainer.one_step(batch, cases.RNGS[2])


def test_on_two_devices_trains_as_the_default_trainer_and_copies_nothing():
  """On 2 forced CPU devices (a subprocess): fused, unfused and in
  micro-batches, trax's default Trainer's weights; after the
  first step no weight or slot crosses to or from the host, and the
  updates stay where the next call takes them (no copy between devices)."""
  result = run_multidevice_worker(2, 'params_on_device_main')
  for name in ('unfused', 'fused', 'micro'):
    run, on_host = result[f'{name}_device'], result[f'{name}_host']
    assert run['plan_on_device'] and not on_host['plan_on_device'], result
    assert run['max_diff_vs_default_1dev'] <= 1e-5, result
    assert run['device_arrays'] and run['stay_as_placed'], result
    params = run['params_bytes']
    assert run['moved'][0][0] >= params, result
    # Step 2 on the host copies every weight and slot to each device and
    # every update back; on the device none.
    (h2d, d2h), (host_h2d, host_d2h) = run['moved'][1], on_host['moved'][1]
    assert h2d + 2 * params <= host_h2d, result
    assert d2h + params <= host_d2h, result


def test_timed_plans_on_the_device_train_as_the_default_trainer(monkeypatch):
  """Timing plans that keep them on the device (on copies placed before
  the clock) changes nothing trained: the chosen plan keeps them there and
  three steps give trax's default Trainer's weights and slots."""
  monkeypatch.setitem(speed_rank.SPEED_PARAMS_ON_DEVICE, 'cpu', True)
  # Its twin on the host timed too (by default it is not: the test below).
  monkeypatch.setattr(plan_timing, 'slower_twin', lambda *_: False)
  batch = cases.lm_batch()
  model, trainer = cases.lm_trainer(batch, time_plans=3)
  timed = []
  real = trainer.planner.timer.seconds

  def seconds(planned, batch_, limit_seconds=None):
    timed.append(planned.plan.params_on_device)
    return real(planned, batch_, limit_seconds)

  monkeypatch.setattr(trainer.planner.timer, 'seconds', seconds)
  lines = []
  with notices.showing_progress(lines.append):
    for rng, lr in zip(cases.RNGS, cases.LRS):
      trainer.one_step(batch, rng, learning_rate=lr)
  assert True in timed and False in timed, timed
  # The lines tell each timed plan's twins apart.
  timed_lines = [
    line
    for line in lines
    if '  timed: ' in line and '  timed: chose ' not in line
  ]
  kept = [line for line in timed_lines if 'weights and slots kept on' in line]
  assert len(kept) == timed.count(True) and len(timed_lines) > len(kept)
  ref_weights, ref_slots, _ = cases.lm_reference_3_steps()
  cases.assert_all_close(ref_weights, model.weights)
  cases.assert_all_close(ref_slots, trainer.slots)


def test_a_plan_on_the_device_is_not_timed_against_its_twin_on_the_host(
  monkeypatch,
):
  """Where the speed model's first plan keeps weights and slots on the
  device, its twin that runs the same programs with them on the host
  (copying them both ways besides) is not timed: it cannot be faster."""
  monkeypatch.setitem(speed_rank.SPEED_PARAMS_ON_DEVICE, 'cpu', True)
  batch = cases.lm_batch()
  _, trainer = cases.lm_trainer(batch, time_plans=3)
  timed = []
  monkeypatch.setattr(
    trainer.planner.timer,
    'seconds',
    lambda planned, *_: timed.append(planned.plan) or 1.0,
  )
  lines = []
  with notices.showing_progress(lines.append):
    plan = trainer.planned(batch).plan
  assert plan.params_on_device
  # The twin is the only other plan on programs compiled already: none is
  # timed.
  assert not timed
  assert not [line for line in lines if '  timed: ' in line]
