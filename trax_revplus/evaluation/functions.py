"""The function an eval compiles: the model over row parts, then the metrics.

trax's memory-efficient `Loop` evaluates `model_with_metrics =
tl.Serial(model, tl.Branch(*metrics))` (`training._model_with_metrics`) on
each eval batch. `metrics_function` computes what that `Serial`'s
`pure_fn` computes, with the model's forward run over k equal parts of the
batch's rows, one part at a time inside one `lax.scan` (`trainer._step.slices`:
per-row layer state split with the rows, trax's `Dropout` masks drawn as
for the whole batch), so that the program keeps one part's intermediates
at a time; the parts' outputs are put back together and the metrics layer
runs once, on the whole batch's outputs. trax's metrics are weighted means
over the batch, which the mean of the parts' metrics is not where the
parts' loss weights differ; their inputs (logits-sized) are small beside
the model's intermediates.
"""

from typing import Callable

from trax import fastmath
from trax import layers as tl
from trax.layers import combinators

from trax_revplus.trainer._step import slices
from trax_revplus.typing import Array
from trax_revplus.typing import PRNGKey
from trax_revplus.typing import PyTree


def model_and_metrics(
  model_with_metrics: tl.Layer,
) -> tuple[tl.Layer, tl.Layer]:
  """(model, metrics layer) of trax's `tl.Serial(model, metrics_layer)`.

  Raises:
    ValueError: `model_with_metrics` is not a `tl.Serial` of two layers.
  """
  layers = model_with_metrics.sublayers
  if not isinstance(model_with_metrics, tl.Serial) or len(layers) != 2:
    raise ValueError(
      f"expected trax's model with metrics, tl.Serial(model, metrics), "
      f'got {model_with_metrics.name} with {len(layers)} sublayers.'
    )
  return layers[0], layers[1]


def metrics_function(
  model_with_metrics: tl.Layer, parts: int
) -> Callable[[PyTree, PyTree, PyTree, PRNGKey], PyTree]:
  """`model_with_metrics.pure_fn`'s outputs, the model over `parts` parts.

  Args:
    model_with_metrics: trax's `tl.Serial(model, metrics_layer)`.
    parts: int >= 1 dividing the eval batch's rows; 1 runs the model on
      the whole batch, exactly as `pure_fn`.

  Returns:
    `fn(batch, weights, state, rng) -> outputs`, to be traced (`jax.jit`):
    `batch` the stack (e.g. (inputs, targets, weights), arrays of shape
    (B, ...)), `weights` and `state` the `Serial`'s ((model's, metrics
    layer's)), `rng` the eval's key; `outputs` what `pure_fn` returns as
    its first item (one scalar per metric). The RNG splits as the `Serial`
    splits it over its two layers. New layer state is not returned
    (trax's `Loop` discards it).
  """
  model, metrics = model_and_metrics(model_with_metrics)
  rows = slices.state_rows(model)

  def model_forward(inputs, weights, state, rng):
    return model.pure_fn(inputs, weights, state, rng)

  forward = slices.forward(model_forward, parts, rows)

  def evaluate(
    batch: PyTree, weights: PyTree, state: PyTree, rng: PRNGKey
  ) -> Array:
    model_rng, metrics_rng = fastmath.random.split(rng, 2)
    stack = batch
    outputs, _ = forward(
      combinators.inputs_from_stack(stack, model.n_in),
      weights[0],
      state[0],
      model_rng,
    )
    stack = combinators.outputs_onto_stack(outputs, stack, model.n_in)
    values, _ = metrics.pure_fn(
      combinators.inputs_from_stack(stack, metrics.n_in),
      weights[1],
      state[1],
      metrics_rng,
    )
    return combinators.outputs_onto_stack(values, stack, metrics.n_in)

  return evaluate
