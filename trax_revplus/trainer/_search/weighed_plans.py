"""The plans accounted on one batch's shapes: the memory/speed front.

The planner keeps every plan it accounts on a batch's shapes, by its
search for the plan to run and for the least plan, with its figures
(`Weighing`): its peak device and host bytes, or the program the backend
refused to compile for memory, and where it was timed on the device
(`plan_timing`) its seconds a step or how its run failed;
`trax-revplus estimate` prints them
(`Weighing.lines`) and writes them (`Weighing.to_json`), the chosen one
marked.
"""

from typing import NamedTuple

from trax_revplus import device_memory
from trax_revplus.byte_sizes import format_bytes
from trax_revplus.trainer._plan import plan as plan_lib
from trax_revplus.trainer._search import planning_log


class Weighed(NamedTuple):
  """One plan accounted on a batch's shapes.

  Attributes:
    plan: the `plan.StepPlan`.
    memory: its `device_memory.StepMemory`, or None where the backend
      refused to compile one of its programs for memory (`refused`).
    fits: whether its peak device bytes are within the device budget and
      its peak host bytes within the host budget (False where refused);
      None without either budget.
    step_seconds: float seconds one step of it took where timed on the
      device (`plan_timing`: the median of its timed runs), else None.
    refused: the `device_memory.ProgramOutOfMemoryError` of a plan the
      backend refused to compile for memory, else None.
    run_failed: where its timing run failed on the device, why (one line):
      it does not fit (`fits` False); else None.
  """

  plan: plan_lib.StepPlan
  memory: device_memory.StepMemory | None
  fits: bool | None
  step_seconds: float | None = None
  refused: device_memory.ProgramOutOfMemoryError | None = None
  run_failed: str | None = None

  @property
  def calls_per_step(self) -> int | None:
    """Compiled calls one step of the plan makes, as its accounting counted
    them (a unit that only reorders the stack makes none); None where
    refused."""
    return None if self.memory is None else len(self.memory.calls)


class Weighing:
  """The plans accounted on one batch's shapes, in the order accounted.

  One record serves the search for the plan to run and for the least plan
  (`plan_search.PlanSearch`) and what `estimate` shows: a plan accounted by
  one is not accounted again by another.

  Attributes:
    budget_bytes: int device bytes the plans were weighed against, or None.
    host_budget_bytes: int host bytes the plans were weighed against, or
      None.
    weighed: list of `Weighed`, one per distinct plan, in the order
      accounted.
    chosen: the `plan.StepPlan` the step runs, or None (not planned yet, or
      no plan fits the budget).
    cost: `planning_log.PlanningCost` of choosing it, or None.
  """

  def __init__(
    self, budget_bytes: int | None, host_budget_bytes: int | None = None
  ):
    self.budget_bytes = budget_bytes
    self.host_budget_bytes = host_budget_bytes
    # In the order accounted.
    self._by_plan: dict[plan_lib.StepPlan, Weighed] = {}
    self.chosen: plan_lib.StepPlan | None = None
    self.cost: planning_log.PlanningCost | None = None

  def fits(self, memory: device_memory.StepMemory) -> bool | None:
    """Whether `memory`'s peaks are within the budgets; None without
    either."""
    if self.budget_bytes is None and self.host_budget_bytes is None:
      return None
    return (
      self.budget_bytes is None or memory.peak_device_bytes <= self.budget_bytes
    ) and (
      self.host_budget_bytes is None
      or memory.peak_host_bytes <= self.host_budget_bytes
    )

  @property
  def weighed(self) -> list[Weighed]:
    """One `Weighed` per distinct plan, in the order accounted."""
    return list(self._by_plan.values())

  def memory_of(
    self, plan: plan_lib.StepPlan
  ) -> device_memory.StepMemory | None:
    """The `StepMemory` of `plan` where it was accounted, else None (not
    accounted, or refused)."""
    weighed = self._by_plan.get(plan)
    return None if weighed is None else weighed.memory

  def refusal_of(
    self, plan: plan_lib.StepPlan
  ) -> device_memory.ProgramOutOfMemoryError | None:
    """The refusal of `plan` where the backend refused to compile one of
    its programs for memory, else None."""
    weighed = self._by_plan.get(plan)
    return None if weighed is None else weighed.refused

  def add(
    self, plan: plan_lib.StepPlan, memory: device_memory.StepMemory
  ) -> None:
    """Records `plan`, accounted as `memory` (once per distinct plan)."""
    if plan not in self._by_plan:
      self._by_plan[plan] = Weighed(plan, memory, self.fits(memory))

  def refuse(
    self, plan: plan_lib.StepPlan, error: device_memory.ProgramOutOfMemoryError
  ) -> None:
    """Records `plan`, one of whose programs the backend refused to compile
    for memory (`error`): it fits no budget."""
    if plan not in self._by_plan:
      self._by_plan[plan] = Weighed(plan, None, False, refused=error)

  def timed(self, plan: plan_lib.StepPlan, seconds: float) -> None:
    """Records that `plan` (accounted) took `seconds` a step on the
    device."""
    self._by_plan[plan] = self._by_plan[plan]._replace(step_seconds=seconds)

  def step_seconds(self, plan: plan_lib.StepPlan) -> float | None:
    """The seconds a step of `plan` took where it was timed, else None."""
    weighed = self._by_plan.get(plan)
    return None if weighed is None else weighed.step_seconds

  def run_failed(self, plan: plan_lib.StepPlan, why: str) -> None:
    """Records that `plan`'s (accounted) timing run failed on the device
    (`why`, one line): it does not fit."""
    self._by_plan[plan] = self._by_plan[plan]._replace(
      fits=False, run_failed=why
    )

  def to_json(self) -> list[dict]:
    """One JSON object per plan weighed, in the order accounted: its
    `describe`, `settings`, `peak_device_bytes`, `peak_host_bytes`, `fits`,
    `calls_per_step`, `step_seconds` (null where not timed), whether it
    is `chosen`, where its timing run failed `run_failed` (why), and where
    refused (its peaks null) `refused`, the line saying so, and
    `least_device_bytes`, what it needs at least (or null)."""
    out = []
    for w in self.weighed:
      entry = {
        'describe': w.plan.describe(w.calls_per_step or 0),
        'settings': w.plan.settings(),
        'peak_device_bytes': w.memory and w.memory.peak_device_bytes,
        'peak_host_bytes': w.memory and w.memory.peak_host_bytes,
        'fits': w.fits,
        'calls_per_step': w.calls_per_step,
        'step_seconds': w.step_seconds,
        'chosen': w.plan == self.chosen,
      }
      if w.run_failed is not None:
        entry['run_failed'] = w.run_failed
      if w.refused is not None:
        entry.update(
          refused=str(w.refused), least_device_bytes=w.refused.least_bytes
        )
      out.append(entry)
    return out

  def lines(self) -> list[str]:
    """The plans weighed as printed lines, a header first: '*' marks the
    chosen plan; fits and step time are '-' where unknown (the step time
    is a plan's timed on the device: `plan_timing`), a plan whose timing
    run failed reads 'failed' there; a plan the backend refused to compile
    for memory reads 'refused' (with the bytes it needs at least, where
    known)."""
    out = [
      f'  {"peak device/step":>27} {"peak host/step":>14} {"fits":>4} '
      f'{"calls/step":>10} {"step time":>9}  plan'
    ]
    for w in self.weighed:
      mark = '*' if w.plan == self.chosen else ' '
      if w.memory is None:
        assert w.refused is not None  # a plan without figures was refused
        least = w.refused.least_bytes
        device = (
          'refused'
          if least is None
          else f'refused, >= {format_bytes(least, unit=None)}'
        )
        host, calls = '-', '-'
      else:
        peak = w.memory.peak_device_bytes
        device = f'{peak} B ({format_bytes(peak)})'
        host = format_bytes(w.memory.peak_host_bytes, unit=None)
        calls = str(w.calls_per_step)
      fits = '-' if w.fits is None else ('yes' if w.fits else 'no')
      seconds = '-' if w.step_seconds is None else f'{w.step_seconds:.3f}s'
      if w.run_failed is not None:
        seconds = 'failed'
      settings = ', '.join(f'{k}={v}' for k, v in w.plan.settings().items())
      out.append(
        f'{mark} {device:>27} {host:>14} {fits:>4} {calls:>10} '
        f'{seconds:>9}  {settings}'
      )
    return out
