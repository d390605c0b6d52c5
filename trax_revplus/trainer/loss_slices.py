"""The loss program over batch slices: how slices of a loss combine.

trax's weighted means (`WeightedCategoryCrossEntropy`,
`WeightedCategoryAccuracy`, `CrossEntropyLoss`,
`CrossEntropyLossWithLogSoftmax`, `L2Loss`, `SmoothL1Loss`) are combined by
their weight sums, sum_s mean_s * den(w_s) / den(w), with the layer's own
denominator, and weighted sums (`WeightedSum`, `CrossEntropySum`) by adding,
where the loss's weights are the deepest stack item it reads, untouched by
the layers before it. Any other loss layer runs on the whole batch
(`loss_combination` is None; the planner accounts its unsliced program).
"""

from typing import Any, Callable

from jax import lax
from jax import numpy as jnp
from trax import fastmath
from trax.layers import metrics as trax_metrics

from trax_revplus.trainer import chains
from trax_revplus.trainer import fused_fns
from trax_revplus.trainer import slice_loop
from trax_revplus.trainer import slices
from trax_revplus.trainer import step_fns
from trax_revplus.trainer.slices import add
from trax_revplus.trainer.slices import n_rows
from trax_revplus.trainer.slices import Rows
from trax_revplus.trainer.slices import States
from trax_revplus.trainer.slices import zeros


def _per_core_weights(w):
  return trax_metrics._n_weights_per_core(w)  # pylint: disable=protected-access


# Final loss layers (by trax's layer name) that are weighted means, with the
# denominator they divide by.
_WEIGHTED_MEANS = {
    'WeightedCategoryCrossEntropy': _per_core_weights,
    'WeightedCategoryAccuracy': _per_core_weights,
    '_WeightedMean': _per_core_weights,
    'L2Loss': jnp.sum,
    'SmoothL1Loss': jnp.sum,
}
_WEIGHTED_SUMS = frozenset({'WeightedSum'})
# trax loss parts that mix rows (a dot product over the batch).
_MIXING_ROWS = frozenset({'_BinaryCrossEntropy'})


def _leaves(layer):
  """`layer` flattened through `tl.Serial`s (reversible layers stay whole)."""
  if type(layer).__name__ == 'Serial' and layer.sublayers:
    return [leaf for sub in layer.sublayers for leaf in _leaves(sub)]
  return [layer]


def loss_combination(layers) -> Callable[[Any], Any] | None:
  """How slices of a loss program combine, or None if they cannot.

  Args:
    layers: the layers of the loss program, in forward order (the loss
      layer last).

  Returns:
    None where the loss is not a known weighted mean or sum of its
    weights' rows, or its weights are not the deepest stack item the
    program reads, untouched by the layers before the final one; else a
    function `(slice weights, all weights) -> factor` such that the loss
    is the sum over slices of factor times the loss on the slice.
  """
  flat = [leaf for layer in layers for leaf in _leaves(layer)]
  if any(leaf.name in _MIXING_ROWS for leaf in flat):
    return None
  final = flat[-1]
  if final.name in _WEIGHTED_SUMS:
    den = None
  elif final.name in _WEIGHTED_MEANS:
    den = _WEIGHTED_MEANS[final.name]
  else:
    return None
  depth = chains.chain_depth(flat)
  for layer in flat[:-1]:
    if layer.n_in > depth - 1:
      return None
    depth += layer.n_out - layer.n_in
  if final.n_in != depth:
    return None
  if den is None:
    return lambda w_slice, w_all: jnp.ones((), jnp.float32)
  return lambda w_slice, w_all: den(w_slice) / den(w_all)


def _sliced_loss(loss_fn, combine, k, inputs, weights, states, rows):
  """Runs `loss_fn(x, weights, states) -> (loss, new_states)` over k slices
  of `inputs`, each loss scaled by `combine`; returns (loss,
  grads_inputs, grads_weights, new_states)."""
  st = States(states, rows, n_rows(inputs), k)
  xs = Rows(inputs, k)
  loss_weights = inputs[-1]

  def body(carry, scanned):
    acc, _ = carry
    x, state_rows_ = scanned
    x = xs.slice(x)
    factor = lax.stop_gradient(combine(x[-1], loss_weights))
    # A slice whose loss weights are all 0 contributes 0: its weights are
    # swapped for ones so that its own mean stays finite.
    safe = jnp.where(factor > 0, x[-1], jnp.ones_like(x[-1]))
    x = tuple(x[:-1]) + (safe,)
    s = st.slice(state_rows_)

    def scaled(x_, w_):
      loss, new_s = loss_fn(x_, w_, s)
      return loss * factor.astype(loss.dtype), new_s
    loss, vjp_fn, new_s = fastmath.vjp(scaled, x, weights, has_aux=True)
    grads_inputs, grads_weights = vjp_fn(jnp.ones((), dtype=loss.dtype))
    per_row, new_shared = st.parts(new_s)
    return (add(acc, grads_weights), new_shared), (loss, grads_inputs,
                                                    per_row)
  (grads_weights, shared), (losses, _, per_row), grads_inputs = (
      slice_loop.scan_rows(body, (zeros(weights), st.shared),
                       (xs.scanned, st.scanned), k, rows_at=1))
  return (jnp.sum(losses), grads_inputs(), grads_weights,
          st.join(per_row, shared))


def loss_fbo(layer, optimizer, n_devices: int, adasum: bool,
             k: int) -> Callable[..., tuple]:
  """`step_fns.fbo_fn` of the loss layer (`Kind.LOSS`) over k slices where
  `loss_combination` allows; unsliced otherwise."""
  combine = loss_combination([layer]) if k > 1 else None
  if combine is None:
    return step_fns.fbo_fn(layer, optimizer, n_devices, adasum, 'loss')
  update = step_fns.update_fn(optimizer, n_devices, adasum)
  rows = slices.state_rows(layer)

  def sliced(inputs, weights, grads, state, slots, opt_params, rng, step):
    del grads  # The loss's cotangent is 1.
    loss, grads_inputs, grads_weights, new_state = _sliced_loss(
        lambda x, w, s: layer.pure_fn(x, w, s, rng), combine, k, inputs,
        weights, state, rows)
    new_weights, new_slots, stats = update(grads_weights, weights, slots,
                                           opt_params, step)
    stats = dict(stats)
    stats['loss'] = loss
    return new_weights, new_state, new_slots, grads_inputs, stats
  return sliced


def fused_loss(layers, optimizers, n_devices: int, adasum: bool, k: int,
               rows, in_call=()) -> Callable[..., tuple]:
  """`fused_fns.fused_loss_fn` over k slices where `loss_combination`
  allows; unsliced otherwise.

  Raises:
    ValueError: k > 1 and the layers share weights (`in_call`, see
      `fused_fns.fused_loss_fn`): trax updates the later holder before the
      earlier holder's backward, which a sum of slices' gradients cannot
      follow (the planner offers no such plan, `candidates.Candidates`).
  """
  if in_call and k > 1:
    raise ValueError(f'a fused program of {k} batch slices cannot update '
                     f'weights its layers share as trax does')
  combine = loss_combination(layers) if k > 1 else None
  if combine is None:
    return fused_fns.fused_loss_fn(layers, optimizers, n_devices, adasum,
                                  in_call)
  forward = chains.chain_forward_fn(layers)
  updates = [step_fns.update_fn(opt, n_devices, adasum) for opt in optimizers]

  def sliced(inputs, weights, states, slots, opt_params, rngs, step):
    loss, grads_inputs, grads_weights, new_states = _sliced_loss(
        lambda x, ws, ss: forward(x, ws, ss, rngs), combine, k, inputs,
        weights, states, rows)
    return fused_fns.apply_updates(updates, grads_weights, weights, slots,
                                  opt_params, step, new_states, grads_inputs,
                                  loss)
  return sliced
