"""The fused program's step function: every layer's forward, the loss, and
every layer's backward and update in one function.

`fused_loss_fn` is what `Kind.FUSED_LOSS` compiles (over batch slices:
`loss_slices.fused_loss`), the whole-model step trax's default `Trainer`
compiles (`trax.optimizers.trainer._accelerated_update_fn`), with each
layer updated by its own optimizer as `step_fns.fbo_fn` does.
"""

from typing import Any, Callable, Sequence

from trax import fastmath
from trax import layers as tl
from trax.fastmath import numpy as jnp
from trax.layers import combinators as cb
from trax.optimizers import base as optimizer_base

from trax_revplus.trainer._step import chains
from trax_revplus.trainer._step import ties as ties_lib
from trax_revplus.trainer._step.step_fns import tied_weights
from trax_revplus.trainer._step.step_fns import update_each
from trax_revplus.trainer._step.step_fns import update_fn
from trax_revplus.trainer._step.step_fns import updated_together
from trax_revplus.typing import PyTree


def fused_loss_fn(
  layers: Sequence[tl.Layer],
  optimizers: Sequence[optimizer_base.Optimizer],
  n_devices: int,
  adasum: bool,
  in_call: ties_lib.InCall = (),
  scan: bool = False,
) -> Callable[..., tuple]:
  """Forward + backward + update of consecutive layers ending in the loss.

  The whole-model step of trax's `_accelerated_update_fn` for the layers
  given (the default `Trainer`'s), each layer updated by its own optimizer
  as `fbo_fn` does; reversible layers recompute their activations in the
  backward pass (`chains.chain_forward_fn`). The loss layer's stats hold its
  output as 'loss'.

  Weights shared between the layers (`in_call`, from `ties.Ties.in_call`)
  are updated as trax's `ReversibleSerialTrainer` updates them: the layers
  after the earlier holder are differentiated and updated first, then the
  earlier holder's forward and backward run again at the weights the later
  holder's update left (`_pieces`), as its own call would.

  With `scan`, each run of reversible layers loops over its equal blocks
  (`chains.scanned_forward_fn`) and their layers are updated by one
  mapped update per position in the block (`step_fns.update_each`): the
  program's size does not grow with their number.

  Returns (of the returned function):
    (inputs, weights, states, slots, opt_params, rngs, step) ->
    (new_weights, new_states, new_slots, grads_inputs, stats), per-layer
    values as lists over the layers.
  """
  if in_call:
    return _pieces(layers, optimizers, n_devices, adasum, in_call, scan)
  blocks = chains.looped_blocks(layers) if scan else []
  forward = chains.chain_forward_fn(layers, blocks)
  updates = [update_fn(opt, n_devices, adasum) for opt in optimizers]
  together = updated_together(blocks, optimizers, adasum)

  def fbo(inputs, weights, states, slots, opt_params, rngs, step):
    def loss_fn(x, ws):
      return forward(x, ws, states, rngs)

    loss, vjp_fn, new_states = fastmath.vjp(
      loss_fn, inputs, weights, has_aux=True
    )
    grads_inputs, grads_weights = vjp_fn(jnp.ones((), dtype=loss.dtype))
    return apply_updates(
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

  return fbo


def _stack_fn(layers, scan):
  """`chains.chain_forward_fn` of `layers` from a whole stack to a whole
  stack: (stack, weights, states, rngs) -> (stack, new_states)."""
  forward = chains.chain_forward_fn(
    layers, chains.looped_blocks(layers) if scan else ()
  )
  depth = chains.chain_depth(layers)

  def run(stack, weights, states, rngs):
    outputs, new_states = forward(
      cb.inputs_from_stack(stack, depth), weights, states, rngs
    )
    return cb.outputs_onto_stack(outputs, stack, depth), new_states

  return run


def _pieces(layers, optimizers, n_devices, adasum, in_call, scan):
  """`fused_loss_fn` where layers of the call share weights: the chain cut
  after each earlier holder into pieces, each differentiated (`vjp`) and
  updated in turn, last to first, at the weights the updates of the pieces
  after it left. The forward keeps each piece's input stack (one stack of
  activations per cut) for its backward."""
  updates = [update_fn(opt, n_devices, adasum) for opt in optimizers]
  cuts = sorted({reader for reader, _, _, _ in in_call})
  bounds = [0] + [c + 1 for c in cuts] + [len(layers)]
  pieces = [
    (a, b, _stack_fn(layers[a:b], scan)) for a, b in zip(bounds, bounds[1:])
  ]

  def fbo(inputs, weights, states, slots, opt_params, rngs, step):
    n = len(layers)
    stacks = [inputs]
    for a, b, run in pieces[:-1]:
      stacks.append(run(stacks[-1], weights[a:b], states[a:b], rngs[a:b])[0])
    new_weights: list[Any] = [None] * n
    new_slots: list[Any] = [None] * n
    new_states: list[Any] = [None] * n
    stats: list[Any] = [None] * n
    loss = cotangents = None
    for stack, (a, b, run) in reversed(list(zip(stacks, pieces))):
      ws = [
        tied_weights(k, weights[k], new_weights, in_call) for k in range(a, b)
      ]
      out, vjp_fn, new_states[a:b] = fastmath.vjp(
        lambda x, w, a=a, b=b, run=run: run(x, w, states[a:b], rngs[a:b]),
        stack,
        ws,
        has_aux=True,
      )
      if loss is None:
        loss = out
        cotangents = jnp.ones((), dtype=loss.dtype)
      cotangents, grads = vjp_fn(cotangents)
      # The piece's own layers share nothing among themselves (each cut
      # follows an earlier holder), so `ws` are the weights to update.
      new_weights[a:b], new_slots[a:b], stats[a:b] = update_each(
        updates[a:b], grads, ws, slots[a:b], opt_params[a:b], step
      )
    stats[-1]['loss'] = loss
    return new_weights, new_states, new_slots, cotangents, stats

  return fbo


def apply_updates(
  updates: Sequence[Callable[..., tuple]],
  grads_weights: Sequence[PyTree],
  weights: Sequence[PyTree],
  slots: Sequence[PyTree],
  opt_params: Sequence[PyTree],
  step: PyTree,
  new_states: list[PyTree],
  grads_inputs: PyTree,
  loss: PyTree,
  blocks: Sequence[chains.Repeats] = (),
) -> tuple[list[PyTree], PyTree, list[PyTree], PyTree, list[dict]]:
  """`update_each` (`blocks` as there), and the loss into the last
  layer's stats. Returns `fused_loss_fn`'s results."""
  new_weights, new_slots, stats = update_each(
    updates, grads_weights, weights, slots, opt_params, step, blocks=blocks
  )
  stats[-1]['loss'] = loss
  return new_weights, new_states, new_slots, grads_inputs, stats
