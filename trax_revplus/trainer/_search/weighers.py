"""How the plan search weighs plans: what it asks, and the simplest answer.

`Weigher` is what `plan_search.PlanSearch` calls on one batch's shapes: a
plan weighed whole, settled against a budget with as little compiling as
decides it, its lower bound and prediction before it compiles, and a word
for the groups it rules out uncompiled. The planner's is
`step_weigher.ShapesWeigher`; `FixedWeigher` weighs every plan whole, with
no bound (a search over given figures, as the tests run one).
"""

from typing import Callable, Protocol

from trax_revplus import device_memory
from trax_revplus.trainer._plan import plan as plan_lib

Weigh = Callable[[plan_lib.StepPlan], device_memory.StepMemory]


class Weigher(Protocol):
  """How the search weighs plans (the planner's `step_weigher.StepWeigher`
  on one batch's shapes)."""

  def weigh(self, plan: plan_lib.StepPlan) -> device_memory.StepMemory:
    """The plan's `StepMemory`, every program compiled, once per plan.

    Raises:
      device_memory.ProgramOutOfMemoryError: the backend refused one of
        its programs for memory (it fits no device budget).
      As `step_weigher.StepWeigher.account` otherwise.
    """

  def weighed(self, plan: plan_lib.StepPlan) -> device_memory.StepMemory | None:
    """The plan's `StepMemory` where weighed already, else None."""

  def refused(
    self, plan: plan_lib.StepPlan
  ) -> device_memory.ProgramOutOfMemoryError | None:
    """The refusal of the plan where the backend refused it, else None."""

  def lower(self, plan: plan_lib.StepPlan) -> int:
    """Bytes per device the plan needs at least, known without compiling
    more (0 where nothing is known)."""

  def settle(
    self, plan: plan_lib.StepPlan, budget_bytes: int
  ) -> device_memory.StepMemory | int:
    """The plan's `StepMemory` where it may fit `budget_bytes` (weighed),
    else the bytes known to rule it out (more than the budget), with as
    little compiling as decides it."""

  def ruled_out(
    self, plan: plan_lib.StepPlan, lower_bytes: int, budget_bytes: int
  ) -> None:
    """Told that the group of leanest plan `plan` needs at least
    `lower_bytes`, over `budget_bytes`, and is not weighed."""

  def predicted(self, plan: plan_lib.StepPlan, walk: bool = True) -> int | None:
    """Bytes per device the plan is predicted to need (its functions traced
    where needed and `walk`, nothing compiled), or None where not known."""


class FixedWeigher:
  """A `Weigher` over a weighing function alone: no bound, every plan
  settled by weighing it whole."""

  def __init__(
    self,
    weigh: Weigh,
    weighed: Callable[[plan_lib.StepPlan], device_memory.StepMemory | None],
    refused: Callable[
      [plan_lib.StepPlan], device_memory.ProgramOutOfMemoryError | None
    ] = lambda _: None,
  ):
    self.weigh = weigh
    self.weighed = weighed
    self.refused = refused

  def lower(self, plan: plan_lib.StepPlan) -> int:
    del plan
    return 0

  def settle(
    self, plan: plan_lib.StepPlan, budget_bytes: int
  ) -> device_memory.StepMemory | int:
    try:
      return self.weigh(plan)
    except device_memory.ProgramOutOfMemoryError as e:
      return max(e.least_bytes or 0, budget_bytes + 1)

  def ruled_out(
    self, plan: plan_lib.StepPlan, lower_bytes: int, budget_bytes: int
  ) -> None:
    del plan, lower_bytes, budget_bytes

  def predicted(self, plan: plan_lib.StepPlan, walk: bool = True) -> int | None:
    del plan, walk
    return None
