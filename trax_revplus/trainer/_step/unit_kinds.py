"""The kinds of unit: what one compiled call runs, forward and backward.

`StandardUnit` (a standard layer), `ReversibleSegment` (consecutive
reversible layers in one call), `SelectSegment` (reversible layers that
only reorder the stack, with no call) and `LossUnit` (the loss program)
each take their arguments from a `step_run.StepRun`, make their call on it
and hand their updates to it. `units.Units` makes them (through
`unit_factory`) and walks them in the step's order; this module says what
each does at its turn, whatever the walk.
"""

from typing import Any, Callable, Sequence

from trax import layers as tl
from trax.layers import combinators as cb

from trax_revplus.trainer._step import chains
from trax_revplus.trainer._step import protocols
from trax_revplus.trainer._step import step_run
from trax_revplus.trax_door import layers as layer_door
from trax_revplus.typing import Stack

Fn = Callable[..., Any]  # a compiled (`jax.jit`) function


def _backward_fn(unit: protocols.Unit, run: step_run.StepRun) -> Fn:
  """`run.backward_fn_of(unit)` for a unit that compiles its backward
  (all but `SelectSegment`)."""
  fn = run.backward_fn_of(unit)
  assert fn is not None, unit.layers
  return fn


class StandardUnit:
  """A standard layer: a compiled forward and a compiled FBO.

  Attributes:
    layers: [index] of the layer.
    depth: int, stack items its forward reads (`n_in`).
    n_out: int, stack items its forward writes, whose cotangents its
      backward reads.
    forward_fn, backward_fn: compiled `Kind.FORWARD` and
      `Kind.FORWARD_BACKWARD_UPDATE` functions.
    accumulate_fn: the backward of a micro-batch that only accumulates
      its gradients (`step_fns.Update.ACCUMULATE`), or None without
      micro-batches.
  """

  def __init__(
    self,
    index: int,
    layer: tl.Layer,
    forward_fn: Fn,
    backward_fn: Fn,
    accumulate_fn: Fn | None = None,
  ) -> None:
    self.layers = [index]
    self.depth = layer.n_in
    self.n_out = layer.n_out
    self.forward_fn = forward_fn
    self.backward_fn = backward_fn
    self.accumulate_fn = accumulate_fn

  def forward(
    self, stack: Stack, params: tuple, run: step_run.StepRun
  ) -> Stack:
    """Runs the layer on the top of `stack`; saves its inputs and new state.

    Returns:
      The stack after the layer.
    """
    weights, _ = params
    del params
    i = self.layers[0]
    state = run.state(self.layers)[0]
    inputs = cb.inputs_from_stack(stack, self.depth)
    outputs, new_state = run.call(
      self.forward_fn, (inputs, weights[0], state, run.rngs[i])
    )
    run.keep_saved({i: (inputs, new_state)})
    return cb.outputs_onto_stack(outputs, stack, self.depth)

  def backward(
    self, stack: Stack, grad_stack: Stack, params: tuple, run: step_run.StepRun
  ) -> tuple[Stack, Stack]:
    """Forward + backward + update from the saved inputs; returns the
    stack and cotangents with the layer's inputs in place of its outputs."""
    weights, slots = params
    del params
    i = self.layers[0]
    [(inputs, state)] = run.take_saved(self.layers)
    grads = cb.inputs_from_stack(grad_stack, self.n_out)
    new_weights, new_state, new_slots, grads_in, stats = run.call(
      _backward_fn(self, run),
      (
        inputs,
        weights[0],
        grads,
        state,
        slots[0],
        run.opt_params[i],
        run.rngs[i],
        run.step_placed,
      ),
    )
    del weights, slots, state, grads
    stack = cb.outputs_onto_stack(inputs, stack, self.n_out)
    grad_stack = cb.outputs_onto_stack(grads_in, grad_stack, self.n_out)
    del inputs, grads_in
    run.updated(self.layers, [new_weights], [new_slots], [new_state], [stats])
    return stack, grad_stack


class ReversibleSegment:
  """Consecutive reversible layers of a block run as one compiled call.

  Attributes:
    layers: list of layer indices, in forward order.
    depth: int, stack items the segment's forward reads (and its backward
      writes back): `tl.Serial(layers).n_in`.
    out_depth: int, stack items its forward writes (and its backward
      reads): `depth` plus each layer's `n_out - n_in`. A reversible layer
      may change the depth: `tl.ReversibleSelect([0, 0])`, trax's
      reversible Dup in Terraformer's decoder, reads 1 item and writes 2.
    forward_fn: compiled `Kind.SEGMENT_FORWARD` function, or None for a
      segment that only runs backward (a backward split).
    backward_fn: compiled `Kind.SEGMENT_REVERSE_UPDATE` function.
    accumulate_fn: as `StandardUnit.accumulate_fn`.
  """

  def __init__(
    self,
    indices: Sequence[int],
    layers: Sequence[tl.Layer],
    forward_fn: Fn | None,
    backward_fn: Fn,
    accumulate_fn: Fn | None = None,
  ) -> None:
    self.layers = list(indices)
    self.depth = chains.chain_depth(layers)
    self.out_depth = self.depth + sum(
      layer.n_out - layer.n_in for layer in layers
    )
    self.forward_fn = forward_fn
    self.backward_fn = backward_fn
    self.accumulate_fn = accumulate_fn

  def forward(
    self, stack: Stack, params: tuple, run: step_run.StepRun
  ) -> Stack:
    """Runs the layers in order; saves each one's old and new state.

    Returns:
      The stack after the segment.
    """
    weights, _ = params
    del params
    state = run.state(self.layers)
    inputs = cb.inputs_from_stack(stack, self.depth)
    assert self.forward_fn is not None, 'a backward split runs no forward'
    outputs, new_state = run.call(
      self.forward_fn,
      (inputs, weights, state, [run.rngs[i] for i in self.layers]),
    )
    run.keep_saved(
      {i: (s, ns) for i, s, ns in zip(self.layers, state, new_state)}
    )
    return cb.outputs_onto_stack(outputs, stack, self.depth)

  def backward(
    self, stack: Stack, grad_stack: Stack, params: tuple, run: step_run.StepRun
  ) -> tuple[Stack, Stack]:
    """Reverse + backward + update of each layer, last to first; returns
    the stack and cotangents with the reconstructed inputs in place."""
    weights, slots = params
    del params
    old_state, new_state = map(list, zip(*run.take_saved(self.layers)))
    outputs = cb.inputs_from_stack(stack, self.out_depth)
    grads = cb.inputs_from_stack(grad_stack, self.out_depth)
    new_weights, new_slots, inputs, grads_in, stats = run.call(
      _backward_fn(self, run),
      (
        outputs,
        weights,
        grads,
        old_state,
        new_state,
        slots,
        [run.opt_params[i] for i in self.layers],
        [run.rngs[i] for i in self.layers],
        run.step_placed,
      ),
    )
    del outputs, grads, old_state, weights, slots
    stack = cb.outputs_onto_stack(inputs, stack, self.out_depth)
    grad_stack = cb.outputs_onto_stack(grads_in, grad_stack, self.out_depth)
    order = range(len(self.layers) - 1, -1, -1)  # backward order
    run.updated(
      [self.layers[k] for k in order],
      [new_weights[k] for k in order],
      [new_slots[k] for k in order],
      [new_state[k] for k in order],
      [stats[k] for k in order],
    )
    return stack, grad_stack


class SelectSegment:
  """Reversible layers that only reorder the stack (`tl.ReversibleSwap`,
  permutations by `ReversibleSelect`): run on the stacks themselves,
  forward and backward, with no compiled call and no device memory.

  Attributes:
    layers: list of layer indices, in forward order.
    forward_fn, backward_fn: None (nothing is compiled).
  """

  forward_fn = None
  backward_fn = None
  accumulate_fn = None

  def __init__(
    self, indices: Sequence[int], layers: Sequence[tl.Layer]
  ) -> None:
    self.layers = list(indices)
    self._permutations = [
      (layer.n_in, list(layer_door.select_indices(layer))) for layer in layers
    ]

  def forward(
    self, stack: Stack, params: tuple, run: step_run.StepRun
  ) -> Stack:
    del params, run
    for n, indices in self._permutations:
      items = cb.inputs_from_stack(stack, n)
      stack = cb.outputs_onto_stack(tuple(items[i] for i in indices), stack, n)
    return stack

  def backward(
    self, stack: Stack, grad_stack: Stack, params: tuple, run: step_run.StepRun
  ) -> tuple[Stack, Stack]:
    """Puts the inputs back and their cotangents (the outputs' cotangents,
    reordered the same way: a permutation's gradient)."""
    del params
    for n, indices in reversed(self._permutations):
      inverse = [indices.index(i) for i in range(n)]
      items = cb.inputs_from_stack(stack, n)
      stack = cb.outputs_onto_stack(tuple(items[i] for i in inverse), stack, n)
      grads = cb.inputs_from_stack(grad_stack, n)
      grad_stack = cb.outputs_onto_stack(
        tuple(grads[i] for i in inverse), grad_stack, n
      )
    # Each layer still reports its (empty) update, so that the step's
    # statistics keep one entry per layer.
    order = self.layers[::-1]
    empty = [() for _ in order]
    run.updated(order, empty, empty, empty, [{} for _ in order])
    return stack, grad_stack


class LossUnit:
  """The loss program: forward + backward + update of the loss layer and
  of the layers fused into it (`plan.StepPlan.fused_from`).

  Attributes:
    layers: the layer indices it runs, in forward order (the loss last).
    depth: int, stack items it reads.
    fn: the compiled function: `Kind.LOSS` with the loss layer alone,
      `Kind.FUSED_LOSS` with fused layers.
    accumulate_fn: as `StandardUnit.accumulate_fn` (`Kind.LOSS` only).
  """

  def __init__(
    self,
    indices: Sequence[int],
    depth: int,
    fn: Fn,
    accumulate_fn: Fn | None = None,
  ) -> None:
    self.layers = list(indices)
    self.depth = depth
    self.fn = fn
    self.accumulate_fn = accumulate_fn

  @property
  def forward_fn(self) -> None:
    return None

  @property
  def backward_fn(self) -> Fn:
    return self.fn

  def backward(
    self, stack: Stack, params: tuple, run: step_run.StepRun
  ) -> Stack:
    """Returns the cotangents of the program's inputs (cotangent of the
    loss: 1); the stack keeps the inputs, for the backward pass."""
    weights, slots = params
    del params
    state = run.state(self.layers)
    inputs = cb.inputs_from_stack(stack, self.depth)
    if len(self.layers) == 1:
      i = self.layers[0]
      # A micro-batch's loss takes the batch's loss weights in the
      # cotangent's place (`loss_slices.loss_fbo`).
      new_weights, new_state, new_slots, grad_stack, stats = run.call(
        _backward_fn(self, run),
        (
          inputs,
          weights[0],
          run.loss_weights,
          state[0],
          slots[0],
          run.opt_params[i],
          run.rngs[i],
          run.step_placed,
        ),
      )
      new_weights, new_state, new_slots, stats = (
        [new_weights],
        [new_state],
        [new_slots],
        [stats],
      )
    else:
      new_weights, new_state, new_slots, grad_stack, stats = run.call(
        self.fn,
        (
          inputs,
          weights,
          state,
          slots,
          [run.opt_params[i] for i in self.layers],
          [run.rngs[i] for i in self.layers],
          run.step_placed,
        ),
      )
    del weights, slots, state, inputs
    # Commit order is backward order: the loss layer first.
    order = range(len(self.layers) - 1, -1, -1)
    run.updated(
      [self.layers[k] for k in order],
      [new_weights[k] for k in order],
      [new_slots[k] for k in order],
      [new_state[k] for k in order],
      [stats[k] for k in order],
    )
    return grad_stack
