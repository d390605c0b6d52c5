"""Chains of layers on trax's stack: their depth, forward and reverse walks.

A chain runs its layers in order on the top items of the stack, each layer
reading its `n_in` items and writing its `n_out` in their place (as
`tl.Serial` does), and a chain of reversible layers runs backwards from its
outputs, last layer to first. The step functions (`step_fns`, `slices`,
`loss_slices`) build their programs from these walks, so that every program
walks a chain the same way.
"""

from typing import Any, Callable, Sequence

import jax
from trax import layers as tl
from trax.layers import combinators as cb
from trax.layers import reversible as trax_reversible

from trax_revplus.typing import PRNGKey
from trax_revplus.typing import PyTree
from trax_revplus.typing import Stack


def chain_depth(layers: Sequence[tl.Layer]) -> int:
  """Stack items a chain of layers reads (`tl.Serial(layers).n_in`)."""
  needed, depth = 0, 0
  for layer in layers:
    if depth < layer.n_in:
      needed += layer.n_in - depth
      depth = layer.n_in
    depth += layer.n_out - layer.n_in
  return needed


def is_reversible(layer: tl.Layer) -> bool:
  """Whether `layer` is a trax reversible layer (has `reverse`)."""
  return isinstance(layer, trax_reversible.ReversibleLayer)


def segment_forward_fn(
  layers: Sequence[tl.Layer],
) -> Callable[..., tuple[Stack, list[PyTree]]]:
  """Forward of consecutive reversible layers in one call.

  The layers run in order on the top items of the stack, each with its
  own weights, state and RNG, exactly as one call per layer would. A
  reversible layer may change the stack's depth (`tl.ReversibleSelect([0,
  0])` reads 1 item and writes 2).

  Args (of the returned function):
    inputs: the top `chain_depth(layers)` stack items (an array if 1).
    weights, states, rngs: lists, one entry per layer.

  Returns (of the returned function):
    (outputs, new_states): the stack items the layers wrote in place of
    `inputs` (`chain_depth(layers)` plus each layer's `n_out - n_in`);
    list of each layer's new state.
  """

  def forward(inputs, weights, states, rngs):
    stack = inputs
    new_states = []
    for layer, w, s, rng in zip(layers, weights, states, rngs):
      x = cb.inputs_from_stack(stack, layer.n_in)
      y, new_state = layer.pure_fn(x, w, s, rng)
      stack = cb.outputs_onto_stack(y, stack, layer.n_in)
      new_states.append(new_state)
    return stack, new_states

  return forward


def reverse_chain(
  layers: Sequence[tl.Layer],
  stack: Stack,
  grad_stack: Stack,
  reverse_layer: Callable[..., tuple[Stack, Stack]],
) -> tuple[Stack, Stack]:
  """Walks a chain of reversible layers backwards, last layer to first.

  Args:
    layers: the chain's layers, in forward order.
    stack: the stack items the chain's forward wrote (its outputs).
    grad_stack: their cotangents.
    reverse_layer: `(k, outputs, cotangents) -> (inputs, input
      cotangents)` of layer k, given its `n_out` top items of each stack.

  Returns:
    (stack, grad_stack): the chain's reconstructed inputs and their
    cotangents.
  """
  for k in range(len(layers) - 1, -1, -1):
    n_out = layers[k].n_out
    x, x_ct = reverse_layer(
      k,
      cb.inputs_from_stack(stack, n_out),
      cb.inputs_from_stack(grad_stack, n_out),
    )
    stack = cb.outputs_onto_stack(x, stack, n_out)
    grad_stack = cb.outputs_onto_stack(x_ct, grad_stack, n_out)
  return stack, grad_stack


def reverse_and_grad_chain(
  layers: Sequence[tl.Layer],
  stack: Stack,
  grad_stack: Stack,
  weights: Sequence[PyTree],
  states: Sequence[PyTree],
  new_states: Sequence[PyTree],
  rngs: Sequence[PRNGKey],
) -> tuple[Stack, Stack, list[PyTree]]:
  """Each layer's `reverse_and_grad`, last to first (`reverse_chain`): trax's
  `ReversibleSerial.reverse_and_grad` with each layer's own weights, states
  and RNG (lists over the layers).

  Returns:
    (stack, grad_stack, grads_weights): the reconstructed inputs, their
    cotangents, and the list of each layer's weight gradients.
  """
  grads_weights = [None] * len(layers)

  def reverse_layer(k, y, y_ct):
    x, (x_ct, grads_weights[k]) = layers[k].reverse_and_grad(
      y, y_ct, weights[k], states[k], new_states[k], rng=rngs[k]
    )
    return x, x_ct

  stack, grad_stack = reverse_chain(layers, stack, grad_stack, reverse_layer)
  return stack, grad_stack, grads_weights


def reversible_run_fn(
  layers: Sequence[tl.Layer],
) -> Callable[..., tuple[Stack, list[PyTree]]]:
  """Forward of consecutive reversible layers whose gradient recomputes.

  The forward is `segment_forward_fn`'s. Its custom gradient holds the
  run's outputs (not each layer's activations) and runs each layer's
  `reverse_and_grad`, last to first (`reverse_and_grad_chain`), as
  `step_fns.segment_reverse_fn` does without the updates.

  Returns (of the returned function):
    (inputs, weights, states, rngs) -> (outputs, new_states), as
    `segment_forward_fn`; differentiable in `inputs` and `weights`.
  """
  forward = segment_forward_fn(layers)

  @jax.custom_vjp
  def run(inputs, weights, states, rngs):
    return forward(inputs, weights, states, rngs)

  def run_forward(inputs, weights, states, rngs):
    outputs, new_states = forward(inputs, weights, states, rngs)
    return (outputs, new_states), (outputs, weights, states, new_states, rngs)

  def run_backward(residuals, cotangents):
    stack, weights, states, new_states, rngs = residuals
    # New states take no cotangent.
    _, grad_stack, grads_weights = reverse_and_grad_chain(
      layers, stack, cotangents[0], weights, states, new_states, rngs
    )
    return grad_stack, grads_weights, None, None

  run.defvjp(run_forward, run_backward)
  return run


def chain_forward_fn(
  layers: Sequence[tl.Layer],
) -> Callable[..., tuple[Stack, list[PyTree]]]:
  """Forward of consecutive layers (standard and reversible) in one call,
  differentiable as trax's default `Trainer` differentiates them.

  Each run of consecutive reversible layers goes under one custom gradient
  that holds only the run's outputs and reverses its layers from them,
  last to first (`reversible_run_fn`), as trax's `ReversibleSerial` does
  in the default `Trainer`; the other layers run `pure_fn`.

  Returns (of the returned function):
    (inputs, weights, states, rngs) -> (outputs, new_states): lists over
    the layers; `inputs` are the top `chain_depth(layers)` stack items.
  """
  runs = _runs(layers)

  def forward(inputs, weights, states, rngs):
    stack, new_states = inputs, []
    for start, stop, fn in runs:
      if fn is not None:
        depth = chain_depth(layers[start:stop])
        y, run_states = fn(
          cb.inputs_from_stack(stack, depth),
          list(weights[start:stop]),
          list(states[start:stop]),
          list(rngs[start:stop]),
        )
        stack = cb.outputs_onto_stack(y, stack, depth)
        new_states.extend(run_states)
        continue
      layer = layers[start]
      y, new_state = layer.pure_fn(
        cb.inputs_from_stack(stack, layer.n_in),
        weights[start],
        states[start],
        rngs[start],
      )
      stack = cb.outputs_onto_stack(y, stack, layer.n_in)
      new_states.append(new_state)
    return stack, new_states

  return forward


def _runs(layers):
  """(start, stop, fn) over `layers` in order: a run of consecutive
  reversible layers as one `reversible_run_fn`, every other layer alone
  with fn None."""
  runs: list[tuple[int, int, Any]] = []
  i = 0
  while i < len(layers):
    j = i + 1
    if is_reversible(layers[i]):
      while j < len(layers) and is_reversible(layers[j]):
        j += 1
      runs.append((i, j, reversible_run_fn(layers[i:j])))
    else:
      runs.append((i, j, None))
    i = j
  return runs
