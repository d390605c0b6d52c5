"""What one compiled call runs, and the step's one walk over a fixed plan.

A unit is a standard layer (`StandardUnit`) or a reversible segment
(`ReversibleSegment`), with a compiled forward and a compiled backward
(forward-backward-update, or reverse-backward-update); the loss program is
a `LossUnit`: the forward, backward and update of the layers from the
plan's `fused_from` on and of the loss layer. `Units` compiles the units of
a `plan.StepPlan` and walks them:

  forward:  for unit in forward units: stack = unit.forward(stack)
            (keeping block inputs and layer states)
  loss:     loss unit forward + backward + update
  backward: for unit in backward units: reverse, backward, update

A walk runs on a `run.Run`, which gives the units their arguments and makes
their calls: `step.StepContext` on placed arrays (the step itself), or
`ahead.AheadOfTime` on their types (compiling ahead, accounting memory), so
all follow one traversal. Nothing in a walk changes the plan or the units.
"""

from trax.layers import combinators as cb

from trax_revplus.trainer import slices
from trax_revplus.trainer import step_fns
from trax_revplus.trainer.step_fns import Kind


class StandardUnit:
  """A standard layer: a compiled forward and a compiled FBO.

  Attributes:
    layers: [index] of the layer.
    depth: int, stack items its forward reads (`n_in`).
    n_out: int, stack items its forward writes, whose cotangents its
      backward reads.
    forward_fn, backward_fn: compiled `Kind.FORWARD` and
      `Kind.FORWARD_BACKWARD_UPDATE` functions.
  """

  def __init__(self, index, layer, forward_fn, backward_fn):
    self.layers = [index]
    self.depth = layer.n_in
    self.n_out = layer.n_out
    self.forward_fn = forward_fn
    self.backward_fn = backward_fn

  def forward(self, stack, params, run):
    """Runs the layer on the top of `stack`; saves its inputs and new state.

    Returns:
      (stack, outputs): the stack after the layer; its outputs.
    """
    weights, _ = params
    del params
    i = self.layers[0]
    state = run.state(self.layers)[0]
    inputs = cb.inputs_from_stack(stack, self.depth)
    outputs, new_state = run.call(self.forward_fn,
                                  (inputs, weights[0], state, run.rngs[i]))
    run.saved[i] = (inputs, new_state)
    return cb.outputs_onto_stack(outputs, stack, self.depth), outputs

  def backward(self, stack, grad_stack, params, run):
    """Forward + backward + update from the saved inputs; returns the
    stack and cotangents with the layer's inputs in place of its outputs."""
    weights, slots = params
    del params
    i = self.layers[0]
    inputs, state = run.saved.pop(i)
    grads = cb.inputs_from_stack(grad_stack, self.n_out)
    new_weights, new_state, new_slots, grads_in, stats = run.call(
        self.backward_fn,
        (inputs, weights[0], grads, state, slots[0], run.opt_params[i],
         run.rngs[i], run.step_placed))
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
    depth: int, stack items the segment reads and writes.
    forward_fn: compiled `Kind.SEGMENT_FORWARD` function, or None for a
      segment that only runs backward (a backward split).
    backward_fn: compiled `Kind.SEGMENT_REVERSE_UPDATE` function.
  """

  def __init__(self, indices, layers, forward_fn, backward_fn):
    self.layers = list(indices)
    self.depth = max(layer.n_in for layer in layers)
    self.forward_fn = forward_fn
    self.backward_fn = backward_fn

  def forward(self, stack, params, run):
    """Runs the layers in order; saves each one's old and new state.

    Returns:
      (stack, outputs): the stack after the segment; its top `depth` items.
    """
    weights, _ = params
    del params
    state = run.state(self.layers)
    inputs = cb.inputs_from_stack(stack, self.depth)
    outputs, new_state = run.call(
        self.forward_fn,
        (inputs, weights, state, [run.rngs[i] for i in self.layers]))
    for i, s, ns in zip(self.layers, state, new_state):
      run.saved[i] = (s, ns)
    stack = cb.outputs_onto_stack(outputs, stack, self.depth)
    return stack, cb.inputs_from_stack(stack, self.depth)

  def backward(self, stack, grad_stack, params, run):
    """Reverse + backward + update of each layer, last to first; returns
    the stack and cotangents with the reconstructed inputs in place."""
    weights, slots = params
    del params
    old_state = [run.saved[i][0] for i in self.layers]
    new_state = [run.saved.pop(i)[1] for i in self.layers]
    outputs = cb.inputs_from_stack(stack, self.depth)
    grads = cb.inputs_from_stack(grad_stack, self.depth)
    new_weights, new_slots, inputs, grads_in, stats = run.call(
        self.backward_fn,
        (outputs, weights, grads, old_state, new_state, slots,
         [run.opt_params[i] for i in self.layers],
         [run.rngs[i] for i in self.layers], run.step_placed))
    del outputs, grads, old_state, weights, slots
    stack = cb.outputs_onto_stack(inputs, stack, self.depth)
    grad_stack = cb.outputs_onto_stack(grads_in, grad_stack, self.depth)
    order = range(len(self.layers) - 1, -1, -1)  # backward order
    run.updated([self.layers[k] for k in order],
                [new_weights[k] for k in order], [new_slots[k] for k in order],
                [new_state[k] for k in order], [stats[k] for k in order])
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

  def __init__(self, indices, layers):
    self.layers = list(indices)
    self._permutations = [(layer.n_in, list(layer._indices))  # pylint: disable=protected-access
                          for layer in layers]

  def forward(self, stack, params, run):
    del params, run
    for n, indices in self._permutations:
      items = cb.inputs_from_stack(stack, n)
      stack = cb.outputs_onto_stack(tuple(items[i] for i in indices), stack,
                                    n)
    return stack, None

  def backward(self, stack, grad_stack, params, run):
    """Puts the inputs back and their cotangents (the outputs' cotangents,
    reordered the same way: a permutation's gradient)."""
    del params
    for n, indices in reversed(self._permutations):
      inverse = [indices.index(i) for i in range(n)]
      items = cb.inputs_from_stack(stack, n)
      stack = cb.outputs_onto_stack(tuple(items[i] for i in inverse), stack,
                                    n)
      grads = cb.inputs_from_stack(grad_stack, n)
      grad_stack = cb.outputs_onto_stack(tuple(grads[i] for i in inverse),
                                         grad_stack, n)
    # Each layer still reports its (empty) update, so that the step's
    # statistics keep one entry per layer.
    order = self.layers[::-1]
    empty = [() for _ in order]
    run.updated(order, empty, empty, empty, [{} for _ in order])
    return stack, grad_stack


def is_permutation(layer):
  """Whether `layer` is a reversible layer that only permutes its inputs
  (trax's `ReversibleSelect` with each input once: `ReversibleSwap`)."""
  indices = getattr(layer, '_indices', None)
  return (type(layer).__name__ == 'ReversibleSelect' and
          indices is not None and sorted(indices) == list(range(layer.n_in)))


class LossUnit:
  """The loss program: forward + backward + update of the loss layer and
  of the layers fused into it (`plan.StepPlan.fused_from`).

  Attributes:
    layers: the layer indices it runs, in forward order (the loss last).
    depth: int, stack items it reads.
    fn: the compiled function: `Kind.LOSS` with the loss layer alone,
      `Kind.FUSED_LOSS` with fused layers.
  """

  def __init__(self, indices, depth, fn):
    self.layers = list(indices)
    self.depth = depth
    self.fn = fn

  @property
  def forward_fn(self):
    return None

  @property
  def backward_fn(self):
    return self.fn

  def backward(self, stack, params, run):
    """Returns the cotangents of the program's inputs (cotangent of the
    loss: 1); the stack keeps the inputs, for the backward pass."""
    weights, slots = params
    del params
    state = run.state(self.layers)
    inputs = cb.inputs_from_stack(stack, self.depth)
    if len(self.layers) == 1:
      i = self.layers[0]
      new_weights, new_state, new_slots, grad_stack, stats = run.call(
          self.fn, (inputs, weights[0], None, state[0], slots[0],
                    run.opt_params[i], run.rngs[i], run.step_placed))
      new_weights, new_state, new_slots, stats = (
          [new_weights], [new_state], [new_slots], [stats])
    else:
      new_weights, new_state, new_slots, grad_stack, stats = run.call(
          self.fn, (inputs, weights, state, slots,
                    [run.opt_params[i] for i in self.layers],
                    [run.rngs[i] for i in self.layers], run.step_placed))
    del weights, slots, state, inputs
    # Commit order is backward order: the loss layer first.
    order = range(len(self.layers) - 1, -1, -1)
    run.updated([self.layers[k] for k in order],
                [new_weights[k] for k in order], [new_slots[k] for k in order],
                [new_state[k] for k in order], [stats[k] for k in order])
    return grad_stack


class Units:
  """The compiled units of a `plan.StepPlan`, and the walks over them.

  Attributes:
    plan: the `plan.StepPlan` (fixed).
    forward_units: list of `StandardUnit`s and `ReversibleSegment`s run
      forward, in forward order (those before `plan.fused_from`).
    loss_unit: the `LossUnit`.
    backward_units: list of the units run backward, in backward order.
  """

  def __init__(self, plan, factory):
    """Compiles the units of `plan` with `factory` (`UnitFactory`)."""
    self.plan = plan
    self.forward_units = []
    self.backward_units = []
    for std, segments in plan.blocks:
      if std < plan.fused_from:
        unit = factory.standard(std, plan.batch_slices)
        self.forward_units.append(unit)
        self.backward_units.append(unit)
      for segment in segments:
        if segment[0] >= plan.fused_from:
          continue
        unit = factory.segment(segment, plan.batch_slices)
        self.forward_units.append(unit)
        split = plan.backward[segment]
        self.backward_units.extend(
            [unit] if split == (segment,) else
            [factory.segment(s, plan.batch_slices, forward=False)
             for s in split])
    self.backward_units.reverse()
    self.loss_unit = factory.loss(list(range(plan.fused_from, plan.loss + 1)),
                                  plan.batch_slices, plan.keep_activations)

  def programs(self):
    """Every compiled function a step calls, in call order (with repeats
    where layers share one)."""
    return ([u.forward_fn for u in self.forward_units] + [self.loss_unit.fn] +
            [u.backward_fn for u in self.backward_units])

  def forward(self, run):
    """The forward pass: `run.stack` through every forward unit."""
    run.phase = 'forward'
    units = self.forward_units
    if units:
      run.place_ahead(units[0], with_slots=False)
    for unit, following in zip(units, units[1:] + [None]):
      run.stack, outputs = unit.forward(
          run.stack, run.params(unit, following, with_slots=False), run)
      run.forward_done(unit, outputs)
      del outputs

  def loss(self, run):
    """The loss program: sets `run.grad_stack` (and places the first
    backward unit's parameters ahead, where the plan prefetches)."""
    run.phase = 'loss'
    following = self.backward_units[0] if self.backward_units else None
    params = run.params(self.loss_unit, following, with_slots=True)
    run.grad_stack = self.loss_unit.backward(run.stack, params, run)

  def backward(self, run):
    """The backward pass, last unit first; empties `run.stack` and
    `run.grad_stack` (the batch's reconstruction and cotangents)."""
    run.phase = 'backward'
    units = self.backward_units
    for unit, following in zip(units, units[1:] + [None]):
      run.stack, run.grad_stack = unit.backward(
          run.stack, run.grad_stack,
          run.params(unit, following, with_slots=True), run)
      run.backward_done(unit)
    run.stack = run.grad_stack = None

  def walk(self, run):
    """The whole step's walk: forward, loss, backward, every update off
    the device."""
    self.forward(run)
    self.loss(run)
    self.backward(run)
    run.finish()


class UnitFactory:
  """Builds units: their functions (`step_fns`, `slices`), compiled by
  `compile`."""

  def __init__(self, layers, optimizers, compile_fn, n_devices, adasum):
    """Args:
      layers, optimizers: lists by layer index (forward order).
      compile_fn: `compilation.Compiler.compile`.
      n_devices: int, devices the gradients are averaged over.
      adasum: bool, average them with Adasum.
    """
    self._layers = layers
    self._optimizers = optimizers
    self._compile = compile_fn
    self._n_devices = n_devices
    self._adasum = adasum

  def _donated(self, kind, indices):
    """The arguments `kind` replaces: weights and slots where any of its
    layers has weights (else they are empty), the others always."""
    if any(step_fns.has_weights(self._layers[i]) for i in indices):
      return kind.donated
    return tuple(i for i in kind.donated if i not in kind.parameters)

  def _rows(self, indices):
    """`slices.Rows` of layers `indices` (how their state splits)."""
    return [slices.state_rows(self._layers[i]) for i in indices]

  def standard(self, i, n_slices=1):
    layer, opt = self._layers[i], self._optimizers[i]
    rows = self._rows([i])[0]
    forward_fn = self._compile(
        Kind.FORWARD, [i],
        slices.forward(step_fns.forward_fn(layer), n_slices, rows), (),
        n_slices)
    kind = Kind.FORWARD_BACKWARD_UPDATE
    backward_fn = self._compile(
        kind, [i], slices.fbo(layer, opt, self._n_devices, self._adasum,
                              n_slices, rows),
        self._donated(kind, [i]), n_slices)
    return StandardUnit(i, layer, forward_fn, backward_fn)

  def segment(self, indices, n_slices=1, forward=True):
    """A `ReversibleSegment`, or a `SelectSegment` where every layer only
    permutes the stack; without `forward` its forward_fn is None."""
    layers = [self._layers[i] for i in indices]
    if all(is_permutation(layer) for layer in layers):
      return SelectSegment(indices, layers)
    rows = self._rows(indices)
    forward_fn = None
    if forward:
      forward_fn = self._compile(
          Kind.SEGMENT_FORWARD, indices,
          slices.forward(step_fns.segment_forward_fn(layers), n_slices, rows),
          (), n_slices)
    fn = slices.segment_reverse(
        layers, [self._optimizers[i] for i in indices], self._n_devices,
        self._adasum, n_slices, rows)
    # Weights, slots, the outputs and their cotangents are replaced by the
    # results and never read again: the stacks hold the outputs and
    # cotangents alone (a standard layer's saved inputs are popped before
    # this backward runs), and the reconstructed inputs and input
    # cotangents can take their buffers.
    kind = Kind.SEGMENT_REVERSE_UPDATE
    backward_fn = self._compile(kind, indices, fn,
                                self._donated(kind, indices), n_slices)
    return ReversibleSegment(indices, layers, forward_fn, backward_fn)

  def loss(self, indices, n_slices=1, keep_activations=True):
    """The `LossUnit` of layers `indices` (the loss layer last); the
    layers before the loss keep their activations or recompute them
    (`plan.StepPlan.keep_activations`)."""
    layers = [self._layers[i] for i in indices]
    optimizers = [self._optimizers[i] for i in indices]
    depth = step_fns.chain_depth(layers)
    if len(indices) == 1:
      kind = Kind.LOSS
      fn = slices.loss_fbo(layers[0], optimizers[0], self._n_devices,
                           self._adasum, n_slices)
    else:
      kind = Kind.FUSED_LOSS
      fn = slices.fused_loss(layers, optimizers, self._n_devices,
                             self._adasum, n_slices, self._rows(indices),
                             keep_activations)
    return LossUnit(indices, depth, self._compile(
        kind, indices, fn, self._donated(kind, indices),
        (n_slices, keep_activations)))
