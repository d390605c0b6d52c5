"""What planning a step does while the person waits, and what it cost.

Before the first step on a batch's shapes the planner weighs candidate
plans, compiling programs that can take minutes at the sizes users run.
`PlanningLog` says so as it happens, one line per plan it compiles for,
probes or rules out, with the seconds since planning began
(`notices.progress`: `trax-revplus train` and `estimate` print them; from
Python they go to absl's log). Each line is true of what the search
did: a plan weighed over the budget says it is ruled out, with its bytes
and the budget; a bound rules out one group of plans (a group with more
batch slices may need less, and is tried); a plan tried later was never
said to be ruled out. The main job (`gin_configs/reformer_char_lm.gin`)
under a 20 MiB budget on a busy 2-core CPU, some lines left out and each
wrapped here::

    planning: 0.9 s  whole model in one program, 2 batch slices,
      attention 1 (example, head) pair at a time: ruled out, needs at
      least 23.9 MiB, over the budget of 20.0 MiB
    planning: 20.9 s  whole model in one program, 4 batch slices,
      attention 1 (example, head) pair at a time: compiled the program of
      its largest call first, loss program, layers 0..17
    planning: 21.3 s  whole model in one program, 4 batch slices,
      attention 1 (example, head) pair at a time: ruled out, needs at
      least 26.1 MiB, over the budget of 20.0 MiB
    planning: 24.1 s  whole model in one program, 8 batch slices,
      attention 1 (example, head) pair at a time: compiling 1 program
    planning: 36.6 s  whole model in one program, 8 batch slices,
      attention 1 (example, head) pair at a time: ruled out, 20.8 MiB per
      device, 31.4 MiB host, over the budget of 20.0 MiB
    ...
    planning: 64.8 s  segments of 1, 2 batch slices, attention 1 (example,
      head) pair at a time, n_async_layers=0, saved inputs on the host:
      17.1 MiB per device, 27.6 MiB host
    ...
    planned in 80.3 s: segments of 8 (backward 4), 2 batch slices,
      attention 1 (example, head) pair at a time, n_async_layers=0: 19.6
      MiB per device, 30.2 MiB host; 12 programs compiled, 27.7 s of it
      tracing and compiling the chosen plan's 5 programs

Where plans are timed (`time_plans`, `plan_timing`), one line per plan
timed and one for the plan chosen, e.g.::

    planning: 3.1 s  timed: whole model in one program, 2 batch slices:
      0.012 s a step (median of 2)
    planning: 3.4 s  timed: whole model in one program, 1 batch slice:
      failed on the device, so it counts as not fitting: RESOURCE_EXHAUSTED:
      Out of memory ...
    planning: 3.6 s  timed: chose whole model in one program, 2 batch
      slices: 0.012 s a step, the fastest of 2 plans timed

A group of unfused plans a bound rules out reads e.g. 'plans in segments
with 4 batch slices: ruled out, the leanest of them (segments of 1,
n_async_layers=0, saved inputs on the host) needs at least 7.1 KiB, over
the budget of 6.8 KiB'. Where no plan fits, a line says the search for the
least plan begins ('no plan fits: searching for the least plan'); it
weighs plans whatever the budget, and rules them out by the least found.
The log also keeps what planning cost (`PlanningCost`), which the run's
summary, `run_stats.json` and `estimate --json` report.
"""

import dataclasses
import time
from typing import Hashable, Iterable

from absl import logging

from trax_revplus import device_memory
from trax_revplus import notices
from trax_revplus.byte_sizes import format_bytes
from trax_revplus.device_memory import programs as programs_lib
from trax_revplus.trainer._plan import dimensions
from trax_revplus.trainer._plan import plan as plan_lib


@dataclasses.dataclass(frozen=True)
class PlanningCost:
  """What planning one batch's shapes cost.

  Attributes:
    seconds: wall seconds from the start of planning to the plan chosen.
    programs_compiled: programs compiled while planning (the chosen plan's
      among them).
    plan_programs: programs the chosen plan's step calls.
    plan_compile_seconds: seconds of this planning during which at least
      one of the chosen plan's programs was traced or compiled (the union
      of their spans): what planning costs where the plan is known.
    plan: the chosen plan's short description (`short`).
    plan_compiled_before_seconds: the same before this planning began
      (programs another batch's shapes shared, or that compiled beside
      the steps on a plan ready first).
  """

  seconds: float
  programs_compiled: int
  plan_programs: int
  plan_compile_seconds: float
  plan: str
  plan_compiled_before_seconds: float = 0.0

  @property
  def search_seconds(self) -> float:
    """Seconds spent beyond compiling the chosen plan's programs."""
    return max(0.0, self.seconds - self.plan_compile_seconds)

  def to_json(self) -> dict:
    """The figures as JSON, `search_seconds` included."""
    return {**dataclasses.asdict(self), 'search_seconds': self.search_seconds}

  def describe(self) -> str:
    """One line, e.g. "9.8 s, 6.3 s of it tracing and compiling the chosen
    plan's 9 programs; 10 programs compiled in all"."""
    return (
      f'{self.seconds:.1f} s, {self.plan_compile_seconds:.1f} s of it '
      f"tracing and compiling the chosen plan's {self.plan_programs} "
      f'program{"s" * (self.plan_programs != 1)}{self.compiled_before()}; '
      f'{self.programs_compiled} program'
      f'{"s" * (self.programs_compiled != 1)} compiled in all'
    )

  def compiled_before(self) -> str:
    """' (compiled before: 38.6 s)' where some of the chosen plan's
    programs compiled before this planning, else ''."""
    if self.plan_compiled_before_seconds < 0.05:
      return ''
    return f' (compiled before: {self.plan_compiled_before_seconds:.1f} s)'


def _whole(plan: plan_lib.StepPlan) -> bool:
  """Whether `plan` runs the whole model in the loss layer's program."""
  first = plan.blocks[0][0] if plan.blocks else plan.loss
  return plan.fused_from <= first


def _words(plan: plan_lib.StepPlan) -> tuple[list[str], list[str], list[str]]:
  """(layout, dimensions, placement): the words of `short`, in three parts
  (a candidate group's plans share the dimensions' alone)."""
  whole = _whole(plan)
  layout = []
  if whole:
    layout.append('whole model in one program')
  else:
    settings = plan.settings()
    forward = settings['segment_max_layers']
    backward = settings['backward_segment_max_layers']
    layout.append(
      f'segments of {forward}'
      + (f' (backward {backward})' if backward != forward else '')
    )
    if plan.fused_from < plan.loss:
      layout.append(f'{plan.loss - plan.fused_from} layers in the loss program')
  words = []
  for dimension in dimensions.DIMENSIONS:
    value = getattr(plan, dimension.name)
    if dimension.reordering is None:
      continue
    if dimension.name == 'batch_slices' and value == 1:
      words.append('1 batch slice')
    elif value != dimension.none:
      words.append(dimension.reordering(value))
  placement = []
  if not whole:
    placement.append(f'n_async_layers={plan.n_async_layers}')
    if plan.prefetch:
      placement.append('prefetch')
    if plan.saved_on_host:
      placement.append('saved inputs on the host')
    if plan.grads_on_host:
      placement.append('gradients on the host')
  if plan.params_on_device:
    placement.append('weights and slots kept on the device')
  return layout, words, placement


def short(plan: plan_lib.StepPlan) -> str:
  """`plan` in a few words, e.g. 'segments of 4 (backward 2), 2 batch
  slices, n_async_layers=8, prefetch' or 'whole model in one program, 1
  batch slice': its layout, then each of its dimensions that changes
  something (`dimensions.PlanDimension.reordering`'s words; the batch slices
  always), then where its updates and saved inputs wait."""
  layout, words, placement = _words(plan)
  return ', '.join(layout + words + placement)


def group(leanest: plan_lib.StepPlan) -> tuple[str, str | None]:
  """(the plans of a candidate group, its leanest plan) in a few words,
  from the group's leanest plan (`families.Group.leanest`): the fused
  group's one plan as `short` says it, and None; an unfused group's plans
  by the dimensions they share, e.g. 'plans in segments with 2 batch
  slices' (every segmenting, copy-back depth and placement of those), and
  its leanest plan's own layout and placement, e.g. 'segments of 1,
  n_async_layers=0, saved inputs on the host'."""
  layout, words, placement = _words(leanest)
  if _whole(leanest):
    # The whole model in one program: a group of one plan (and its twin
    # with weights and slots kept on the device).
    return short(leanest), None
  return f'plans in segments with {", ".join(words)}', ', '.join(
    layout + placement
  )


def _size(nbytes: int) -> str:
  return format_bytes(nbytes, unit=None)


_OVER_BUDGET = 'over the budget of'
_OVER_LEAST = 'more than the least plan found,'


class PlanningLog:
  """Progress lines while planning, and the cost of each planning.

  Each line says what the search did or knows, no more: a plan weighed
  over the budget says it is ruled out, with its figures and the budget;
  a group of plans ruled out by a bound is that group alone (a group with
  more batch slices or micro-batches may need less, and is tried).

  Attributes:
    costs: list of `PlanningCost`, one per batch's shapes planned under a
      budget, in order.
  """

  def __init__(
    self,
    programs: programs_lib.Programs,
    budget_bytes: int | None = None,
    host_budget_bytes: int | None = None,
  ):
    """Args:
    programs: the planner's `programs.Programs` (what compiled, when).
    budget_bytes: int device bytes per device plans are weighed against,
      or None.
    host_budget_bytes: int host bytes plans are weighed against, or None.
    """
    self._programs = programs
    self._budget_bytes = budget_bytes
    self._host_budget_bytes = host_budget_bytes
    self._start: float | None = None
    self._label = 'planning'
    self._within_budget = True
    self._limit = _OVER_BUDGET
    self._compiled_before = 0
    self._announced: set[plan_lib.StepPlan] = set()
    self._groups_said: set[str] = set()
    self.costs: list[PlanningCost] = []

  def begin(self, label: str = 'planning', limit: str | None = None) -> None:
    """Planning a batch's shapes begins now; its lines start with `label`.

    Args:
      label: the lines' first word(s).
      limit: None: plans are weighed against the budgets, and one weighed
        over them is ruled out; else the words naming the bytes a plan must
        stay within (e.g. 'least plan' and 'more than the least plan
        found,' for the search of the leanest plan, where the budgets rule
        nothing out).
    """
    self._label = label
    self._within_budget = limit is None
    self._limit = _OVER_BUDGET if limit is None else limit
    self._start = time.monotonic()
    self._compiled_before = len(self._programs.compile_spans)
    self._announced = set()
    self._groups_said = set()

  def searching_least(self) -> None:
    """The search of the least plan begins (`plan_search.PlanSearch.least`):
    the bytes a plan is ruled out by from now on are the least plan
    found's, not the budget. Within the budget (the planner searches the
    least where no plan fits), a line says so: the plans it compiles next
    may be some a bound ruled out of the budget."""
    if self._within_budget and self._limit != _OVER_LEAST:
      self._line('no plan fits: searching for the least plan')
    self._limit = _OVER_LEAST

  def _line(self, text: str) -> None:
    if self._start is None:
      return
    seconds = time.monotonic() - self._start
    notices.progress(f'{self._label}: {seconds:.1f} s  {text}')

  def _say(self, text: str, said: bool) -> None:
    """`text` as a line where `said`, else in absl's log alone (a plan
    among many that costs no compiling of its own)."""
    if said:
      self._line(text)
    elif self._start is not None:
      logging.info('%s: %s', self._label, text)

  def compiling(
    self, plan: plan_lib.StepPlan, keys: Iterable[Hashable]
  ) -> None:
    """`plan`'s programs not compiled yet are about to compile."""
    new = [k for k in keys if not self._programs.started(k)]
    if new:
      self._announced.add(plan)
      n = len(new)
      self._line(f'{short(plan)}: compiling {n} program{"s" * (n != 1)}')

  def probed(self, plan: plan_lib.StepPlan, call: str) -> None:
    """The program of `plan`'s call `call` compiled first."""
    self._line(
      f'{short(plan)}: compiled the program of its largest call first, {call}'
    )

  def _over(self, step: device_memory.StepMemory) -> str | None:
    """The budgets `step`'s peaks exceed, in words (e.g. 'over the budget
    of 20.0 MiB'); None where they exceed none, or plans are not weighed
    against them (`begin`)."""
    if not self._within_budget:
      return None
    over = []
    budget, host_budget = self._budget_bytes, self._host_budget_bytes
    if budget is not None and step.peak_device_bytes > budget:
      over.append(f'the budget of {_size(budget)}')
    if host_budget is not None and step.peak_host_bytes > host_budget:
      over.append(f'the host budget of {_size(host_budget)}')
    return 'over ' + ' and '.join(over) if over else None

  def weighed(
    self,
    plan: plan_lib.StepPlan,
    step: device_memory.StepMemory | None,
    refused: device_memory.ProgramOutOfMemoryError | None = None,
  ) -> None:
    """`plan` was weighed: its figures, ruled out where over the budgets,
    or the backend's refusal. A line where `plan`'s own programs compiled
    (`compiling`); absl's log alone where it was weighed from programs
    compiled for other plans."""
    said = plan in self._announced
    ruled_out = 'ruled out, ' if self._within_budget else ''
    if step is None:
      least = None if refused is None else refused.least_bytes
      self._say(
        f'{short(plan)}: {ruled_out}refused by the compiler for memory'
        + (f' (needs at least {_size(least)})' if least else ''),
        said,
      )
      return
    figures = (
      f'{_size(step.peak_device_bytes)} per device, '
      f'{_size(step.peak_host_bytes)} host'
    )
    over = self._over(step)
    self._say(
      f'{short(plan)}: '
      + (figures if over is None else f'ruled out, {figures}, {over}'),
      said,
    )

  def ruled_out(
    self,
    plan: plan_lib.StepPlan,
    lower_bytes: int,
    budget_bytes: int,
    said: bool = True,
  ) -> None:
    """`plan` needs at least `lower_bytes` per device, over `budget_bytes`
    (the budget, or below the least plan found): a line (absl's log alone
    where not `said`: a plan of many ruled out by what others compiled)."""
    self._say(
      f'{short(plan)}: ruled out, needs at least {_size(lower_bytes)}, '
      f'{self._limit} {_size(budget_bytes)}',
      said,
    )

  def group_ruled_out(
    self, plan: plan_lib.StepPlan, lower_bytes: int, budget_bytes: int
  ) -> None:
    """A candidate group of plans (`families.Group`), `plan` its leanest,
    needs at least `lower_bytes` per device, over `budget_bytes`: that
    group alone (`group`), not the groups with more batch slices or
    micro-batches, which may need less. A line for the first group of each
    kind (the groups that differ in their slices or micro-batches alone),
    absl's log for the rest: a tight budget rules out many groups of a kind
    at once, uncompiled, and one line shows why the search skips them."""
    kind = short(
      dataclasses.replace(
        plan,
        grads_on_host=False,
        batch_slices=1,
        micro_batches=1,
      )
    )
    said = kind not in self._groups_said
    self._groups_said.add(kind)
    plans, leanest = group(plan)
    needs = (
      'needs' if leanest is None else f'the leanest of them ({leanest}) needs'
    )
    self._say(
      f'{plans}: ruled out, {needs} at least {_size(lower_bytes)}, '
      f'{self._limit} {_size(budget_bytes)}',
      said,
    )

  def chosen(
    self,
    plan: plan_lib.StepPlan,
    keys: Iterable[Hashable],
    step: device_memory.StepMemory,
    kept_in: str | None = None,
  ) -> PlanningCost | None:
    """`plan` (calling the programs `keys`, its figures `step`; read back
    from the plans kept in `kept_in`, where it was) was chosen: its cost
    kept and said in one line; None where planning did not `begin`."""
    if self._start is None:
      return None
    keys = set(keys)
    during = self._programs.compile_seconds(keys, since=self._start)
    cost = PlanningCost(
      seconds=time.monotonic() - self._start,
      programs_compiled=len(self._programs.compile_spans)
      - self._compiled_before,
      plan_programs=len(keys),
      plan_compile_seconds=during,
      plan=short(plan),
      plan_compiled_before_seconds=max(
        0.0, self._programs.compile_seconds(keys) - during
      ),
    )
    self.costs.append(cost)
    n = cost.programs_compiled
    source = '' if kept_in is None else f' (the plan kept in {kept_in})'
    notices.progress(
      f'planned in {cost.seconds:.1f} s{source}: {short(plan)}: '
      f'{_size(step.peak_device_bytes)} per device, '
      f'{_size(step.peak_host_bytes)} host; {n} program{"s" * (n != 1)} '
      f'compiled, {cost.plan_compile_seconds:.1f} s of it tracing and '
      f"compiling the chosen plan's {cost.plan_programs} "
      f'program{"s" * (cost.plan_programs != 1)}{cost.compiled_before()}'
    )
    self._start = None
    return cost

  def ready_first(self, fastest: plan_lib.StepPlan, n_programs: int) -> None:
    """The steps run a plan ready sooner (said next, `chosen`) while the
    `n_programs` programs of `fastest`, the speed model's first, compile."""
    self._line(
      f'{short(fastest)}: its {n_programs} program'
      f'{"s" * (n_programs != 1)} compile while the first steps run the '
      f'plan below'
    )

  def compiled(self, fastest: plan_lib.StepPlan, n_programs: int) -> None:
    """`fastest`'s programs (`ready_first`) compiled: planning now weighs
    it, and the steps run the plan chosen from this one on."""
    notices.progress(
      f'planning: {short(fastest)}: its {n_programs} program'
      f'{"s" * (n_programs != 1)} compiled; the steps from this one run the '
      f'plan chosen now'
    )

  def timed(self, plan: plan_lib.StepPlan, seconds: float, runs: int) -> None:
    """`plan`'s step took `seconds` on the device, the median of `runs`
    timed runs (`plan_timing`)."""
    self._line(
      f'timed: {short(plan)}: {seconds:.3f} s a step (median of {runs})'
    )

  def run_failed(self, plan: plan_lib.StepPlan, why: str) -> None:
    """`plan`'s timing run failed on the device (`why`, one line): it counts
    as not fitting."""
    self._line(
      f'timed: {short(plan)}: failed on the device, so it counts as not '
      f'fitting: {why}'
    )

  def not_timed(self, n: int, run_seconds: float, limit: float) -> None:
    """The `n` plans that fit are not timed: one run took `run_seconds`,
    so timing them would take longer than `limit` seconds (what their
    programs took to compile); the speed model's first runs."""
    self._line(
      f'timed: none of {n} plans: a run takes {run_seconds:.1f} s, so '
      f'timing them would take more than {limit:.0f} s (compiling their '
      f"programs took that); the speed model's first runs"
    )

  def timed_choice(
    self, plan: plan_lib.StepPlan, seconds: float, n_timed: int
  ) -> None:
    """`plan`, `seconds` a step, is the fastest of the `n_timed` plans
    timed: the one chosen."""
    self._line(
      f'timed: chose {short(plan)}: {seconds:.3f} s a step, the fastest of '
      f'{n_timed} plan{"s" * (n_timed != 1)} timed'
    )

  def end(self) -> None:
    """Planning ended without a plan chosen (nothing fits, an error)."""
    self._start = None
