"""What a batch's shapes tell the planner, found once per shapes.

`ShapeFacts` answers, for a step starting from `on_types.StepTypes`, what the
planner needs before it weighs any plan: each device's rows, the stack's
bytes per block and the loss layer's tail (`stack_bytes`,
`loss_tail`), whether micro-batches can run, the candidate plans in
the speed model's order (`candidates.Candidates`), and whether the plan
settings given as ints can run on these shapes (`check`, each a one-line
`validation` error).
"""

from typing import Callable, Hashable

import jax

from trax_revplus import placement as placement_lib
from trax_revplus.trainer._accounting import on_types
from trax_revplus.trainer._plan import dimensions
from trax_revplus.trainer._plan import options as options_lib
from trax_revplus.trainer._plan import plan as plan_lib
from trax_revplus.trainer._search import candidates as candidates_lib
from trax_revplus.trainer._search import speed_rank
from trax_revplus.trainer._search import stack_bytes as stack_bytes_lib
from trax_revplus.trainer._step import attention_heads
from trax_revplus.trainer._step import batch_parts
from trax_revplus.trainer._step import host_store
from trax_revplus.trainer._step import loss_tail
from trax_revplus.trainer._step import unit_factory
from trax_revplus.typing import PyTree


class ShapeFacts:
  """The facts of each batch's shapes a trainer's planner reads."""

  def __init__(
    self,
    placement: placement_lib.Placement,
    store: host_store.LayerStore,
    factory: unit_factory.UnitFactory,
    options: options_lib.TrainerOptions,
    fingerprint_of: Callable[[int], Hashable] | None,
    key_of: Callable[[PyTree], Hashable],
  ):
    """Args:
    placement, store, factory, options: the trainer's
      `placement.Placement`, `host_store.LayerStore`,
      `unit_factory.UnitFactory` and `options.TrainerOptions`.
    fingerprint_of: layer index -> hashable, or None (see
      `planner.Planner`).
    key_of: the stack's types -> hashable key of their shapes.
    """
    self._placement = placement
    self._store = store
    self._factory = factory
    self._options = options
    self._fingerprint_of = fingerprint_of
    self._key_of = key_of
    # Key -> (stack bytes per block, tail length).
    self._traces: dict[
      Hashable, tuple[stack_bytes_lib.StackTrace, int | None]
    ] = {}

  def rows(self, types: on_types.StepTypes) -> int:
    """Rows of the batch each device gets."""
    leaf = jax.tree_util.tree_leaves(types.stack)[0]
    return leaf.shape[1] if self._placement.n_devices > 1 else leaf.shape[0]

  def trace(
    self, types: on_types.StepTypes
  ) -> tuple[stack_bytes_lib.StackTrace, int | None]:
    """(`stack_bytes.StackTrace`; the sequence length of the loss layer's
    tail's inputs, or None where it has no tail to run in chunks:
    `loss_tail.tail_length`), once per batch's shapes."""
    key = self._key_of(types.stack)
    if key not in self._traces:
      trace = stack_bytes_lib.trace(
        self._store,
        types.stack,
        self._placement.n_devices,
        self._fingerprint_of,
      )
      self._traces[key] = (
        trace,
        loss_tail.tail_length(self._store.layers[-1], trace.loss_inputs),
      )
    return self._traces[key]

  def candidates(self, types: on_types.StepTypes) -> candidates_lib.Candidates:
    """The plans a budget chooses from for a step starting from `types`,
    in the speed model's order."""
    trace, tail_length = self.trace(types)
    return candidates_lib.Candidates(
      self._store.block_sizes(),
      self._store.params_bytes(),
      trace.block_bytes,
      self.rows(types),
      self._options,
      bool(self._store.ties),
      self._layer_kinds(),
      tail_length,
      self.parts_refusal(types) is not None,
      trace.slices_change_draws,
      self._placement.platform,
      attention_heads.layer_kinds(self._store.layers),
      trace.hashes_activations,
      speed_rank.ranked_params_on_device(
        self._placement.platform,
        self._options.pinned('params_on_device'),
        self.params_on_device_refusal(),
      ),
    )

  def params_on_device_refusal(self) -> str | None:
    """Why the weights and slots cannot stay on the device across steps,
    or None (`options.params_on_device_refusal`)."""
    return options_lib.params_on_device_refusal(
      self._options.on_non_finite,
      bool(self._store.ties),
      self._placement.processes is not None,
    )

  def parts_refusal(self, types: on_types.StepTypes) -> str | None:
    """Why a step from `types` cannot run in micro-batches, or None
    (`batch_parts.refusal`)."""
    stack = types.stack
    n_items = len(stack) if isinstance(stack, (tuple, list)) else 1
    return batch_parts.refusal(
      self._store.layers, n_items, self._factory.adasum, bool(self._store.ties)
    )

  def _layer_kinds(self) -> list[Hashable] | None:
    if self._fingerprint_of is None:
      return None
    return [self._fingerprint_of(i) for i in range(len(self._store.layers))]

  def check_heads(
    self, n: plan_lib.PairsAtOnce, setting: str, rows: int
  ) -> None:
    """Checks that the trainer's attention layers can run `n` (example,
    head) pairs at a time over `rows` rows of a device
    (`attention_heads.check`).

    Raises:
      validation.TrainerOptionError: one cannot, named with its heads.
    """
    attention_heads.check(self._store.layers, n, setting, rows)

  @property
  def loss_name(self) -> str:
    """The loss layer's name (for error lines)."""
    return self._store.layers[-1].name

  def unplanned(self, name: str) -> int | None:
    """The setting of the plan's dimension `name` as a step without a
    budget runs it (`options.TrainerOptions.unplanned`)."""
    return self._options.unplanned(name)

  def check(self, types: on_types.StepTypes) -> None:
    """Checks the plan's dimensions against these shapes
    (`dimensions.PlanDimension.check`), in `dimensions.DIMENSIONS` order.

    Raises:
      As `planner.Planner.step_for`: validation.BatchSlicesError,
      SequenceChunksError, MicroBatchesError, TrainerOptionError.
    """
    for dimension in dimensions.DIMENSIONS:
      # As a step without a budget runs it: 'auto' checks its unplanned
      # value, where it has one (None: the model as configured).
      value = self._options.unplanned(dimension.name)
      if dimension.check is not None and value is not None:
        dimension.check(value, self, types)
