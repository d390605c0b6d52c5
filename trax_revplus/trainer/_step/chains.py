"""Chains of layers on trax's stack: their depth, forward and reverse walks.

A chain runs its layers in order on the top items of the stack, each layer
reading its `n_in` items and writing its `n_out` in their place (as
`tl.Serial` does), and a chain of reversible layers runs backwards from its
outputs, last layer to first. The step functions (`step_fns`, `slices`,
`loss_slices`) build their programs from these walks, so that every program
walks a chain the same way.

A deep model repeats a block of layers (a ReformerLM: attention
half-residual, swap, feed-forward half-residual, swap), each repeat with
its own weights, state and RNG. Unrolled, a program traces and compiles
every repeat anew, so its compile time grows with depth. The scanned walks
(`scanned_forward_fn`, `scanned_reverse_and_grad`) run the chain's run of
equal repeats that leaves the fewest layers to trace (`repeats`: equal
fingerprints, `fingerprints.of`, and equal shapes of weights and states)
as a `jax.lax.scan` of one repeat's layers over the repeats' stacked
weights, states and RNGs (as MaxText's `scan_layers` does): the loop's
body is traced and compiled once. Each repeat computes what its own
layers would, with its own weights, state and RNG, so the results are the
unrolled walk's up to float32 summation order. Where a chain has no two
equal repeats, or its stacks hold what a loop cannot carry (cotangents of
integer items, items a block changes in shape or dtype), they are the
unrolled walks.
"""

import dataclasses
import functools
from typing import Any, Callable, Hashable, Sequence

import jax
import jax.numpy as jnp
from trax import layers as tl
from trax.layers import combinators as cb
from trax.layers import reversible as trax_reversible

from trax_revplus.trainer._step import fingerprints
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
    return _walk(layers, inputs, weights, states, rngs)

  return forward


def _walk(layers, stack, weights, states, rngs):
  """Each layer's `pure_fn` on the stack in order: (stack, new states)."""
  new_states = []
  for layer, w, s, rng in zip(layers, weights, states, rngs):
    x = cb.inputs_from_stack(stack, layer.n_in)
    y, new_state = layer.pure_fn(x, w, s, rng)
    stack = cb.outputs_onto_stack(y, stack, layer.n_in)
    new_states.append(new_state)
  return stack, new_states


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
  layers: Sequence[tl.Layer], equal_blocks: 'Repeats | None' = None
) -> Callable[..., tuple[Stack, list[PyTree]]]:
  """Forward of consecutive reversible layers whose gradient recomputes.

  The forward is `segment_forward_fn`'s. Its custom gradient holds the
  run's outputs (not each layer's activations) and runs each layer's
  `reverse_and_grad`, last to first (`reverse_and_grad_chain`), as
  `step_fns.segment_reverse_fn` does without the updates. With
  `equal_blocks` (`repeats(layers)`), both loop over that run of equal
  blocks (`scanned_forward_fn`, `scanned_reverse_and_grad`).

  Returns (of the returned function):
    (inputs, weights, states, rngs) -> (outputs, new_states), as
    `segment_forward_fn`; differentiable in `inputs` and `weights`.
  """
  if equal_blocks is not None:
    forward = scanned_forward_fn(layers, equal_blocks)
    reverse = scanned_reverse_and_grad(layers, equal_blocks)
  else:
    forward = segment_forward_fn(layers)
    reverse = functools.partial(reverse_and_grad_chain, layers)

  @jax.custom_vjp
  def run(inputs, weights, states, rngs):
    return forward(inputs, weights, states, rngs)

  def run_forward(inputs, weights, states, rngs):
    outputs, new_states = forward(inputs, weights, states, rngs)
    return (outputs, new_states), (outputs, weights, states, new_states, rngs)

  def run_backward(residuals, cotangents):
    stack, weights, states, new_states, rngs = residuals
    # New states take no cotangent.
    _, grad_stack, grads_weights = reverse(
      stack, cotangents[0], weights, states, new_states, rngs
    )
    return grad_stack, grads_weights, None, None

  run.defvjp(run_forward, run_backward)
  return run


def chain_forward_fn(
  layers: Sequence[tl.Layer], blocks: Sequence['Repeats'] = ()
) -> Callable[..., tuple[Stack, list[PyTree]]]:
  """Forward of consecutive layers (standard and reversible) in one call,
  differentiable as trax's default `Trainer` differentiates them.

  Each run of consecutive reversible layers goes under one custom gradient
  that holds only the run's outputs and reverses its layers from them,
  last to first (`reversible_run_fn`), as trax's `ReversibleSerial` does
  in the default `Trainer`; the other layers run `pure_fn`. A run with a
  run of equal blocks in `blocks` (`looped_blocks(layers)`) loops over
  it (`reversible_run_fn`).

  Returns (of the returned function):
    (inputs, weights, states, rngs) -> (outputs, new_states): lists over
    the layers; `inputs` are the top `chain_depth(layers)` stack items.
  """
  runs = _runs(layers, blocks)

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


def _runs(layers, blocks):
  """(start, stop, fn) over `layers` in order: a run of consecutive
  reversible layers as one `reversible_run_fn` (looping over its run of
  equal blocks in `blocks`, if any), every other layer alone with fn
  None."""
  runs: list[tuple[int, int, Any]] = []
  for i, j in _spans(layers):
    if not is_reversible(layers[i]):
      runs.append((i, j, None))
      continue
    inside = next(
      (
        dataclasses.replace(b, start=b.start - i)
        for b in blocks
        if i <= b.start < j
      ),
      None,
    )
    runs.append((i, j, reversible_run_fn(layers[i:j], inside)))
  return runs


def _spans(layers: Sequence[tl.Layer]) -> list[tuple[int, int]]:
  """(start, stop) over `layers` in order: each run of consecutive
  reversible layers, every other layer alone."""
  spans = []
  i = 0
  while i < len(layers):
    j = i + 1
    if is_reversible(layers[i]):
      while j < len(layers) and is_reversible(layers[j]):
        j += 1
    spans.append((i, j))
    i = j
  return spans


def looped_blocks(layers: Sequence[tl.Layer]) -> list['Repeats']:
  """The runs of equal blocks a program of `layers` loops over where it
  loops (`chain_forward_fn`'s `blocks`): each run of consecutive
  reversible layers' `repeats`, in `layers`' indices."""
  found = []
  for i, j in _spans(layers):
    if is_reversible(layers[i]):
      run = repeats(layers[i:j])
      if run is not None:
        found.append(dataclasses.replace(run, start=run.start + i))
  return found


# Two equal repeats are the fewest worth a loop: one saves nothing.
MIN_REPEATS = 2


@dataclasses.dataclass(frozen=True)
class Repeats:
  """A run of equal consecutive blocks in a chain of layers.

  Attributes:
    start: int, index of the run's first layer.
    period: int, layers in one block.
    count: int >= MIN_REPEATS, blocks in the run.
  """

  start: int
  period: int
  count: int

  @property
  def stop(self) -> int:
    """Index after the run's last layer."""
    return self.start + self.period * self.count


def repeats(layers: Sequence[tl.Layer]) -> Repeats | None:
  """The run of equal consecutive blocks that leaves the fewest layers to
  trace (one block plus the layers outside the run), or None where no
  block repeats `MIN_REPEATS` times.

  Blocks are equal where their layers' fingerprints are
  (`fingerprints.of`: the same classes, settings and functions), and a
  block qualifies only if it leaves the stack's depth as it found it (the
  loop carries its top items)."""
  return repeats_of(
    [fingerprints.of(layer) for layer in layers],
    lambda start, period: (
      not sum(
        layer.n_out - layer.n_in for layer in layers[start : start + period]
      )
    ),
  )


def repeats_of(
  keys: Sequence[Hashable],
  qualifies: Callable[[int, int], bool] = lambda start, period: True,
) -> Repeats | None:
  """`repeats` of a chain given by its layers' keys (equal where two
  layers compute the same thing): the run of equal consecutive blocks
  that leaves the fewest keys to trace, among blocks (start, period) that
  `qualifies`; None where none repeats `MIN_REPEATS` times."""
  # Each distinct key as a small int: blocks compare as lists of ints, not
  # of nested fingerprints.
  numbers: dict[Any, int] = {}
  keys = [numbers.setdefault(key, len(numbers)) for key in keys]
  n = len(keys)
  best: Repeats | None = None
  best_traced = n
  for period in range(1, n // MIN_REPEATS + 1):
    for start in range(0, n - MIN_REPEATS * period + 1):
      block = keys[start : start + period]
      count = 1
      while keys[start + count * period : start + (count + 1) * period] == (
        block
      ):
        count += 1
      if count < MIN_REPEATS or not qualifies(start, period):
        continue
      traced = n - (count - 1) * period
      if traced < best_traced:
        best, best_traced = Repeats(start, period, count), traced
  return best


def _shapes(tree: PyTree) -> Any:
  return jax.tree_util.tree_map(
    lambda x: (jnp.shape(x), jnp.result_type(x)), tree
  )


def stackable(run: Repeats, *per_layer: Sequence[PyTree]) -> bool:
  """Whether each block's values (lists over the layers) have the first
  block's structure, shapes and dtypes."""
  for values in per_layer:
    first = _shapes(list(values[run.start : run.start + run.period]))
    for r in range(1, run.count):
      a = run.start + r * run.period
      if _shapes(list(values[a : a + run.period])) != first:
        return False
  return True


def stacked(run: Repeats, values: Sequence[PyTree]) -> list[PyTree]:
  """Per layer of a block, its values over the blocks stacked on a new
  leading axis (list over the block's layers)."""
  return [
    jax.tree_util.tree_map(
      lambda *xs: jnp.stack(xs),
      *[values[run.start + r * run.period + j] for r in range(run.count)],
    )
    for j in range(run.period)
  ]


def unstacked(run: Repeats, stacked: Sequence[PyTree]) -> list[PyTree]:
  """`stacked`'s inverse: values per layer of the run, in layer order."""
  return [
    jax.tree_util.tree_map(lambda x, r=r: x[r], stacked[j])
    for r in range(run.count)
    for j in range(run.period)
  ]


def _carriable(tree: PyTree) -> bool:
  """Whether a loop can carry `tree`: every leaf an array of a float or
  integer dtype (no float0 cotangent, no None)."""
  leaves, _ = jax.tree_util.tree_flatten(tree, is_leaf=lambda x: x is None)
  return all(
    x is not None and getattr(x, 'dtype', None) != jax.float0 for x in leaves
  )


def _loops(step: Callable[..., Any], carry: PyTree, xs: PyTree) -> bool:
  """Whether `jax.lax.scan` can run `step` from `carry` over `xs`: every
  carried leaf an array a loop can carry (`_carriable`), and one step's
  carry out of the structure, shapes and dtypes of its carry in
  (`jax.eval_shape` of the first block: nothing runs)."""
  if not _carriable(carry):
    return False
  first = jax.tree_util.tree_map(lambda x: x[0], xs)
  out, _ = jax.eval_shape(step, carry, first)
  return _shapes(out) == _shapes(carry)


def scanned_forward_fn(
  layers: Sequence[tl.Layer], run: Repeats | None
) -> Callable[..., tuple[Stack, list[PyTree]]]:
  """`segment_forward_fn` of `layers`, their run of equal blocks `run`
  (`repeats(layers)`; None: none) one loop over its stacked weights,
  states and RNGs.

  Returns (of the returned function):
    (inputs, weights, states, rngs) -> (outputs, new_states), as
    `segment_forward_fn`'s: lists over the layers.
  """

  def forward(inputs, weights, states, rngs):
    if run is None or not stackable(run, weights, states, rngs):
      return _walk(layers, inputs, weights, states, rngs)
    stack, head_states = _walk(
      layers[: run.start],
      inputs,
      weights[: run.start],
      states[: run.start],
      rngs[: run.start],
    )
    body = layers[run.start : run.start + run.period]
    depth = chain_depth(body)
    carry = cb.inputs_from_stack(stack, depth)

    def step(top, xs):
      w, s, r = xs
      top, new_s = _walk(body, top, w, s, r)
      return top, new_s

    xs = (stacked(run, weights), stacked(run, states), stacked(run, rngs))
    if not _loops(step, carry, xs):
      return _walk(layers, inputs, weights, states, rngs)
    top, stacked_states = jax.lax.scan(step, carry, xs)
    stack = cb.outputs_onto_stack(top, stack, depth)
    stack, tail_states = _walk(
      layers[run.stop :],
      stack,
      weights[run.stop :],
      states[run.stop :],
      rngs[run.stop :],
    )
    return stack, head_states + unstacked(run, stacked_states) + tail_states

  return forward


def scanned_reverse_and_grad(
  layers: Sequence[tl.Layer], run: Repeats | None
) -> Callable[..., tuple[Stack, Stack, list[PyTree]]]:
  """`reverse_and_grad_chain` of `layers`, their run of equal blocks
  `run` (`repeats(layers)`; None: none) one reversed loop over its stacked
  weights, states, new states and RNGs.

  Returns:
    A function of `reverse_and_grad_chain`'s arguments but `layers`,
    returning its results for `layers`.
  """

  def reverse(stack, grad_stack, weights, states, new_states, rngs):
    def unrolled():
      return reverse_and_grad_chain(
        layers, stack, grad_stack, weights, states, new_states, rngs
      )

    if run is None or not stackable(run, weights, states, new_states, rngs):
      return unrolled()
    body = layers[run.start : run.start + run.period]
    depth = chain_depth(body)
    after = slice(run.stop, None)
    stack_r, grad_r, tail_grads = reverse_and_grad_chain(
      layers[after],
      stack,
      grad_stack,
      weights[after],
      states[after],
      new_states[after],
      rngs[after],
    )
    carry = (
      cb.inputs_from_stack(stack_r, depth),
      cb.inputs_from_stack(grad_r, depth),
    )

    def step(tops, xs):
      w, s, ns, r = xs
      top, grad_top, grads = reverse_and_grad_chain(
        body, tops[0], tops[1], w, s, ns, r
      )
      return (top, grad_top), grads

    xs = (
      stacked(run, weights),
      stacked(run, states),
      stacked(run, new_states),
      stacked(run, rngs),
    )
    if not _loops(step, carry, xs):
      return unrolled()
    (top, grad_top), stacked_grads = jax.lax.scan(step, carry, xs, reverse=True)
    stack_r = cb.outputs_onto_stack(top, stack_r, depth)
    grad_r = cb.outputs_onto_stack(grad_top, grad_r, depth)
    before = slice(None, run.start)
    stack_r, grad_r, head_grads = reverse_and_grad_chain(
      layers[before],
      stack_r,
      grad_r,
      weights[before],
      states[before],
      new_states[before],
      rngs[before],
    )
    return (
      stack_r,
      grad_r,
      list(head_grads) + unstacked(run, stacked_grads) + list(tail_grads),
    )

  return reverse
