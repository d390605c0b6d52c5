"""Weighing plans: a plan's step compiled ahead and its device memory
accounted, once per batch's shapes.

`StepWeigher` holds what accounting a step needs (the trainer's placement,
layers, compiled units and settings) and every plan accounted so far, by
batch's shapes (`weighing.Weighing`). The planner (`planner.Planner`, a
`StepWeigher`) chooses among the plans weighed here; kept apart so that
choosing a plan and accounting one are read and changed on their own.
"""

from typing import Callable, Hashable

from absl import logging
import jax
import numpy as np

from trax_revplus import device_memory
from trax_revplus import placement as placement_lib
from trax_revplus.device_memory import calls as calls_lib
from trax_revplus.trainer import host_store
from trax_revplus.trainer import options as options_lib
from trax_revplus.trainer._accounting import on_types
from trax_revplus.trainer._plan import candidates as candidates_lib
from trax_revplus.trainer._plan import plan as plan_lib
from trax_revplus.trainer._plan import shape_facts
from trax_revplus.trainer._plan import weighing as weighing_lib
from trax_revplus.trainer._step import unit_factory
from trax_revplus.trainer._step import units as units_lib
from trax_revplus.typing import Batch
from trax_revplus.typing import PyTree


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
    self._programs = calls_lib.Programs()
    self._weighings: dict[Hashable, weighing_lib.Weighing] = {}
    self._facts = shape_facts.ShapeFacts(
      placement, store, factory, options, fingerprint_of, batch_key
    )

  def weighing(self, batch: Batch) -> weighing_lib.Weighing:
    """The `weighing.Weighing` of `batch`'s shapes: every plan accounted
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

  def _weighing_of(self, types: on_types.StepTypes) -> weighing_lib.Weighing:
    return self._weighing_key(batch_key(types.stack))

  def _weighing_key(self, key: Hashable) -> weighing_lib.Weighing:
    if key not in self._weighings:
      self._weighings[key] = weighing_lib.Weighing(
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
    ahead = on_types.AheadOfTime(
      plan,
      types,
      self._placement,
      self._store.layers,
      self._store.optimizers,
      self._programs,
      self._store.ties,
      keeps_replaced=(self._options.on_non_finite == 'skip'),
    )
    ahead.account(units)
    return ahead.memory()

  def weigh(
    self, plan: plan_lib.StepPlan, types: on_types.StepTypes
  ) -> device_memory.StepMemory:
    """`plan`'s `StepMemory` on `types` (`step_types`), accounted once per
    batch's shapes and kept in their `weighing.Weighing`.

    Raises:
      As `account`; a plan the backend refused raises its refusal again,
      compiling nothing.
    """
    weighing = self._weighing_of(types)
    refused = weighing.refusal_of(plan)
    if refused is not None:
      raise refused
    step = weighing.memory_of(plan)
    if step is None:
      try:
        step = self.account(plan, units_lib.Units(plan, self._factory), types)
      except device_memory.ProgramOutOfMemoryError as e:
        weighing.refuse(plan, e)
        raise
      weighing.add(plan, step)
    return step

  def _account_or_none(self, plan, units, types):
    try:
      return self.account(plan, units, types)
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
