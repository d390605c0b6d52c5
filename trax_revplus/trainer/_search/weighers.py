"""How plans are weighed: what the plan search asks, the planner's answer
(a plan's step walked on types, bounded, compiled ahead and its device
memory accounted, once per batch's shapes), and the simplest answer.

`Weigher` is what `plan_search.PlanSearch` calls on one batch's shapes: a
plan weighed whole, settled against a budget with as little compiling as
decides it, its lower bound and prediction before it compiles, and a word
for the groups it rules out uncompiled. The planner's is
`ShapesWeigher`; `FixedWeigher` weighs every plan whole, with
no bound (a search over given figures, as the tests run one).

`StepWeigher` holds what accounting a step needs (the trainer's placement,
layers, compiled units and settings) and every plan accounted so far, by
batch's shapes (`weighed_plans.Weighing`). A plan is first walked on types
(`walk`: its functions traced, nothing compiled), then settled against a
budget with as little compiling as decides it (`settle`: the bounds of
`bounds.PlanBounds`, one program at a time where they predict it does not
fit), and weighed in full where it may fit (`weigh`: every program
compiled, beside each other). The planner (`planner.Planner`, a
`StepWeigher`) chooses among the plans weighed here; kept apart so that
choosing a plan and accounting one are read and changed on their own.
"""

from typing import Callable, Hashable, Protocol

from absl import logging
import jax
import numpy as np

from trax_revplus import device_memory
from trax_revplus import placement as placement_lib
from trax_revplus.device_memory import programs as programs_lib
from trax_revplus.trainer._accounting import on_types
from trax_revplus.trainer._plan import options as options_lib
from trax_revplus.trainer._plan import plan as plan_lib
from trax_revplus.trainer._search import bounds as bounds_lib
from trax_revplus.trainer._search import candidates as candidates_lib
from trax_revplus.trainer._search import planning_log
from trax_revplus.trainer._search import shape_facts
from trax_revplus.trainer._search import weighed_plans as weighed_plans_lib
from trax_revplus.trainer._step import host_store
from trax_revplus.trainer._step import unit_factory
from trax_revplus.trainer._step import units as units_lib
from trax_revplus.typing import Batch
from trax_revplus.typing import PyTree

Weigh = Callable[[plan_lib.StepPlan], device_memory.StepMemory]


class Weigher(Protocol):
  """How the search weighs plans (the planner's `StepWeigher`
  on one batch's shapes)."""

  def weigh(self, plan: plan_lib.StepPlan) -> device_memory.StepMemory:
    """The plan's `StepMemory`, every program compiled, once per plan.

    Raises:
      device_memory.ProgramOutOfMemoryError: the backend refused one of
        its programs for memory (it fits no device budget).
      As `StepWeigher.account` otherwise.
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

  def searching_least(self) -> None:
    """Told that the search of the least plan begins: the bytes `settle`
    is given from then on are below the least plan found, not a budget."""


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

  def searching_least(self) -> None:
    pass


# The planner's weigher.


def batch_key(types: PyTree) -> Hashable:
  """Hashable shapes, dtypes and shardings of a batch's types."""
  leaves, treedef = jax.tree_util.tree_flatten(types)
  return treedef, tuple(
    (tuple(x.shape), str(x.dtype), getattr(x, 'sharding', None)) for x in leaves
  )


class StepWeigher:
  """Accounts plans' steps on the trainer's batches' shapes.

  Attributes:
    budget_bytes: int bytes per device the step may use at its peak, or
      None (no budget: the configured plan runs).
    host_budget_bytes: int host bytes the process's step may hold at its
      peak, or None (`budget.host_budget_bytes`).
  """

  def __init__(
    self,
    placement: placement_lib.Placement,
    store: host_store.LayerStore,
    factory: unit_factory.UnitFactory,
    options: options_lib.TrainerOptions,
    budget_bytes: int | None,
    fingerprint_of: Callable[[int], Hashable] | None = None,
    host_budget_bytes: int | None = None,
  ):
    """Args: as `planner.Planner`'s."""
    self._placement = placement
    self._store = store
    self._factory = factory
    self._options = options
    self.budget_bytes = budget_bytes
    self.host_budget_bytes = host_budget_bytes
    self._programs = programs_lib.Programs()
    self._weighings: dict[Hashable, weighed_plans_lib.Weighing] = {}
    # Batch key -> plan -> its walk on types.
    self._walks: dict[
      Hashable, dict[plan_lib.StepPlan, on_types.AheadOfTime | None]
    ] = {}
    self._bounds: dict[Hashable, bounds_lib.PlanBounds] = {}
    self._facts = shape_facts.ShapeFacts(
      placement, store, factory, options, fingerprint_of, batch_key
    )
    self.log = planning_log.PlanningLog(
      self._programs, budget_bytes, host_budget_bytes
    )

  def weighing(self, batch: Batch) -> weighed_plans_lib.Weighing:
    """The `weighed_plans.Weighing` of `batch`'s shapes: every plan accounted
    on them so far (by `planned`, `least_plan` or `weigh`), the chosen one
    named."""
    key = batch_key(self._placement.abstract_batch(batch))
    return self._weighing_key(key)

  def step_types(self, batch: Batch) -> on_types.StepTypes:
    """The types a step on `batch` starts from (RNG and step placed, with
    values that do not matter)."""
    p = self._placement
    stack = p.abstract_batch(batch)
    rngs = p.place_rngs(np.zeros((2,), np.uint32), len(self._store.layers))
    step = p.replicate(np.zeros((), np.int32))
    return on_types.StepTypes(
      stack,
      rngs,
      self._store.opt_params,
      step,
      device_memory.program.host_types(batch),
    )

  def candidates(self, types: on_types.StepTypes) -> candidates_lib.Candidates:
    """The plans a budget chooses from for a step starting from `types`
    (`step_types`), in the speed model's order."""
    return self._facts.candidates(types)

  def weighing_of(
    self, types: on_types.StepTypes
  ) -> weighed_plans_lib.Weighing:
    """The `weighed_plans.Weighing` of `types`' shapes."""
    return self._weighing_key(batch_key(types.stack))

  def _weighing_key(self, key: Hashable) -> weighed_plans_lib.Weighing:
    if key not in self._weighings:
      self._weighings[key] = weighed_plans_lib.Weighing(
        self.budget_bytes, self.host_budget_bytes
      )
    return self._weighings[key]

  def account(
    self,
    plan: plan_lib.StepPlan,
    units: units_lib.Units,
    types: on_types.StepTypes,
  ) -> device_memory.StepMemory:
    """Compiles `units` ahead and composes the step's device memory.

    Raises:
      device_memory.UnsupportedTrainerError: the step cannot be compiled
        ahead here.
      device_memory.AccountingError: its figures contradict each other.
      device_memory.ProgramOutOfMemoryError: the backend refused to
        compile one of its programs for memory.
      device_memory.ProgramCompileError: one did not compile otherwise.
    """
    ahead = self._ahead(plan, types)
    ahead.account(units)
    return ahead.memory()

  def walk(
    self, plan: plan_lib.StepPlan, types: on_types.StepTypes
  ) -> on_types.AheadOfTime:
    """`plan`'s step walked on `types`: its functions traced, its calls
    noted with what is held across each; nothing compiled. Once per
    batch's shapes."""
    walks = self._walks.setdefault(batch_key(types.stack), {})
    if plan not in walks:
      ahead = self._ahead(plan, types)
      ahead.account(units_lib.Units(plan, self._factory))
      walks[plan] = ahead
    walk = walks[plan]
    assert walk is not None
    return walk

  def _ahead(self, plan, types):
    return on_types.AheadOfTime(
      plan,
      types,
      self._placement,
      self._store.layers,
      self._store.optimizers,
      self._programs,
      self._store.ties,
      keeps_replaced=(self._options.on_non_finite == 'skip'),
    )

  def bounds(self, types: on_types.StepTypes) -> bounds_lib.PlanBounds:
    """The `bounds.PlanBounds` of the plans on `types`' shapes."""
    key = batch_key(types.stack)
    if key not in self._bounds:
      walks = self._walks.setdefault(key, {})
      trace = self._facts.trace(types)[0]
      self._bounds[key] = bounds_lib.PlanBounds(
        self.candidates(types).slices,
        walks.get,
        lambda plan: self.walk(plan, types),
        self._programs,
        bounds_lib.FusedFacts(
          self._store.params_bytes(),
          trace.residual_bytes,
          device_memory.program.tree_bytes(types.stack),
          device_memory.devices_on_host(
            self._placement.platform, self._placement.n_local_devices
          ),
        ),
      )
    return self._bounds[key]

  def weigh(
    self, plan: plan_lib.StepPlan, types: on_types.StepTypes
  ) -> device_memory.StepMemory:
    """`plan`'s `StepMemory` on `types` (`step_types`), accounted once per
    batch's shapes and kept in their `weighed_plans.Weighing`: its walk's
    programs not compiled yet compile now, beside each other.

    Raises:
      As `account`; a plan the backend refused raises its refusal again,
      compiling nothing.
    """
    weighing = self.weighing_of(types)
    refused = weighing.refusal_of(plan)
    if refused is not None:
      raise refused
    step = weighing.memory_of(plan)
    if step is None:
      walk = self.walk(plan, types)
      self.log.compiling(plan, walk.calls.keys())
      try:
        step = walk.memory()
      except device_memory.ProgramOutOfMemoryError as e:
        weighing.refuse(plan, e)
        self.log.weighed(plan, None, e)
        raise
      weighing.add(plan, step)
      self.log.weighed(plan, step)
    return step

  def settle(
    self,
    plan: plan_lib.StepPlan,
    types: on_types.StepTypes,
    budget_bytes: int,
    max_probes: int = 2,
  ) -> device_memory.StepMemory | int:
    """Compiles as little of `plan` as tells whether its peak fits
    `budget_bytes`: its `StepMemory` where it may (every program compiled,
    `weigh`), else the bytes per device known to rule it out (more than
    the budget: a lower bound, or its refusal's).

    While its lower bound (`bounds.PlanBounds.lower`) is within the budget
    and its prediction is not, the program of the call predicted to need
    the most compiles first (`bounds.PlanBounds.probe`), at most
    `max_probes` of them; then the rest, where the bound still admits it.

    Raises:
      As `account`, but for `device_memory.ProgramOutOfMemoryError` (a
      plan that does not fit: its bytes are returned).
    """
    weighing = self.weighing_of(types)
    step = weighing.memory_of(plan)
    if step is not None:
      return step
    refused = weighing.refusal_of(plan)
    if refused is not None:
      return max(refused.least_bytes or 0, budget_bytes + 1)
    bounds = self.bounds(types)
    try:
      # What is known before tracing it (its relatives' programs, the
      # fused program's residuals) may rule it out; else its walk, whose
      # calls share the programs compiled for other plans.
      lower = bounds.lower(plan).device
      if lower > budget_bytes:
        self.log.ruled_out(plan, lower, budget_bytes, said=False)
        return lower
      self.walk(plan, types)
      for probes in range(max_probes + 1):
        lower = bounds.lower(plan).device
        if lower > budget_bytes:
          # A line where this plan's own programs told (its probes); a
          # plan ruled out by programs compiled for others goes to the log.
          self.log.ruled_out(plan, lower, budget_bytes, said=probes > 0)
          return lower
        predicted = bounds.predicted(plan)
        if predicted is None or predicted.device <= budget_bytes:
          break
        if probes == max_probes:
          break
        probed = bounds.probe(plan)
        if probed is None:
          break
        self.log.probed(plan, probed)
      return self.weigh(plan, types)
    except device_memory.ProgramOutOfMemoryError as e:
      if weighing.refusal_of(plan) is None:
        weighing.refuse(plan, e)
        self.log.weighed(plan, None, e)
      return max(e.least_bytes or 0, budget_bytes + 1)

  def _account_or_none(self, plan, types):
    try:
      walk = self.walk(plan, types)
      self.log.compiling(plan, walk.calls.keys())
      return walk.memory()
    except device_memory.UnsupportedTrainerError:
      return None
    except device_memory.AccountingError as e:
      # The figure is an observation: a step it cannot account for still
      # trains, and its records go without peak_device_bytes.
      logging.warning(
        'device memory: the step could not be accounted, its '
        'memory records go without peak_device_bytes: %s',
        e,
      )
      return None

  def weigher(self, types: on_types.StepTypes) -> 'ShapesWeigher':
    """The `Weigher` of the plans on `types`' shapes."""
    return ShapesWeigher(self, types)


class ShapesWeigher:
  """A `StepWeigher` on one batch's shapes, as the plan search weighs
  plans (`Weigher`)."""

  def __init__(self, weigher: StepWeigher, types: on_types.StepTypes):
    self._weigher = weigher
    self._types = types

  def weigh(self, plan: plan_lib.StepPlan) -> device_memory.StepMemory:
    """`StepWeigher.weigh` on these shapes."""
    return self._weigher.weigh(plan, self._types)

  def weighed(self, plan: plan_lib.StepPlan) -> device_memory.StepMemory | None:
    """The plan's `StepMemory` where weighed already, else None."""
    return self._weigher.weighing_of(self._types).memory_of(plan)

  def refused(
    self, plan: plan_lib.StepPlan
  ) -> device_memory.ProgramOutOfMemoryError | None:
    """The plan's refusal for memory, else None."""
    return self._weigher.weighing_of(self._types).refusal_of(plan)

  def lower(self, plan: plan_lib.StepPlan) -> int:
    """`bounds.PlanBounds.lower` of the plan's device bytes; a program of
    it the backend refused (a probe's) makes it refused, its bytes those
    the refusal names."""
    try:
      return self._weigher.bounds(self._types).lower(plan).device
    except device_memory.ProgramOutOfMemoryError as e:
      weighing = self._weigher.weighing_of(self._types)
      if weighing.refusal_of(plan) is None:
        weighing.refuse(plan, e)
      return e.least_bytes or 0

  def settle(
    self, plan: plan_lib.StepPlan, budget_bytes: int
  ) -> device_memory.StepMemory | int:
    """`StepWeigher.settle` on these shapes."""
    return self._weigher.settle(plan, self._types, budget_bytes)

  def ruled_out(
    self, plan: plan_lib.StepPlan, lower_bytes: int, budget_bytes: int
  ) -> None:
    """A progress line for the group (`planning_log`)."""
    self._weigher.log.group_ruled_out(plan, lower_bytes, budget_bytes)

  def searching_least(self) -> None:
    """Its lines name the least plan found as the bytes a plan is ruled
    out by (`planning_log.PlanningLog.searching_least`)."""
    self._weigher.log.searching_least()

  def predicted(self, plan: plan_lib.StepPlan, walk: bool = True) -> int | None:
    """`bounds.PlanBounds.predicted` of the plan's device bytes (None where
    not known, or a probe was refused)."""
    try:
      found = self._weigher.bounds(self._types).predicted(plan, walk)
    except device_memory.ProgramCompileError:
      return None
    return None if found is None else found.device
