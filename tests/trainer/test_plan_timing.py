"""Plans timed on the device under a budget (`time_plans`): the fastest
measured of the first plans that fit runs, a plan whose run fails counts as
not fitting, and timing changes nothing a run trains.

References: the candidates' own order (the plans that fit under a budget
with room for every plan are the first candidates), an injected timing
(each plan's runs given seconds, the speed model's first slowest), and the
same plan run by a trainer that times nothing.
"""

import json

import gin
import jax
import numpy as np
import pytest

import trainer_cases as cases
from trax_revplus import notices
from trax_revplus import trainer as rev_trainer
from trax_revplus import validation
from trax_revplus.trainer import TrainerOptions
from trax_revplus.trainer._search import plan_search
from trax_revplus.trainer._search import plan_timing
from trax_revplus.trainer._search import planning_log

pytestmark = pytest.mark.usefixtures('stock_trax')

_BATCH = cases.lm_batch()
# Room for every plan: the plans that fit are the candidates, in order.
_ROOM = 2**40
# One layer per call: the first candidate group's plans (copy-back depths,
# prefetch, where saved inputs wait) all run on the same programs, the
# plans timing may time (it compiles nothing).
_ONE_LAYER = {'segment_max_layers': 1}


def _first_plans(trainer, n):
  """The speed model's first `n` candidate plans of `trainer` on
  `_BATCH`: its first group's."""
  p = trainer.planner
  plans = next(iter(p.candidates(p.step_types(_BATCH)).groups())).plans
  assert len(plans) >= n
  return list(plans[:n])


def _injected(monkeypatch, seconds_of):
  """`PlanTimer._run` replaced: plan -> its runs' seconds from
  `seconds_of(plan, run)` (run 0 the warm-up), or the error it raises.
  Returns the (plan, run) of each run, in order."""
  runs = []

  def run(self, planned, batch):
    del self, batch
    k = sum(1 for plan, _ in runs if plan == planned.plan)
    runs.append((planned.plan, k))
    outcome = seconds_of(planned.plan, k)
    if isinstance(outcome, Exception):
      raise outcome
    return outcome

  monkeypatch.setattr(plan_timing.PlanTimer, '_run', run)
  return runs


def _planned_lines(trainer, batch=_BATCH):
  lines = []
  with notices.showing_progress(lines.append):
    trainer.planned(batch)
  return lines


def _timed_lines(lines):
  return [line.split('  ', 1)[1] for line in lines if '  timed: ' in line]


def test_the_fastest_measured_plan_runs(monkeypatch, tmp_path):
  """The speed model's first plan measured slowest, its third fastest: the
  third runs; one line per plan timed (the median of its timed runs, the
  warm-up left out) and one naming the choice; `estimate`'s table shows
  each one's step time. A second run of the config reads the plan back and
  times nothing."""
  monkeypatch.setattr(plan_timing, 'MIN_LIMIT_SECONDS', 1e9)
  _, trainer = cases.lm_trainer(
    _BATCH,
    device_memory_budget_bytes=_ROOM,
    time_plans=3,
    output_dir=str(tmp_path),
    **_ONE_LAYER,
  )
  first, second, third = _first_plans(trainer, 3)
  base = {first: 3.0, second: 2.0, third: 1.0}
  # Warm-up 50 s (ignored), then base and base + 0.2: median base + 0.1.
  runs = _injected(
    monkeypatch,
    lambda plan, k: 50.0 if k == 0 else base[plan] + 0.2 * (k - 1),
  )
  lines = _planned_lines(trainer)
  assert trainer.planned(_BATCH).plan == third
  assert runs == [
    (plan, k) for plan in (first, second, third) for k in (0, 1, 2)
  ]
  short = planning_log.short
  assert _timed_lines(lines) == [
    f'timed: {short(first)}: 3.100 s a step (median of 2)',
    f'timed: {short(second)}: 2.100 s a step (median of 2)',
    f'timed: {short(third)}: 1.100 s a step (median of 2)',
    f'timed: chose {short(third)}: 1.100 s a step, the fastest of 3 plans '
    f'timed',
  ]
  assert lines[-1].startswith('planned in ') and short(third) in lines[-1]
  weighing = trainer.planner.weighing(_BATCH)
  seconds = {w.plan: w.step_seconds for w in weighing.weighed}
  assert seconds == {first: 3.1, second: 2.1, third: 1.1}
  table = weighing.lines()
  assert [row.split()[0] == '*' for row in table[1:]] == [False, False, True]
  assert ['3.100s' in table[1], '2.100s' in table[2], '1.100s' in table[3]] == [
    True
  ] * 3
  assert [entry['step_seconds'] for entry in weighing.to_json()] == [
    3.1,
    2.1,
    1.1,
  ]
  # The plan kept is read back: nothing timed again.
  del runs[:]
  _, again = cases.lm_trainer(
    _BATCH,
    device_memory_budget_bytes=_ROOM,
    time_plans=3,
    output_dir=str(tmp_path),
    **_ONE_LAYER,
  )
  lines = _planned_lines(again)
  assert again.planned(_BATCH).plan == third
  assert not runs and not _timed_lines(lines)
  assert '(the plan kept in ' in lines[-1]
  # Its step time comes back with it: `estimate` shows it.
  (row,) = again.planner.weighing(_BATCH).lines()[1:]
  assert row.split()[0] == '*' and '1.100s' in row


def test_a_plan_whose_run_fails_counts_as_not_fitting(monkeypatch):
  """The first plan's run fails on the device (out of memory at run time):
  one line names it and why, it does not fit, its device buffers are
  released, and the next plans are timed: the fastest of them runs."""
  monkeypatch.setattr(plan_timing, 'MIN_LIMIT_SECONDS', 1e9)
  _, trainer = cases.lm_trainer(
    _BATCH, device_memory_budget_bytes=_ROOM, time_plans=3, **_ONE_LAYER
  )
  plans = _first_plans(trainer, 4)
  error = (
    'RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1234 bytes.'
  )
  base = {plans[1]: 2.0, plans[2]: 1.0, plans[3]: 3.0}

  def seconds_of(plan, k):
    del k
    if plan == plans[0]:
      return jax.errors.JaxRuntimeError(error)
    return base[plan]

  runs = _injected(monkeypatch, seconds_of)
  freed = []
  placement = trainer.placement
  free = placement.free_device_buffers
  monkeypatch.setattr(
    placement,
    'free_device_buffers',
    lambda keep: freed.append(len(runs)) or free(keep),
  )
  lines = _planned_lines(trainer)
  assert trainer.planned(_BATCH).plan == plans[2]
  short = planning_log.short
  assert _timed_lines(lines) == [
    f'timed: {short(plans[0])}: failed on the device, so it counts as not '
    f'fitting: {error}',
    f'timed: {short(plans[1])}: 2.000 s a step (median of 2)',
    f'timed: {short(plans[2])}: 1.000 s a step (median of 2)',
    f'timed: {short(plans[3])}: 3.000 s a step (median of 2)',
    f'timed: chose {short(plans[2])}: 1.000 s a step, the fastest of 3 '
    f'plans timed',
  ]
  # Released after each plan's runs: the failed one's (its one run) first.
  assert freed == [1, 4, 7, 10]
  weighing = trainer.planner.weighing(_BATCH)
  [failed] = [w for w in weighing.weighed if w.plan == plans[0]]
  assert (failed.fits, failed.run_failed, failed.step_seconds) == (
    False,
    error,
    None,
  )
  [row] = [r for r in weighing.lines()[1:] if ' failed ' in r]
  assert ' no ' in row
  [entry] = [e for e in weighing.to_json() if 'run_failed' in e]
  assert entry['run_failed'] == error and entry['fits'] is False


def _state(trainer):
  """Host copies of every layer's weights and state and every slot."""
  store = trainer._store  # pylint: disable=protected-access
  return jax.tree_util.tree_map(
    np.array,
    (
      [layer.weights for layer in store.layers],
      [layer.state for layer in store.layers],
      [opt.slots for opt in store.optimizers],
    ),
  )


def _records(output_dir):
  with open(output_dir / 'memory.jsonl', encoding='utf-8') as f:
    return [json.loads(line) for line in f if line.strip()]


def test_timing_changes_nothing_trained(monkeypatch, tmp_path):
  """Each plan's timing runs (real ones, inside the first step) leave every
  weight, slot and state as it was; 2 steps then give the losses, weights,
  slots and states of a trainer that times nothing and runs the same plan,
  bit for bit, and the memory log records the same phases and transfers."""
  _, timing = cases.lm_trainer(
    _BATCH,
    device_memory_budget_bytes=_ROOM,
    time_plans=3,
    output_dir=str(tmp_path / 'timed'),
    **_ONE_LAYER,
  )
  seconds = plan_timing.PlanTimer.seconds
  timed = []

  def unchanged(self, planned, batch, limit_seconds=None):
    before = _state(timing)
    result = seconds(self, planned, batch, limit_seconds)
    cases.assert_all_close(before, _state(timing), tol=0)
    timed.append(planned.plan)
    return result

  monkeypatch.setattr(plan_timing.PlanTimer, 'seconds', unchanged)
  lines = []
  with notices.showing_progress(lines.append):
    losses = cases.train(timing, _BATCH, 2)
  assert timed == _first_plans(timing, 3)
  assert len(_timed_lines(lines)) == 4  # 3 plans timed, the choice
  chosen = timing.planned(_BATCH).plan

  def chosen_only(self, budget_bytes, host_budget_bytes=None):
    del self, budget_bytes, host_budget_bytes
    yield chosen

  monkeypatch.setattr(plan_search.PlanSearch, 'fitting', chosen_only)
  _, untimed = cases.lm_trainer(
    _BATCH,
    device_memory_budget_bytes=_ROOM,
    time_plans=0,
    output_dir=str(tmp_path / 'untimed'),
    **_ONE_LAYER,
  )
  untimed_losses = cases.train(untimed, _BATCH, 2)
  assert untimed.planned(_BATCH).plan == chosen
  cases.assert_all_close(losses, untimed_losses, tol=0)
  cases.assert_all_close(_state(untimed), _state(timing), tol=0)
  timing.memory_log.close()
  untimed.memory_log.close()

  def phases(records):
    return [
      (r['step'], r['phase'], r.get('h2d_bytes'), r.get('d2h_bytes'))
      for r in records
      if r['phase'] in ('forward', 'loss', 'backward', 'free', 'step')
    ]

  timed_phases = phases(_records(tmp_path / 'timed'))
  assert timed_phases  # the steps were recorded
  assert timed_phases == phases(_records(tmp_path / 'untimed'))


def test_auto_times_nothing_on_the_cpu_and_bad_values_are_one_line(
  monkeypatch,
):
  """'auto' is 3 plans on an accelerator, none on the CPU; 0 or 1 plan,
  or no budget, times nothing; the setting is gin's as the others are."""
  assert plan_timing.plans_to_time('auto', 'cpu') == 0
  assert plan_timing.plans_to_time('auto', 'tpu') == 3
  assert plan_timing.plans_to_time('auto', 'gpu') == 3
  assert plan_timing.plans_to_time(2, 'cpu') == 2

  def never(*unused):
    raise AssertionError('a plan was timed')

  monkeypatch.setattr(plan_timing.PlanTimer, 'seconds', never)
  for settings in (
    {'device_memory_budget_bytes': _ROOM},  # time_plans='auto', on the CPU
    {'device_memory_budget_bytes': _ROOM, 'time_plans': 1},
    {'device_memory_budget_bytes': None, 'time_plans': 3},
  ):
    _, trainer = cases.lm_trainer(_BATCH, **settings)
    assert not _timed_lines(_planned_lines(trainer))
  assert TrainerOptions().time_plans == 'auto'
  for value in ('fast', -1, 2.0, True):
    with pytest.raises(validation.TrainerOptionError) as info:
      TrainerOptions(time_plans=value)
    assert str(info.value) == (
      'trax_revplus.ReversibleSerialTrainer.time_plans: time_plans must be '
      f"'auto' or an int >= 0 (0: none), got {value!r}."
    )
  gin.parse_config('trax_revplus.ReversibleSerialTrainer.time_plans = 2')
  assert rev_trainer.validate_gin_bindings().time_plans == 2


def test_plans_are_not_timed_where_timing_would_outlast_their_compile(
  monkeypatch,
):
  """A first run so long that timing the plans would take longer than
  compiling their programs (at least `MIN_LIMIT_SECONDS`): one line, no
  more runs, and the speed model's first plan runs."""
  _, trainer = cases.lm_trainer(
    _BATCH, device_memory_budget_bytes=_ROOM, time_plans=3, **_ONE_LAYER
  )
  plans = _first_plans(trainer, 3)
  runs = _injected(monkeypatch, lambda plan, k: 100.0)
  lines = _planned_lines(trainer)
  assert trainer.planned(_BATCH).plan == plans[0]
  assert runs == [(plans[0], 0)]
  assert _timed_lines(lines) == [
    'timed: none of 3 plans: a run takes 100.0 s, so timing them would '
    'take more than 10 s (compiling their programs took that); the speed '
    "model's first runs"
  ]
  weighing = trainer.planner.weighing(_BATCH)
  assert all(w.step_seconds is None for w in weighing.weighed)


def test_timing_compiles_nothing_beyond_the_first_plan(monkeypatch):
  """Only plans whose programs the search compiled already are timed: on
  the CPU the first plan (the whole model in one program, 2 batch slices)
  has no such neighbour, so nothing is timed and nothing more compiles."""
  _, timing = cases.lm_trainer(
    _BATCH, device_memory_budget_bytes=_ROOM, time_plans=3
  )
  runs = _injected(monkeypatch, lambda plan, k: 1.0)
  compiles = cases.count_compiles()
  timing_plan = timing.planned(_BATCH).plan
  timing_compiles = len(compiles)
  _, untimed = cases.lm_trainer(
    _BATCH, device_memory_budget_bytes=_ROOM, time_plans=0
  )
  start = len(compiles)
  assert untimed.planned(_BATCH).plan == timing_plan
  assert not runs
  assert timing_compiles == len(compiles) - start
