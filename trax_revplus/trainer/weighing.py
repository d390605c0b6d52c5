"""The plans accounted on one batch's shapes: the memory/speed front.

The planner keeps every plan it accounts on a batch's shapes, by its
search for the plan to run and for the least plan, with its figures
(`Weighing`); `trax-revplus estimate` prints them (`Weighing.lines`) and
writes them (`Weighing.to_json`), the chosen one marked.
"""

from typing import NamedTuple

from trax_revplus import device_memory
from trax_revplus.byte_sizes import format_bytes
from trax_revplus.trainer import plan as plan_lib


class Weighed(NamedTuple):
  """One plan accounted on a batch's shapes.

  Attributes:
    plan: the `plan.StepPlan`.
    memory: its `device_memory.StepMemory`.
    fits: whether its peak device bytes are within the budget; None
      without a budget.
    step_seconds: float seconds one step of it took where measured, else
      None (nothing measures plans yet).
  """
  plan: plan_lib.StepPlan
  memory: device_memory.StepMemory
  fits: bool | None
  step_seconds: float | None = None

  @property
  def calls_per_step(self) -> int:
    """Compiled calls one step of the plan makes, as its accounting counted
    them (a unit that only reorders the stack makes none)."""
    return len(self.memory.calls)


class Weighing:
  """The plans accounted on one batch's shapes, in the order accounted.

  One record serves the search for the plan to run and for the least plan
  (`plan_search.PlanSearch`) and what `estimate` shows: a plan accounted by
  one is not accounted again by another.

  Attributes:
    budget_bytes: int bytes the plans were weighed against, or None.
    weighed: list of `Weighed`, one per distinct plan, in the order
      accounted.
    chosen: the `plan.StepPlan` the step runs, or None (not planned yet, or
      no plan fits the budget).
  """

  def __init__(self, budget_bytes: int | None):
    self.budget_bytes = budget_bytes
    self._by_plan = {}  # plan -> Weighed, in the order accounted
    self.chosen = None

  @property
  def weighed(self) -> list[Weighed]:
    """One `Weighed` per distinct plan, in the order accounted."""
    return list(self._by_plan.values())

  def memory_of(self, plan) -> device_memory.StepMemory | None:
    """The `StepMemory` of `plan` where it was accounted, else None."""
    weighed = self._by_plan.get(plan)
    return None if weighed is None else weighed.memory

  def add(self, plan, memory: device_memory.StepMemory) -> None:
    """Records `plan`, accounted as `memory` (once per distinct plan)."""
    if plan not in self._by_plan:
      budget = self.budget_bytes
      fits = None if budget is None else memory.peak_device_bytes <= budget
      self._by_plan[plan] = Weighed(plan, memory, fits)

  def to_json(self) -> list[dict]:
    """One JSON object per plan weighed, in the order accounted: its
    `describe`, `settings`, `peak_device_bytes`, `fits`, `calls_per_step`,
    `step_seconds` (null where not measured) and whether it is `chosen`."""
    return [{
        'describe': w.plan.describe(w.calls_per_step),
        'settings': w.plan.settings(),
        'peak_device_bytes': w.memory.peak_device_bytes,
        'fits': w.fits,
        'calls_per_step': w.calls_per_step,
        'step_seconds': w.step_seconds,
        'chosen': w.plan == self.chosen,
    } for w in self.weighed]

  def lines(self) -> list[str]:
    """The plans weighed as printed lines, a header first: '*' marks the
    chosen plan; fits and step time are '-' where unknown."""
    out = [f'  {"peak device/step":>27} {"fits":>4} {"calls/step":>10} '
           f'{"step time":>9}  plan']
    for w in self.weighed:
      mark = '*' if w.plan == self.chosen else ' '
      peak = w.memory.peak_device_bytes
      fits = '-' if w.fits is None else ('yes' if w.fits else 'no')
      seconds = '-' if w.step_seconds is None else f'{w.step_seconds:.3f}s'
      settings = ', '.join(f'{k}={v}' for k, v in w.plan.settings().items())
      out.append(f'{mark} {f"{peak} B ({format_bytes(peak)})":>27} '
                 f'{fits:>4} {w.calls_per_step:>10} {seconds:>9}  {settings}')
    return out
