"""The loss program over batch slices and sequence chunks.

Slices of a loss combine as `loss_combination.loss_combination` says; a
loss whose slices cannot be combined runs on the whole batch (the planner
accounts its unsliced program). The loss layer's own program may also run
its tail over chunks of the sequence: `loss_tail` says where the loss
layer's position-wise tail starts and what sequence length its chunks
split; this module builds the functions that run it: `chunked_grads` (the
head on whole rows, the tail over k chunks) and `pieces_grads` (a
whole-tail loss layer over row slices times chunks, in place), both
looping over pieces with `_pieces`. Separate from `loss_tail` because the
planner reads the tail's facts without building any program.
"""

import contextlib
from typing import Callable, Sequence

import jax
from jax import lax
from jax import numpy as jnp
import numpy as np
from trax import fastmath
from trax import layers as tl
from trax.optimizers import base as optimizer_base

from trax_revplus.trainer._step import chains
from trax_revplus.trainer._step import fused_fns
from trax_revplus.trainer._step import loss_tail
from trax_revplus.trainer._step import row_draws
from trax_revplus.trainer._step import slices
from trax_revplus.trainer._step import step_fns
from trax_revplus.trainer._step import ties as ties_lib
from trax_revplus.trainer._step.loss_combination import loss_combination
from trax_revplus.trainer._step.loss_tail import items_of
from trax_revplus.trainer._step.loss_tail import joined
from trax_revplus.trainer._step.loss_tail import parts_of
from trax_revplus.trainer._step.loss_tail import rngs_of
from trax_revplus.trainer._step.loss_tail import sequence_length
from trax_revplus.trainer._step.loss_tail import stack_of
from trax_revplus.trainer._step.loss_tail import sublayers_of
from trax_revplus.trainer._step.loss_tail import tail_start
from trax_revplus.trainer._step.slices import add
from trax_revplus.trainer._step.slices import FLOAT0
from trax_revplus.trainer._step.slices import n_rows
from trax_revplus.trainer._step.slices import Rows
from trax_revplus.trainer._step.slices import States
from trax_revplus.trainer._step.slices import zeros
from trax_revplus.typing import Array
from trax_revplus.typing import PRNGKey
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
    slices.scan_rows(
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
  rows = slices.state_rows(layer)

  def sliced(inputs, weights, grads, state, slots, opt_params, rng, step):
    # The loss's cotangent is 1; a micro-batch's `grads` are the batch's
    # loss weights.
    all_weights = grads if micro else None
    if in_place(layer, inputs, state):
      # The whole loss layer is its tail: slices and chunks as pieces of
      # one loop, in place.
      loss, grads_inputs, grads_weights, new_state = pieces_grads(
        layer, k if combine else 1, chunks, rng
      )(inputs, weights, state, all_weights)
    elif chunks > 1:
      loss, grads_inputs, grads_weights, new_state = _loss_and_grads(
        chunked_grads(layer, chunks, rng),
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
  scan: bool = False,
) -> Callable[..., tuple]:
  """`fused_fns.fused_loss_fn` over k slices where `loss_combination`
  allows; unsliced otherwise; `scan` as there.

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
      layers, optimizers, n_devices, adasum, in_call, scan
    )
  blocks = chains.looped_blocks(layers) if scan else []
  forward = chains.chain_forward_fn(layers, blocks)
  updates = [step_fns.update_fn(opt, n_devices, adasum) for opt in optimizers]
  together = step_fns.updated_together(blocks, optimizers, adasum)

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
      together,
    )

  return sliced


# The loss layer's programs over chunks of the sequence and slices of rows.


def _pieces(
  forward,
  combine,
  items,
  weights,
  states,
  rngs,
  k,
  chunks,
  factor,
  all_weights=None,
):
  """Loss and gradients of `forward` (a chain from stack items to a loss)
  over k row slices times `chunks` chunks of the sequence, in one loop.

  Each piece reads its rows and positions from `items` as they are and writes
  its items' cotangents into one buffer of their shape, so the loop holds one
  piece's temporaries (a loop over stacked slices would copy the items and
  their cotangents). A piece's loss is scaled by `factor` times its share
  (`combine` of its loss weights and `all_weights`, by default the loss
  weights among `items`); with chunks each layer draws with its RNG folded
  with the chunk's index, without them with its RNG, its `Dropout` masks
  the slice's rows of the unsliced ones (`row_draws`, as batch slices).

  Returns:
    (loss, items' cotangents (list), weights' gradients, new states).

  Raises (when traced):
    ValueError: chunks > 1 and the items do not share a sequence length
      (`sequence_length`) that chunks divides.
  """
  b = items[0].shape[0] // k
  n = None
  if chunks > 1:
    length = sequence_length(items)
    if length is None or length % chunks:
      raise ValueError(
        f"{chunks} sequence chunks: the loss layer's tail reads items "
        f'of shapes {[tuple(x.shape) for x in items]}, which do not share '
        f'a sequence length (axis 1, before a feature axis) that {chunks} '
        f'divides.'
      )
    n = length // chunks
  floats = [
    i for i, x in enumerate(items) if jnp.issubdtype(x.dtype, jnp.inexact)
  ]
  whole = items[-1] if all_weights is None else all_weights

  def starts(x, s, j):
    at = [s * b] + [0] * (x.ndim - 1)
    if n is not None:
      at[1] = j * n
    return at

  def sizes(x):
    return (
      [b]
      + ([n] if n is not None else [])
      + list(x.shape[1 if n is None else 2 :])
    )

  def body(p, carry):
    loss, bufs, acc, _ = carry
    s, j = p // chunks, p % chunks
    part = [lax.dynamic_slice(x, starts(x, s, j), sizes(x)) for x in items]
    share = factor * lax.stop_gradient(combine(part[-1], whole))
    # A piece whose loss weights are all 0 adds 0: its weights are swapped
    # for ones so that its own mean stays finite.
    part[-1] = jnp.where(share > 0, part[-1], jnp.ones_like(part[-1]))
    piece_rngs = [jax.random.fold_in(r, j) for r in rngs] if n else rngs

    def scaled(y, w):
      out, new_states = forward(y, w, states, piece_rngs)
      return out * share.astype(out.dtype), new_states

    # Without chunks a piece is a batch slice: its masks are its rows of
    # the unsliced ones (`row_draws`).
    draws = (
      row_draws.slice_of(s, k)
      if n is None and k > 1
      else contextlib.nullcontext()
    )
    with draws:
      out, vjp_fn, new_states = fastmath.vjp(
        scaled, stack_of(part), weights, has_aux=True
      )
    grads_part, grads_weights = vjp_fn(jnp.ones((), out.dtype))
    grads_part = items_of(grads_part)
    bufs = [
      lax.dynamic_update_slice(
        buf, grads_part[i].astype(buf.dtype), starts(buf, s, j)
      )
      for i, buf in zip(floats, bufs)
    ]
    acc = jax.tree_util.tree_map(jnp.add, acc, grads_weights)
    return loss + out.astype(loss.dtype), bufs, acc, new_states

  loss, bufs, grads_weights, new_states = lax.fori_loop(
    0,
    k * chunks,
    body,
    (
      jnp.zeros((), jnp.float32),
      [jnp.zeros_like(items[i]) for i in floats],
      jax.tree_util.tree_map(jnp.zeros_like, weights),
      list(states),
    ),
  )
  grads_items = [_zero_cotangent(x) for x in items]
  for i, buf in zip(floats, bufs):
    grads_items[i] = buf
  return loss, grads_items, grads_weights, new_states


def chunked_grads(
  loss_layer: tl.Layer, k: int, rng: PRNGKey
) -> Callable[..., tuple]:
  """The loss layer's loss and gradients with its tail over k chunks.

  The head (`tail_start`) runs forward and backward once, on whole rows;
  the tail over the chunks (`_pieces`).

  Args:
    loss_layer: the trainer's loss layer (`tail_start` not None).
    k: int >= 2, chunks of the sequence.
    rng: the loss layer's RNG of the step.

  Returns:
    `(inputs, weights, state, factor) -> (loss, grads_inputs,
    grads_weights, new_state)`: the loss layer's output times `factor` (a
    float32 scalar, 1 for a whole call, a batch slice's share otherwise)
    and its gradients with respect to `inputs` (the loss layer's input
    stack items, rows first and the sequence second) and `weights`.

  Raises (when traced):
    ValueError: the tail's inputs do not share a sequence length that k
      divides.
  """
  start = tail_start(loss_layer)
  subs = sublayers_of(loss_layer)
  head = chains.segment_forward_fn(subs[:start])
  tail = chains.segment_forward_fn(subs[start:])
  combine = loss_combination(subs[start:])

  def grads(inputs, weights, state, factor):
    ws, ss = parts_of(loss_layer, weights, state)
    rngs = rngs_of(loss_layer, rng)
    if start:
      y, head_vjp, head_states = fastmath.vjp(
        lambda x, w: head(x, w, ss[:start], rngs[:start]),
        inputs,
        ws[:start],
        has_aux=True,
      )
    else:
      y, head_vjp, head_states = inputs, None, []
    loss, grads_y, grads_tail, tail_states = _pieces(
      tail,
      combine,
      items_of(y),
      ws[start:],
      ss[start:],
      rngs[start:],
      1,
      k,
      factor,
    )
    grads_y = stack_of(grads_y)
    if start:
      grads_inputs, grads_head = head_vjp(grads_y)
    else:
      grads_inputs, grads_head = grads_y, []
    return (
      loss,
      grads_inputs,
      joined(loss_layer, list(grads_head) + list(grads_tail)),
      joined(loss_layer, list(head_states) + list(tail_states)),
    )

  return grads


def in_place(loss_layer: tl.Layer, inputs: PyTree, state: PyTree) -> bool:
  """Whether `pieces_grads` can run the loss layer's call: its tail is the
  whole layer, and its state holds nothing per row (as batch slices split
  state: `slices.States`)."""
  if tail_start(loss_layer) != 0:
    return False
  rows = items_of(inputs)[0].shape[0]
  return not slices.States(
    state, slices.state_rows(loss_layer), rows, 1
  ).scanned


def pieces_grads(
  loss_layer: tl.Layer, k: int, chunks: int, rng: PRNGKey
) -> Callable[..., tuple]:
  """The loss layer's loss and gradients over k row slices times `chunks`
  chunks of the sequence, in one loop, in place (`_pieces`): the call
  holds, beyond its arguments and results, one piece's temporaries.

  Args:
    loss_layer: the trainer's loss layer (`in_place` True).
    k: int >= 1, slices of the call's rows.
    chunks: int >= 1, chunks of the sequence (1: whole rows).
    rng: the loss layer's RNG of the step.

  Returns:
    `(inputs, weights, state, all_weights=None) -> (loss, grads_inputs,
    grads_weights, new_state)`; `all_weights`: the loss weights each
    piece's share is of (`_pieces`).
  """
  subs = sublayers_of(loss_layer)
  forward = chains.segment_forward_fn(subs)
  combine = loss_combination(subs)

  def grads(inputs, weights, state, all_weights=None):
    ws, ss = parts_of(loss_layer, weights, state)
    loss, grads_inputs, grads_ws, new_states = _pieces(
      forward,
      combine,
      items_of(inputs),
      ws,
      ss,
      rngs_of(loss_layer, rng),
      k,
      chunks,
      jnp.ones((), jnp.float32),
      all_weights,
    )
    return (
      loss,
      stack_of(grads_inputs),
      joined(loss_layer, grads_ws),
      joined(loss_layer, new_states),
    )

  return grads


def _zero_cotangent(x: Array) -> Array | np.ndarray:
  """The cotangent of an input the tail does not differentiate: float0
  zeros for an integer input (as `jax.vjp` gives), zeros otherwise."""
  if jnp.issubdtype(x.dtype, jnp.inexact):
    return jnp.zeros_like(x)
  return np.zeros(x.shape, FLOAT0)
