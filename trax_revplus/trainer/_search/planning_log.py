"""What planning a step does while the person waits, and what it cost.

Before the first step on a batch's shapes the planner weighs candidate
plans, compiling programs that can take minutes at the sizes users run.
`PlanningLog` says so as it happens, one line per plan it compiles for,
probes or rules out, with the seconds since planning began
(`notices.progress`: `trax-revplus train` and `estimate` print them; from
Python they go to absl's log). On trax's enwik8 Reformer under a 16 GiB
budget, each line here wrapped::

    planning: 1.0 s  whole model in one program, 1 batch slice (and its
      like with more batch slices or micro-batches): ruled out, needs at
      least 127.6 GiB, over the budget of 16.0 GiB
    planning: 2.3 s  segments of 1, 1 batch slice, n_async_layers=8,
      prefetch: compiled the program of its largest call first, backward
      layer 39 (ReversibleHalfResidualDecoderFF)
    planning: 2.4 s  segments of 1, 1 batch slice, n_async_layers=8,
      prefetch: ruled out, needs at least 40.4 GiB, over the budget of
      16.0 GiB
    planning: 2.4 s  segments of 1, 2 batch slices, n_async_layers=0, saved
      inputs on the host (and its like with more batch slices or
      micro-batches): ruled out, needs at least 24.1 GiB, over the budget
      of 16.0 GiB
    planning: 3.3 s  segments of 1, 8 batch slices, n_async_layers=0, saved
      inputs on the host: compiling 9 programs
    planning: 11.0 s  segments of 1, 8 batch slices, n_async_layers=0,
      saved inputs on the host: 13.1 GiB per device, 14.1 GiB host
    planned in 11.2 s: segments of 1, 8 batch slices, n_async_layers=8,
      prefetch: 13.4 GiB per device, 14.3 GiB host; 10 programs compiled,
      8.1 s of it tracing and compiling the chosen plan's 9

and keeps what planning cost (`PlanningCost`), which the run's summary,
`run_stats.json` and `estimate --json` report.
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
    plan_compile_seconds: seconds during which at least one of the chosen
      plan's programs was traced or compiled (the union of their spans):
      what planning costs where the plan is known.
    plan: the chosen plan's short description (`short`).
  """

  seconds: float
  programs_compiled: int
  plan_programs: int
  plan_compile_seconds: float
  plan: str

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
      f'program{"s" * (self.plan_programs != 1)}; '
      f'{self.programs_compiled} program'
      f'{"s" * (self.programs_compiled != 1)} compiled in all'
    )


def short(plan: plan_lib.StepPlan) -> str:
  """`plan` in a few words, e.g. 'segments of 4 (backward 2), 2 batch
  slices, n_async_layers=8, prefetch' or 'whole model in one program, 1
  batch slice': its layout, then each of its dimensions that changes
  something (`dimensions.PlanDimension.reordering`'s words; the batch slices
  always), then where its updates and saved inputs wait."""
  first = plan.blocks[0][0] if plan.blocks else plan.loss
  whole = plan.fused_from <= first
  words = []
  if whole:
    words.append('whole model in one program')
  else:
    settings = plan.settings()
    forward = settings['segment_max_layers']
    backward = settings['backward_segment_max_layers']
    words.append(
      f'segments of {forward}'
      + (f' (backward {backward})' if backward != forward else '')
    )
    if plan.fused_from < plan.loss:
      words.append(f'{plan.loss - plan.fused_from} layers in the loss program')
  for dimension in dimensions.DIMENSIONS:
    value = getattr(plan, dimension.name)
    if dimension.reordering is None:
      continue
    if dimension.name == 'batch_slices' and value == 1:
      words.append('1 batch slice')
    elif value != dimension.none:
      words.append(dimension.reordering(value))
  if not whole:
    words.append(f'n_async_layers={plan.n_async_layers}')
    if plan.prefetch:
      words.append('prefetch')
    if plan.saved_on_host:
      words.append('saved inputs on the host')
    if plan.grads_on_host:
      words.append('gradients on the host')
  return ', '.join(words)


def _size(nbytes: int) -> str:
  return format_bytes(nbytes, unit=None)


class PlanningLog:
  """Progress lines while planning, and the cost of each planning.

  Attributes:
    costs: list of `PlanningCost`, one per batch's shapes planned under a
      budget, in order.
  """

  def __init__(self, programs: programs_lib.Programs):
    self._programs = programs
    self._start: float | None = None
    self._label = 'planning'
    self._limit = 'over the budget of'
    self._compiled_before = 0
    self._announced: set[plan_lib.StepPlan] = set()
    self._groups_said: set[str] = set()
    self.costs: list[PlanningCost] = []

  def begin(
    self, label: str = 'planning', limit: str = 'over the budget of'
  ) -> None:
    """Planning a batch's shapes begins now; its lines start with
    `label` and name the bytes a plan must stay within with `limit` (e.g.
    'least plan' and 'more than the least plan found,' for the search of
    the leanest plan)."""
    self._label = label
    self._limit = limit
    self._start = time.monotonic()
    self._compiled_before = len(self._programs.compile_spans)
    self._announced = set()
    self._groups_said = set()

  def _line(self, text: str) -> None:
    if self._start is None:
      return
    seconds = time.monotonic() - self._start
    notices.progress(f'{self._label}: {seconds:.1f} s  {text}')

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

  def weighed(
    self,
    plan: plan_lib.StepPlan,
    step: device_memory.StepMemory | None,
    refused: device_memory.ProgramOutOfMemoryError | None = None,
  ) -> None:
    """`plan` was weighed: its figures, or the backend's refusal."""
    if plan not in self._announced:
      return  # weighed from programs compiled for another plan
    if step is None:
      least = None if refused is None else refused.least_bytes
      self._line(
        f'{short(plan)}: refused by the compiler for memory'
        + (f' (needs at least {_size(least)})' if least else '')
      )
      return
    self._line(
      f'{short(plan)}: {_size(step.peak_device_bytes)} per device, '
      f'{_size(step.peak_host_bytes)} host'
    )

  def ruled_out(
    self,
    plan: plan_lib.StepPlan,
    lower_bytes: int,
    budget_bytes: int,
    said: bool = True,
  ) -> None:
    """`plan` needs at least `lower_bytes` per device, over the budget: a
    line (absl's log alone where not `said`: a plan of many ruled out by
    what others compiled)."""
    text = (
      f'{short(plan)}: ruled out, needs at least {_size(lower_bytes)}, '
      f'{self._limit} {_size(budget_bytes)}'
    )
    if said:
      self._line(text)
    elif self._start is not None:
      logging.info('planning: %s', text)

  def group_ruled_out(
    self, plan: plan_lib.StepPlan, lower_bytes: int, budget_bytes: int
  ) -> None:
    """A group of plans, `plan` its leanest, needs at least `lower_bytes`
    per device: one line for the first group of each kind (the groups that
    differ in their slices or micro-batches alone share one)."""
    kind = short(
      dataclasses.replace(
        plan,
        grads_on_host=False,
        batch_slices=1,
        micro_batches=1,
      )
    )
    if kind in self._groups_said:
      return
    self._groups_said.add(kind)
    self._line(
      f'{short(plan)} (and its like with more batch slices or '
      f'micro-batches): ruled out, needs at least {_size(lower_bytes)}, '
      f'{self._limit} {_size(budget_bytes)}'
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
    cost = PlanningCost(
      seconds=time.monotonic() - self._start,
      programs_compiled=len(self._programs.compile_spans)
      - self._compiled_before,
      plan_programs=len(keys),
      plan_compile_seconds=self._programs.compile_seconds(keys),
      plan=short(plan),
    )
    self.costs.append(cost)
    n = cost.programs_compiled
    source = '' if kept_in is None else f' (the plan kept in {kept_in})'
    notices.progress(
      f'planned in {cost.seconds:.1f} s{source}: {short(plan)}: '
      f'{_size(step.peak_device_bytes)} per device, '
      f'{_size(step.peak_host_bytes)} host; {n} program{"s" * (n != 1)} '
      f'compiled, {cost.plan_compile_seconds:.1f} s of it tracing and '
      f"compiling the chosen plan's {cost.plan_programs}"
    )
    self._start = None
    return cost

  def end(self) -> None:
    """Planning ended without a plan chosen (nothing fits, an error)."""
    self._start = None
