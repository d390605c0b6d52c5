"""What a step on given batch shapes needs, asked without running it.

`StepInquiries` is the part of `ReversibleSerialTrainer`'s surface that
answers before any step: the plan a step on a batch's shapes runs
(`planned`), its device memory (`device_memory_of`), and the least device
memory the trainer can step in (`least_device_memory_of`). Apart from
trainer.py, which builds the trainer and runs its steps: these only ask the
trainer's planner, and change no weight.
"""

from typing import Callable

from trax_revplus import device_memory as device_memory_lib
from trax_revplus import placement as placement_lib
from trax_revplus import validation
from trax_revplus.trainer._plan import plan as plan_lib
from trax_revplus.trainer._search import planner as planner_lib
from trax_revplus.trainer._search import planning_log
from trax_revplus.trainer._step import units as units_lib
from trax_revplus.typing import Batch


class StepInquiries:
  """A step's plan and device memory, per batch shapes, without a step.

  A base of `ReversibleSerialTrainer`, which sets the attributes below.

  Attributes:
    _planner: the trainer's `planner.Planner`.
    _placement: the trainer's `placement.Placement`.
    _release_host_memory: gives the host memory the compilers freed back
      (`options.TrainerOptions.release_host_memory`).
  """

  _planner: planner_lib.Planner
  _placement: placement_lib.Placement
  _release_host_memory: Callable[[], None]

  def planned(
    self, batch: Batch, ready_first: bool = False
  ) -> units_lib.PlannedStep:
    """How a step on `batch`'s shapes runs: its plan, compiled units and
    device memory; planned (compiled ahead, accounted) on first sight.

    Args:
      batch: tuple of host arrays or `jax.ShapeDtypeStruct`s of shape
        (B, ...), as `one_step` takes them (values are not read).
      ready_first: bool, the next step may run on a plan ready sooner
        while the fastest plan's programs compile
        (`planner.Planner.step_for`); `one_step` asks so.

    Returns:
      `units.PlannedStep`.

    Raises:
      validation.BatchSlicesError: the batch slices set do not divide
        each device's rows.
      planner.DeviceMemoryBudgetError, budget.HostMemoryBudgetError,
        budget.StepCompileError: as `one_step` (nothing changed yet).
    """
    known = self._planner.is_planned(batch)
    planned = self._planner.step_for(batch, ready_first)
    if not known:
      # The compilers' temporaries are free now.
      self._release_host_memory()
    return planned

  def device_memory_of(self, batch: Batch) -> device_memory_lib.StepMemory:
    """Device memory of a step on `batch`'s shapes, without running it.

    The figures of the plan `planned(batch)` runs: its programs compiled
    ahead, XLA's memory analyses of them composed with what the step holds
    across each call (`on_types.AheadOfTime`).

    Args:
      batch: tuple of host arrays or `jax.ShapeDtypeStruct`s of shape
        (B, ...), as `one_step` takes them.

    Returns:
      `device_memory.StepMemory` (bytes per device).

    Raises:
      device_memory.UnsupportedTrainerError: the step cannot be compiled
        ahead here.
      planner.DeviceMemoryBudgetError: no plan fits the budget.
    """
    validation.check_batch(batch, self._placement.n_local_devices)
    planned = self._planner.step_for(batch)
    if planned.memory is not None:
      return planned.memory
    return self._planner.account(
      planned.plan, planned.units, self._planner.step_types(batch)
    )

  def least_device_memory_of(
    self, batch: Batch
  ) -> tuple[plan_lib.StepPlan, device_memory_lib.StepMemory]:
    """The leanest plan on `batch`'s shapes and its device memory: the
    least this trainer can step in.

    Returns:
      (`plan.StepPlan`, `device_memory.StepMemory`).

    Raises:
      device_memory.UnsupportedTrainerError: the step cannot be compiled
        ahead here.
    """
    validation.check_batch(batch, self._placement.n_local_devices)
    return self._planner.least_plan(batch)

  @property
  def planner(self) -> planner_lib.Planner:
    """The `planner.Planner` (budget, plans per batch shapes)."""
    return self._planner

  @property
  def planning_costs(self) -> list[planning_log.PlanningCost]:
    """What planning each batch's shapes cost, in the order planned
    (`planning_log.PlanningCost`: seconds, programs compiled, seconds
    tracing and compiling the chosen plan's own programs)."""
    return list(self._planner.log.costs)
