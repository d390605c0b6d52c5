"""The loss program over batch slices and sequence chunks.

Slices of a loss combine as `loss_combination.loss_combination` says; a
loss whose slices cannot be combined runs on the whole batch (the planner
accounts its unsliced program). The loss layer's own program may also run
its tail over chunks of the sequence (`loss_tail`, `loss_chunks`).
"""

from typing import Callable, Sequence

from jax import lax
from jax import numpy as jnp
from trax import fastmath
from trax import layers as tl
from trax.optimizers import base as optimizer_base

from trax_revplus.trainer._step import chains
from trax_revplus.trainer._step import fused_fns
from trax_revplus.trainer._step import loss_chunks
from trax_revplus.trainer._step import loss_tail
from trax_revplus.trainer._step import slice_loop
from trax_revplus.trainer._step import slice_states
from trax_revplus.trainer._step import step_fns
from trax_revplus.trainer._step import ties as ties_lib
from trax_revplus.trainer._step.loss_combination import loss_combination
from trax_revplus.trainer._step.slice_states import n_rows
from trax_revplus.trainer._step.slice_states import Rows
from trax_revplus.trainer._step.slice_states import States
from trax_revplus.trainer._step.slices import add
from trax_revplus.trainer._step.slices import zeros
from trax_revplus.typing import PyTree


def vjp_grads(loss_fn: Callable[..., tuple]) -> Callable[..., tuple]:
  """`(x, weights, states, factor) -> (loss, grads_inputs, grads_weights,
  new_states)` of `loss_fn(x, weights, states) -> (loss, new_states)`, its
  loss times `factor`, differentiated whole (`fastmath.vjp`)."""

  def grads(x, weights, states, factor):
    def scaled(x_, w_):
      loss, new_s = loss_fn(x_, w_, states)
      return loss * factor.astype(loss.dtype), new_s

    loss, vjp_fn, new_s = fastmath.vjp(scaled, x, weights, has_aux=True)
    grads_inputs, grads_weights = vjp_fn(jnp.ones((), dtype=loss.dtype))
    return loss, grads_inputs, grads_weights, new_s

  return grads


def _sliced_loss(
  grads_fn, combine, k, inputs, weights, states, rows, all_weights=None
):
  """Runs `grads_fn` (as `vjp_grads` returns) over k slices of `inputs`,
  each loss scaled by `combine` of its loss weights and `all_weights` (the
  loss weights of the whole batch, by default those of `inputs`); returns
  (loss, grads_inputs, grads_weights, new_states)."""
  st = States(states, rows, n_rows(inputs), k)
  xs = Rows(inputs, k)
  loss_weights = inputs[-1] if all_weights is None else all_weights

  def body(carry, scanned):
    acc, _ = carry
    x, state_rows_ = scanned
    x = xs.slice(x)
    factor = lax.stop_gradient(combine(x[-1], loss_weights))
    # A slice whose loss weights are all 0 contributes 0: its weights are
    # swapped for ones so that its own mean stays finite.
    safe = jnp.where(factor > 0, x[-1], jnp.ones_like(x[-1]))
    x = tuple(x[:-1]) + (safe,)
    loss, grads_inputs, grads_weights, new_s = grads_fn(
      x, weights, st.slice(state_rows_), factor
    )
    per_row, new_shared = st.parts(new_s)
    return (add(acc, grads_weights), new_shared), (loss, grads_inputs, per_row)

  (grads_weights, shared), (losses, _, per_row), grads_inputs = (
    slice_loop.scan_rows(
      body, (zeros(weights), st.shared), (xs.scanned, st.scanned), k, rows_at=1
    )
  )
  return (
    jnp.sum(losses),
    grads_inputs(),
    grads_weights,
    st.join(per_row, shared),
  )


def _loss_and_grads(
  grads_fn, combine, k, inputs, weights, state, rows, all_weights=None
):
  """`grads_fn` over k slices where `combine` allows, else whole."""
  if combine is None:
    return grads_fn(inputs, weights, state, jnp.ones((), jnp.float32))
  return _sliced_loss(
    grads_fn, combine, k, inputs, weights, state, rows, all_weights
  )


def loss_fbo(
  layer: tl.Layer,
  optimizer: optimizer_base.Optimizer,
  n_devices: int,
  adasum: bool,
  k: int,
  chunks: int = 1,
  mode: step_fns.Update = step_fns.Update.NOW,
) -> Callable[..., tuple]:
  """`step_fns.fbo_fn` of the loss layer (`Kind.LOSS`) over k slices where
  `loss_combination` allows (unsliced otherwise), its tail over `chunks`
  chunks of the sequence (`loss_tail`).

  With `mode` other than `Update.NOW` the call is one micro-batch's
  (`units.Units.walk`): its cotangent argument (`Kind.LOSS`'s third) is the
  loss weights of the whole batch on this device, and its loss is scaled
  by its share of them.

  Raises:
    ValueError: chunks > 1 and the loss layer has no tail that can run in
      chunks (`loss_tail.tail_start`); a micro-batch's loss that
      `loss_combination` cannot combine.
  """
  if chunks > 1 and loss_tail.tail_start(layer) is None:
    raise ValueError(
      f'{chunks} sequence chunks: the loss layer '
      f'{layer.name} has no position-wise tail to run in '
      f'chunks.'
    )
  micro = mode is not step_fns.Update.NOW
  combine = loss_combination([layer]) if k > 1 or micro else None
  if micro and combine is None:
    raise ValueError(
      f'micro-batches: the loss layer {layer.name} is not a '
      f'weighted mean or sum they can combine.'
    )
  if combine is None and chunks == 1:
    return step_fns.fbo_fn(layer, optimizer, n_devices, adasum, 'loss')
  update = step_fns.update_fn(optimizer, n_devices, adasum, mode)
  rows = slice_states.state_rows(layer)

  def sliced(inputs, weights, grads, state, slots, opt_params, rng, step):
    # The loss's cotangent is 1; a micro-batch's `grads` are the batch's
    # loss weights.
    all_weights = grads if micro else None
    if loss_chunks.in_place(layer, inputs, state):
      # The whole loss layer is its tail: slices and chunks as pieces of
      # one loop, in place.
      loss, grads_inputs, grads_weights, new_state = loss_chunks.pieces_grads(
        layer, k if combine else 1, chunks, rng
      )(inputs, weights, state, all_weights)
    elif chunks > 1:
      loss, grads_inputs, grads_weights, new_state = _loss_and_grads(
        loss_chunks.chunked_grads(layer, chunks, rng),
        combine,
        k,
        inputs,
        weights,
        state,
        rows,
        all_weights,
      )
    else:
      loss, grads_inputs, grads_weights, new_state = _sliced_loss(
        vjp_grads(lambda x, w, s: layer.pure_fn(x, w, s, rng)),
        combine,
        k,
        inputs,
        weights,
        state,
        rows,
        all_weights,
      )
    new_weights, new_slots, stats = update(
      grads_weights, weights, slots, opt_params, step
    )
    stats = dict(stats)
    stats['loss'] = loss
    return new_weights, new_state, new_slots, grads_inputs, stats

  return sliced


def fused_loss(
  layers: Sequence[tl.Layer],
  optimizers: Sequence[optimizer_base.Optimizer],
  n_devices: int,
  adasum: bool,
  k: int,
  rows: PyTree,
  in_call: ties_lib.InCall = (),
) -> Callable[..., tuple]:
  """`fused_fns.fused_loss_fn` over k slices where `loss_combination`
  allows; unsliced otherwise.

  Raises:
    ValueError: k > 1 and the layers share weights (`in_call`, see
      `fused_fns.fused_loss_fn`): trax updates the later holder before the
      earlier holder's backward, which a sum of slices' gradients cannot
      follow (the planner offers no such plan, `candidates.Candidates`).
  """
  if in_call and k > 1:
    raise ValueError(
      f'a fused program of {k} batch slices cannot update '
      f'weights its layers share as trax does'
    )
  combine = loss_combination(layers) if k > 1 else None
  if combine is None:
    return fused_fns.fused_loss_fn(
      layers, optimizers, n_devices, adasum, in_call
    )
  forward = chains.chain_forward_fn(layers)
  updates = [step_fns.update_fn(opt, n_devices, adasum) for opt in optimizers]

  def sliced(inputs, weights, states, slots, opt_params, rngs, step):
    loss, grads_inputs, grads_weights, new_states = _sliced_loss(
      vjp_grads(lambda x, ws, ss: forward(x, ws, ss, rngs)),
      combine,
      k,
      inputs,
      weights,
      states,
      rows,
    )
    return fused_fns.apply_updates(
      updates,
      grads_weights,
      weights,
      slots,
      opt_params,
      step,
      new_states,
      grads_inputs,
      loss,
    )

  return sliced
