"""`DeviceEvaluator`: trax's eval `metrics_fn`, planned on the trainer's device.

trax's memory-efficient `Loop` evaluates with `metrics_fn =
_accelerate_model_with_metrics(model_with_metrics, 0)`: the whole model's
forward on the whole eval batch, jitted on the host's CPU device, beside an
accelerator that the train step plans to fit. A `DeviceEvaluator` is that
`metrics_fn` on the first device the trainer steps on (its `placement`),
planned under the trainer's device memory budget (`planning`): before the
first eval on a batch's shapes, the fewest parts of the batch's rows whose
program fits, or where not even one row of the whole model fits, its
layers one program at a time (`segments`); compiled once and logged once
(`eval device memory plan:`). At each call the arguments (the eval batch,
the host weights and state the `Loop` passes, the RNG) are placed on that
device, the programs run, the metrics come back to the host and the copies
placed for them are deleted.
"""

from typing import Any, Callable, NamedTuple

from absl import logging
import jax
from trax import layers as tl

from trax_revplus import device_memory
from trax_revplus import placement as placement_lib
from trax_revplus.device_memory import program as program_lib
from trax_revplus.evaluation import functions
from trax_revplus.evaluation import planning
from trax_revplus.evaluation import segments
from trax_revplus.layers import preserved
from trax_revplus.typing import PRNGKey
from trax_revplus.typing import PyTree


class PlannedEval(NamedTuple):
  """An eval on one batch's shapes.

  Attributes:
    plan: its `planning.EvalPlan` (the whole model over row parts) or
      `segments.SegmentedPlan` (one layer at a time).
    run: `run(batch, weights, state, rng) -> metric values` (host arrays),
      its programs compiled for these shapes on the evaluator's device.
  """

  plan: Any
  run: Callable[..., Any]


class _Whole:
  """The whole model's program over row parts, run on placed arguments."""

  def __init__(self, compiled, device):
    self._compiled = compiled
    self._device = device

  def __call__(self, batch, weights, state, rng):
    args = (batch, weights, state, rng)
    placed, copies = self._device.put(args)
    try:
      return jax.device_get(self._compiled(*placed))
    finally:
      del placed
      self._device.release(copies, args)


class DeviceEvaluator:
  """trax's eval `metrics_fn` on one device of a trainer, planned.

  Called as trax's `run_evals` calls `_Evaluator.metrics_fn`:
  `metrics_fn(batch, (model weights, metrics weights), (model state,
  metrics state), rng) -> (metric values, state)`.
  """

  def __init__(
    self,
    model_with_metrics: tl.Layer,
    placement: placement_lib.Placement,
    budget_bytes: int | None,
  ):
    """Args:
      model_with_metrics: trax's `tl.Serial(model, metrics_layer)`
        (`training._model_with_metrics`), initialized.
      placement: the trainer's `placement.Placement`; the eval runs on its
        first device (of this process).
      budget_bytes: int bytes the eval may use on that device at its peak
        (the trainer's step budget), or None: one part, unplanned.

    Raises:
      ValueError: `model_with_metrics` is not a `tl.Serial` of two layers.
    """
    functions.model_and_metrics(model_with_metrics)
    self._model_with_metrics = model_with_metrics
    self._device = placement_lib.OneDevice(
      placement.devices[0], placement.transfers
    )
    self.budget_bytes = budget_bytes
    # argument types key -> PlannedEval
    self._planned: dict[Any, Any] = {}

  @property
  def device(self) -> jax.Device:
    """The device the eval runs on."""
    return self._device.device

  @property
  def model_with_metrics(self) -> tl.Layer:
    """The `tl.Serial(model, metrics_layer)` it evaluates."""
    return self._model_with_metrics

  def planned(
    self, batch: PyTree, weights: PyTree, state: PyTree, rng: PRNGKey
  ) -> PlannedEval:
    """The `PlannedEval` of these arguments' shapes, planned (compiled,
    accounted, logged) on first sight; the arguments' values are not
    read.

    Raises:
      planning.EvalMemoryBudgetError: not even one row per part of the
        whole model fits the budget, and not even one layer and one row
        at a time (`segments.SegmentsError`, where the model runs as
        layers one after another).
    """
    args = (batch, weights, state, rng)
    key = program_lib.types_key(args)
    if key not in self._planned:
      with preserved(self._model_with_metrics):
        self._planned[key] = self._plan(self._device.types(args))
      logging.info(
        'eval device memory plan on %s: %s',
        self.device,
        self._planned[key].plan.describe(self.budget_bytes),
      )
    return self._planned[key]

  def _plan(self, types):
    """The whole model over the fewest row parts that fit; where none
    does, its layers one at a time."""
    rows = jax.tree_util.tree_leaves(types[0])[0].shape[0]
    # The compiled programs, called as they are: calling the jitted
    # function would trace trax's layers again and compile a second time.
    compiled = {}

    def weigh(parts):
      fn = jax.jit(functions.metrics_function(self._model_with_metrics, parts))
      compiled[parts] = fn.trace(*types).lower().compile()
      return device_memory.ProgramMemory.from_compiled(compiled[parts])

    plan, least, refusal = planning.search_parts(rows, weigh, self.budget_bytes)
    if plan is not None:
      return PlannedEval(plan, _Whole(compiled[plan.parts], self._device))
    # No plan fits: there is a budget, and `least` is the most parts'.
    assert least is not None and self.budget_bytes is not None
    whole = planning.nothing_fits(least, refusal, self.budget_bytes)
    model, _ = functions.model_and_metrics(self._model_with_metrics)
    if len(segments.steps(model)) < 2:
      raise whole
    try:
      segmented = segments.Segmented(
        self._model_with_metrics, self._device, types, self.budget_bytes
      )
    except segments.SegmentsError as e:
      # The error naming the least of the two.
      if whole.least_bytes is not None and (
        e.least_bytes is None or whole.least_bytes < e.least_bytes
      ):
        raise whole from None
      raise
    return PlannedEval(segmented.plan, segmented)

  def __call__(
    self, batch: PyTree, weights: PyTree, state: PyTree, rng: PRNGKey
  ) -> tuple[Any, PyTree]:
    """The metrics of `model_with_metrics` on `batch`, as trax's
    `metrics_fn`.

    Args:
      batch: the eval batch, host arrays of shape (B, ...).
      weights, state: ((model's, metrics layer's)), host arrays.
      rng: the eval's JAX PRNG key.

    Returns:
      (metric values as host arrays, `state` as given: trax's `Loop`
      discards the state).

    Raises:
      planning.EvalMemoryBudgetError: see `planned`.
    """
    planned = self.planned(batch, weights, state, rng)
    return planned.run(batch, weights, state, rng), state
