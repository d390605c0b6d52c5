"""What planning costs, as the planner records it and says it while it
plans: lines as it weighs plans, true of what the search did, the programs
it compiles, and a cost that does not grow with the model's depth.

References: the candidates' own programs (a plan walked on types lists
the programs its step calls), the same model at another depth, and the
search's own record (the plans weighed, with their figures, and the
candidates' groups and families).
"""

import functools
import re
import types

import pytest
from trax import fastmath
from trax import layers as tl
from trax import optimizers

from conftest import reversible_lm_blocks
import trainer_cases as cases
from trax_revplus import notices
from trax_revplus import trainer as rev_trainer
from trax_revplus.byte_sizes import format_bytes
from trax_revplus.device_memory import programs as programs_lib
from trax_revplus.trainer._plan import plan as plan_lib
from trax_revplus.trainer._search import families
from trax_revplus.trainer._search import planning_log

pytestmark = pytest.mark.usefixtures('stock_trax')

_BATCH = cases.lm_batch()


def _deep_trainer(n_blocks, **kwargs):
  """Ours on `n_blocks` equal pairs of reversible half-residuals (the
  conftest's LM, repeated), Adam."""
  first, revs, loss = reversible_lm_blocks()
  for _ in range(n_blocks - 1):
    revs += reversible_lm_blocks()[1]  # Fresh layers of the same kinds.
  model = tl.Serial([first] + revs + [loss])
  model.init(_BATCH, rng=fastmath.random.get_prng(12))
  return rev_trainer.ReversibleSerialTrainer(
    [(first.sublayers, revs)], loss, optimizers.Adam, **kwargs
  )


def _leanest_peak(n_blocks):
  """Peak of the leanest plan of the most slices (one layer per call)."""
  trainer = _deep_trainer(n_blocks, device_memory_budget_bytes=None)
  p = trainer.planner
  types = p.step_types(_BATCH)
  candidates = p.candidates(types)
  plan = candidates.leanest(max(candidates.slices))
  return p.weigh(plan, types).peak_device_bytes


@pytest.mark.parametrize('tight', [False, True])
def test_planning_compiles_as_much_at_any_depth(tight):
  """A stack four times as deep compiles as many programs while planning,
  under a budget with room for every plan, or one only the leanest fits:
  equal layers share programs, and what rules plans out is known from
  them."""
  compiled = {}
  for n_blocks in (2, 8):
    budget = _leanest_peak(n_blocks) if tight else 2**40
    trainer = _deep_trainer(
      n_blocks, device_memory_budget_bytes=budget, segment_max_layers=1
    )
    trainer.planned(_BATCH)
    [cost] = trainer.planning_costs
    compiled[n_blocks] = cost.programs_compiled
  assert compiled[8] == compiled[2]


def test_planning_says_what_it_does_and_what_it_cost():
  """A line as each plan's programs start compiling and once weighed, the
  seconds since planning began on each, then one line for the plan chosen;
  the cost's figures add up."""
  lines = []
  _, trainer = cases.lm_trainer(_BATCH, device_memory_budget_bytes=2**40)
  with notices.showing_progress(lines.append):
    trainer.planned(_BATCH)
  [cost] = trainer.planning_costs
  assert lines[0].startswith('planning: ')
  assert 'compiling 1 program' in lines[0]
  assert 'per device' in lines[1] and lines[1].startswith('planning: ')
  assert lines[-1].startswith(f'planned in {cost.seconds:.1f} s: ')
  assert cost.plan in lines[-1]
  # Room for the fastest plan: its programs alone compile.
  assert cost.programs_compiled == cost.plan_programs == 1
  assert 0 < cost.plan_compile_seconds <= cost.seconds
  assert cost.search_seconds == pytest.approx(
    cost.seconds - cost.plan_compile_seconds
  )
  assert set(cost.to_json()) >= {
    'seconds',
    'programs_compiled',
    'plan_programs',
    'plan_compile_seconds',
    'search_seconds',
    'plan',
  }
  # Planned once per batch's shapes: no second cost, no line.
  del lines[:]
  with notices.showing_progress(lines.append):
    trainer.planned(_BATCH)
  assert not lines and len(trainer.planning_costs) == 1


# What a line says of a plan (or group) it names first: tried (compiled,
# probed or weighed) unless it says it is ruled out.
_LINE = re.compile(r'^planning: \d+\.\d s  (?P<head>.*?): (?P<rest>.*)$')
_LIKE = ' (and its like with more batch slices or micro-batches)'
_LEAST = re.compile(
  r'^planning: \d+\.\d s  no plan fits: searching for the least plan$'
)


def _size(nbytes):
  return format_bytes(nbytes, unit=None)


def _dimensions(leanest):
  """The words of an unfused group's plans' shared dimensions, read from
  its leanest plan's `short` ('segments of 1, <these>, n_async_layers=0,
  ...')."""
  return (
    planning_log.short(leanest).split(', n_async_layers=')[0].split(', ', 1)[1]
  )


def _claimed(head, groups):
  """The candidate plans a 'ruled out' line whose head (before ': ruled
  out') is `head` says are ruled out: one plan (`short`), an unfused
  group's plans ('plans in segments with ...'), or where it claims its
  like with more slices or parts too, those of its family's groups with as
  many or more."""
  like = head.endswith(_LIKE)
  head = head.removesuffix(_LIKE)
  for group in groups:
    if head == planning_log.short(group.leanest) and like:
      key, value = families.family(group)
      return {
        plan
        for other in groups
        if families.family(other)[0] == key
        and families.family(other)[1] >= value
        for plan in other.plans
      }
    if head == f'plans in segments with {_dimensions(group.leanest)}' and (
      not group.fused_reversible_layers
    ):
      return set(group.plans)
    for plan in group.plans:
      if head == planning_log.short(plan):
        return {plan}
  raise AssertionError(f'the line names no candidate plan or group: {head}')


# Budgets from the fused plans' peaks (slices -> bytes, weighed without a
# budget) on the LM of 8 rows (slices 1, 2, 4, 8).
_BUDGETS = {
  # Between the fused plans of 8 slices (fits) and 4 (does not): those of
  # 1 and 2 slices are ruled out first, by bounds or a probe.
  'one_fits': lambda peaks: (peaks[4] + peaks[8]) // 2,
  # Below the least plan: every group is weighed or ruled out, then the
  # least is searched for.
  'none_fits': lambda peaks: peaks[8] * 2 // 5,
}


@functools.lru_cache(maxsize=None)
def _planned(budget_name):
  """The planning of the dropout-free LM of 8 rows under the budget
  `_BUDGETS[budget_name]`: a namespace of its budget, lines, absl's log
  lines, the error where nothing fits, the candidates' groups, the plans
  weighed (the search's record, `weighed_plans.Weighed`) and the planning
  costs. Once per budget: the tests read it."""
  batch = cases.lm_batch(rows=8)
  _, unbudgeted = cases.lm_trainer(batch, device_memory_budget_bytes=None)
  p = unbudgeted.planner
  peaks = {
    k: p.weigh(
      cases.fused_plan(unbudgeted, batch, k), p.step_types(batch)
    ).peak_device_bytes
    for k in (4, 8)
  }
  budget = _BUDGETS[budget_name](peaks)
  _, trainer = cases.lm_trainer(batch, device_memory_budget_bytes=budget)
  lines, logged = [], []
  info = lambda message, *args: logged.append(message % args)
  error = None
  with pytest.MonkeyPatch.context() as m:
    m.setattr(planning_log, 'logging', types.SimpleNamespace(info=info))
    with notices.showing_progress(lines.append):
      try:
        trainer.planned(batch)
      except rev_trainer.DeviceMemoryBudgetError as e:
        error = e
  p = trainer.planner
  return types.SimpleNamespace(
    budget=budget,
    lines=lines,
    logged=logged,
    error=error,
    groups=list(p.candidates(p.step_types(batch)).groups()),
    weighed=p.weighing(batch).weighed,
    costs=trainer.planning_costs,
  )


@pytest.mark.parametrize('budget_name', list(_BUDGETS))
def test_no_plan_is_tried_after_a_line_rules_it_out(budget_name):
  """A plan or group a line says is ruled out is not compiled, probed or
  weighed later by the same search: a bound rules out its own group, not
  those with more slices or micro-batches (which may need less, and are
  tried). The search for the least plan, where none fits, is a search of
  its own: it weighs plans whatever the budget."""
  planned = _planned(budget_name)
  assert (planned.error is None) == (budget_name == 'one_fits')
  lines = planned.lines
  starts = [i for i, line in enumerate(lines) if _LEAST.match(line)]
  searches = [lines[: starts[0]], lines[starts[0] + 1 :]] if starts else [lines]
  tried_after = []
  for searched in searches:
    said = [_LINE.match(line) for line in searched]
    for i, match in enumerate(said):
      if match is None or not match['rest'].startswith('ruled out'):
        continue
      claimed = _claimed(match['head'], planned.groups)
      for later in said[i + 1 :]:
        if later is None or later['rest'].startswith('ruled out'):
          continue
        if _claimed(later['head'], planned.groups) & claimed:
          tried_after.append((match.string, later.string))
  assert not tried_after, 'tried after a line said it was ruled out'


@pytest.mark.parametrize('budget_name', list(_BUDGETS))
def test_every_plan_weighed_over_the_budget_is_said_ruled_out(budget_name):
  """Each plan the search weighed over the budget (its record) is said to
  be ruled out, with its bytes and the budget: in a line where its own
  programs compiled, else in absl's log. None within the budget is."""
  planned = _planned(budget_name)
  budget, said = planned.budget, planned.lines + planned.logged
  over = [
    w
    for w in planned.weighed
    if w.memory is not None and w.memory.peak_device_bytes > budget
  ]
  assert over  # the budget rules out a plan it weighs
  for w in planned.weighed:
    if w.memory is None:
      continue
    figures = f'{_size(w.memory.peak_device_bytes)} per device'
    saying = [
      text
      for text in said
      if f'{planning_log.short(w.plan)}: ' in text and figures in text
    ]
    is_over = w in over
    if is_over:
      assert saying, f'not said: {planning_log.short(w.plan)}: {figures}'
    for text in saying:
      assert ('ruled out' in text) == is_over, text
      assert (f'over the budget of {_size(budget)}' in text) == is_over, text


def test_lines_name_the_budget_given_and_the_least_search():
  """Where no plan fits, a line says the search for the least plan begins;
  a line ruling a plan out by the budget names the budget given, and one
  of the least search by the least plan found."""
  planned = _planned('none_fits')
  assert planned.error is not None
  said = planned.lines + planned.logged
  for text in said:
    for named in re.findall(r'over the budget of (\S+ \S+)', text):
      assert named == _size(planned.budget), text
  starts = [i for i, line in enumerate(planned.lines) if _LEAST.match(line)]
  assert len(starts) == 1, planned.lines
  assert not any(
    'more than the least plan found' in line
    for line in planned.lines[: starts[0]]
  )


def test_the_final_line_names_its_counts_nouns():
  """'planned in ...' ends '<n> programs compiled, <s> s of it tracing and
  compiling the chosen plan's <m> program(s)', as the cost counts them."""
  planned = _planned('one_fits')
  [cost] = planned.costs
  last = planned.lines[-1]
  assert last.startswith('planned in '), last
  n, m = cost.programs_compiled, cost.plan_programs
  assert re.search(
    rf'; {n} program{"s" * (n != 1)} compiled, \d+\.\d s of it tracing '
    rf"and compiling the chosen plan's {m} program{'s' * (m != 1)}$",
    last,
  ), last


def _small_plan(batch_slices):
  return plan_lib.make_plan(
    [4],
    {i: 1 for i in range(6)},
    [0],
    segment_max_layers=1,
    segment_max_bytes=100,
    backward_segment_max_layers=1,
    batch_slices=batch_slices,
  )


def test_a_plan_s_figures_say_which_budget_rules_it_out():
  """A plan weighed over the device budget, the host budget or both says
  it is ruled out, naming the budgets it exceeds; one within both gives
  its figures alone; in the search for the least plan (whose budgets rule
  nothing out) no plan is ruled out by them. One weighed from programs
  compiled for another plan goes to absl's log."""
  lines, logged = [], []
  log = planning_log.PlanningLog(
    programs_lib.Programs(), budget_bytes=2048, host_budget_bytes=4096
  )

  def weighed(plan, device, host, own_programs=True):
    if own_programs:
      log.compiling(plan, [object()])
    log.weighed(
      plan,
      types.SimpleNamespace(peak_device_bytes=device, peak_host_bytes=host),
    )

  info = lambda message, *args: logged.append(message % args)
  with (
    pytest.MonkeyPatch.context() as m,
    notices.showing_progress(lines.append),
  ):
    m.setattr(planning_log, 'logging', types.SimpleNamespace(info=info))
    log.begin()
    weighed(_small_plan(1), 2048, 4096)
    weighed(_small_plan(2), 3072, 4096)
    weighed(_small_plan(4), 2048, 5120)
    weighed(_small_plan(1), 3072, 5120)
    weighed(_small_plan(8), 3072, 1024, own_programs=False)
    log.begin('least plan', 'more than the least plan found,')
    weighed(_small_plan(4), 3072, 5120)
  said = [line.split('  ', 1)[1] for line in lines if '  ' in line]
  short = planning_log.short
  assert [line.split(': ', 1)[1] for line in said if ' per device' in line] == [
    '2.0 KiB per device, 4.0 KiB host',
    'ruled out, 3.0 KiB per device, 4.0 KiB host, over the budget of 2.0 KiB',
    'ruled out, 2.0 KiB per device, 5.0 KiB host, over the host budget of '
    '4.0 KiB',
    'ruled out, 3.0 KiB per device, 5.0 KiB host, over the budget of 2.0 KiB '
    'and the host budget of 4.0 KiB',
    '3.0 KiB per device, 5.0 KiB host',
  ]
  assert logged == [
    f'planning: {short(_small_plan(8))}: ruled out, 3.0 KiB per device, 1.0 '
    'KiB host, over the budget of 2.0 KiB'
  ]
