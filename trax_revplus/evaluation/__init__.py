"""Evals of a memory-efficient `training.Loop`, on the trainer's device.

trax's memory-efficient `Loop` runs its evals on the host's CPU device;
with trax_revplus active (`swap`) they run on the device the trainer steps
on, planned under the same device memory budget as its step.

Modules:

  functions   the function an eval compiles: the model over row parts of
              the eval batch, then the metrics once on the whole batch
  planning    `EvalPlan`: the fewest parts whose program fits the budget
  segments    where not even one row of the whole model fits: its layers
              one program each, their weights placed per layer
  evaluator   `DeviceEvaluator`: trax's `metrics_fn`, planned once per
              batch shapes, arguments placed and their copies freed

See docs/device-memory.md ("Evals") for the method.
"""

from trax_revplus.evaluation.evaluator import DeviceEvaluator
from trax_revplus.evaluation.planning import EvalMemoryBudgetError
from trax_revplus.evaluation.planning import EvalPlan

__all__ = ['DeviceEvaluator', 'EvalMemoryBudgetError', 'EvalPlan']
