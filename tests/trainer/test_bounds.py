"""What the planner knows of a plan before compiling it (`bounds`): its
lower bounds hold, and the search that leans on them finds what an
exhaustive one finds, compiling less.

References: XLA's memory analysis of every candidate plan's programs,
compiled and composed by a trainer of their own (an exhaustive weighing,
in the candidates' order), and the candidates' order itself.
"""

import functools

import pytest
from trax import optimizers

import trainer_cases as cases
from trax_revplus import notices
from trax_revplus import trainer as rev_trainer
from trax_revplus.trainer._search import bounds as bounds_lib

pytestmark = pytest.mark.usefixtures('stock_trax')

# Long enough that a call's activations outweigh its weights: the slicing
# and the fused program change what the step needs.
_LENGTH = 64


def _batch():
  return cases.self_attention_lm_batch(_LENGTH)


# Settings that keep the candidates few enough to weigh them all (the
# slicing, the fused program and the segments stay the planner's).
_PINNED = dict(
  n_async_layers=1, parallel_heads=4, sequence_chunks=1, micro_batches=1
)


def _trainer(**kwargs):
  blocks, loss = cases.self_attention_lm_blocks(0.0, _LENGTH)
  return rev_trainer.ReversibleSerialTrainer(
    blocks, loss, optimizers.Adam, **_PINNED, **kwargs
  )


@functools.lru_cache(maxsize=1)
def _exhaustive():
  """[(plan, peak device bytes)] of every candidate plan, in the speed
  model's order, each weighed whole by one trainer."""
  trainer = _trainer(device_memory_budget_bytes=None)
  p = trainer.planner
  types = p.step_types(_batch())
  return [
    (plan, p.weigh(plan, types).peak_device_bytes)
    for group in p.candidates(types).groups()
    for plan in group.plans
  ]


def _peak_of():
  return dict(_exhaustive())


def _leanest(fused, slices, trainer=None):
  """The candidates' leanest plan, fused or not, of `slices` batch slices
  (one pass, no chunks: `_PINNED`)."""
  trainer = trainer or _trainer(device_memory_budget_bytes=None)
  p = trainer.planner
  return next(
    g.leanest
    for g in p.candidates(p.step_types(_batch())).groups()
    if bool(g.fused_reversible_layers) == fused
    and g.leanest.batch_slices == slices
  )


@pytest.mark.parametrize('slices', [1, 2, 4])
def test_the_fused_bound_holds_before_anything_compiles(slices):
  """Every layer's residuals bound the fused program (`bounds`), and the
  bound counts them (it is more than the program's weights and batch)."""
  trainer = _trainer(device_memory_budget_bytes=None)
  p = trainer.planner
  types = p.step_types(_batch())
  plan = _leanest(True, slices, trainer)
  lower = p.bounds(types).lower(plan).device
  assert not p.weighing_of(types).weighed  # nothing compiled for it
  params = sum(p._store.params_bytes().values())  # pylint: disable=protected-access
  assert params < lower <= _peak_of()[plan]


@pytest.mark.parametrize('fewer, more', [(1, 2), (1, 4), (2, 4)])
def test_the_rows_rule_bounds_more_slices_from_fewer(fewer, more):
  """A plan weighed at some slicing bounds the same plan at more slices,
  untraced (each call's temporaries at 1/m of its rows are at least 1/m of
  them); the bound is below the plan's own figure."""
  trainer = _trainer(device_memory_budget_bytes=None)
  p = trainer.planner
  types = p.step_types(_batch())
  compiled = _leanest(False, fewer, trainer)
  plan = _leanest(False, more, trainer)
  bounds = p.bounds(types)
  assert bounds.lower(plan).device == 0  # nothing known yet
  p.weigh(compiled, types)
  lower = bounds.lower(plan).device
  assert p.weighing_of(types).memory_of(plan) is None  # still uncompiled
  assert 0 < lower <= _peak_of()[plan]


def test_a_probe_rules_out_a_plan_that_does_not_fit():
  """Settling a plan that needs twice the budget tells so, its bytes over
  the budget; what it compiled on the way is at most its own programs."""
  peaks = _peak_of()
  plan = _leanest(False, 1)
  budget = peaks[plan] // 2
  trainer = _trainer(device_memory_budget_bytes=None)
  p = trainer.planner
  types = p.step_types(_batch())
  settled = p.settle(plan, types, budget)
  assert isinstance(settled, int) and budget < settled <= peaks[plan]
  compiled = len(p._programs.compile_spans)  # pylint: disable=protected-access
  assert 1 <= compiled <= len(p.walk(plan, types).calls.keys())


def _budgets():
  """The least peak, one byte under the fastest plan's, and the peaks of
  the fastest plans of the groups between: budgets whose answers lie in
  each kind of group."""
  exhaustive = _exhaustive()
  peaks = [peak for _, peak in exhaustive]
  fastest = exhaustive[0][1]
  trainer = _trainer(device_memory_budget_bytes=None)
  p = trainer.planner
  firsts = {g.plans[0] for g in p.candidates(p.step_types(_batch())).groups()}
  return sorted(
    {min(peaks), fastest - 1}
    | {peak for plan, peak in exhaustive if plan in firsts and peak < fastest}
  )


def test_the_search_finds_what_an_exhaustive_search_finds():
  """Under each budget the planner runs the first plan, in the speed
  model's order, whose peak fits, and compiles fewer programs than
  weighing every plan."""
  exhaustive = _exhaustive()
  total_programs = None
  for budget in _budgets():
    expected = next((plan for plan, peak in exhaustive if peak <= budget), None)
    assert expected is not None
    trainer = _trainer(device_memory_budget_bytes=budget)
    lines = []
    with notices.showing_progress(lines.append):
      planned = trainer.planned(_batch())
    assert planned.plan == expected, budget
    assert planned.memory.peak_device_bytes <= budget
    cost = trainer.planning_costs[-1]
    if total_programs is None:
      reference = _trainer(device_memory_budget_bytes=None).planner
      types = reference.step_types(_batch())
      total_programs = len(
        {
          key
          for plan, _ in exhaustive
          for key in reference.walk(plan, types).calls.keys()
        }
      )
    assert cost.plan_programs <= cost.programs_compiled < total_programs
    assert lines[-1].startswith('planned in ')


def test_the_least_is_what_an_exhaustive_search_finds():
  """The least plan (`least_device_memory_of`) needs what the least of the
  exhaustive weighing needs."""
  least = min(peak for _, peak in _exhaustive())
  trainer = _trainer(device_memory_budget_bytes=None)
  _, memory = trainer.least_device_memory_of(_batch())
  assert memory.peak_device_bytes == least


def test_bounds_never_exceed_what_a_plan_needs():
  """After the search under a tight budget, every plan's lower bound (from
  what it compiled) is at most the plan's own figure."""
  peaks = _peak_of()
  budget = min(peaks.values())
  trainer = _trainer(device_memory_budget_bytes=budget)
  trainer.planned(_batch())
  p = trainer.planner
  bounds = p.bounds(p.step_types(_batch()))
  checked = 0
  for plan, peak in peaks.items():
    lower = bounds.lower(plan).device
    assert lower <= peak, plan
    checked += lower > 0
  assert checked > 1


def test_the_fused_facts_count_every_layer():
  trainer = _trainer(device_memory_budget_bytes=None)
  p = trainer.planner
  types = p.step_types(_batch())
  trace = p._facts.trace(types)[0]  # pylint: disable=protected-access
  assert trace.residual_bytes is not None
  assert len(trace.residual_bytes) == len(trainer.all_layers)
  assert bounds_lib.FUSED_RESIDUAL_SHARE <= 1
