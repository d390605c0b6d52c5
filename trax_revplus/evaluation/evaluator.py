"""`DeviceEvaluator`: trax's eval `metrics_fn`, planned on the trainer's device.

trax's memory-efficient `Loop` evaluates with `metrics_fn =
_accelerate_model_with_metrics(model_with_metrics, 0)`: the whole model's
forward on the whole eval batch, jitted on the host's CPU device, beside an
accelerator that the train step plans to fit. A `DeviceEvaluator` is that
`metrics_fn` on the first device the trainer steps on (its `placement`),
planned under the trainer's device memory budget (`planning`): before the
first eval on a batch's shapes, the fewest parts of the batch's rows whose
program fits, compiled once and logged once (`eval device memory plan:`).
At each call the arguments (the eval batch, the host weights and state the
`Loop` passes, the RNG) are placed on that device, the program runs, the
metrics come back to the host and the copies placed for it are deleted.
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
from trax_revplus.layers import preserved
from trax_revplus.typing import PRNGKey
from trax_revplus.typing import PyTree


class PlannedEval(NamedTuple):
  """An eval on one batch's shapes.

  Attributes:
    plan: its `planning.EvalPlan`.
    fn: the jitted `functions.metrics_function` of `plan.parts`, compiled
      for these shapes on the evaluator's device.
  """
  plan: planning.EvalPlan
  fn: Callable[..., Any]


class DeviceEvaluator:
  """trax's eval `metrics_fn` on one device of a trainer, planned.

  Called as trax's `run_evals` calls `_Evaluator.metrics_fn`:
  `metrics_fn(batch, (model weights, metrics weights), (model state,
  metrics state), rng) -> (metric values, state)`.
  """

  def __init__(self, model_with_metrics: tl.Layer,
               placement: placement_lib.Placement,
               budget_bytes: int | None):
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
    self._device = placement_lib.OneDevice(placement.devices[0],
                                           placement.transfers)
    self.budget_bytes = budget_bytes
    self._planned = {}  # argument types key -> PlannedEval

  @property
  def device(self) -> jax.Device:
    """The device the eval runs on."""
    return self._device.device

  def planned(self, batch: PyTree, weights: PyTree, state: PyTree,
              rng: PRNGKey) -> PlannedEval:
    """The `PlannedEval` of these arguments' shapes, planned (compiled,
    accounted, logged) on first sight; the arguments' values are not
    read.

    Raises:
      planning.EvalMemoryBudgetError: not even one row per part fits the
        budget.
    """
    args = (batch, weights, state, rng)
    key = program_lib.types_key(args)
    if key not in self._planned:
      self._planned[key] = self._plan(args)
    return self._planned[key]

  def _plan(self, args):
    types = self._device.types(args)
    rows = jax.tree_util.tree_leaves(types[0])[0].shape[0]
    fns = {}

    def weigh(parts):
      fn = jax.jit(functions.metrics_function(self._model_with_metrics,
                                              parts))
      with preserved(self._model_with_metrics):
        compiled = fn.trace(*types).lower().compile()
      fns[parts] = fn
      return device_memory.ProgramMemory.from_compiled(compiled)
    plan = planning.plan_parts(rows, weigh, self.budget_bytes)
    logging.info('eval device memory plan on %s: %s', self.device,
                 plan.describe(self.budget_bytes))
    return PlannedEval(plan, fns[plan.parts])

  def __call__(self, batch: PyTree, weights: PyTree, state: PyTree,
               rng: PRNGKey) -> tuple[Any, PyTree]:
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
    args = (batch, weights, state, rng)
    planned = self.planned(*args)
    placed, copies = self._device.put(args)
    try:
      with preserved(self._model_with_metrics):
        values = planned.fn(*placed)
      values = jax.device_get(values)
    finally:
      del placed
      self._device.release(copies, args)
    return values, state
