"""What one compiled call runs, and the step's walk over them.

A unit is a standard layer (`StandardUnit`) or a reversible segment
(`ReversibleSegment`), with a compiled forward and a compiled backward
(forward-backward-update, or reverse-backward-update); the loss layer is a
`LossUnit`, one forward-backward-update. `Units` holds them in the order of
a `plan.SegmentPlan` and walks them:

  forward:  for unit in units: stack = unit.forward(stack)
            (keeping block inputs and layer states)
  loss:     loss unit forward + backward + update
  backward: for unit in reversed(backward units): reverse, backward, update

A walk runs on a `Run`, which gives the units their arguments and makes
their calls: `step.StepContext` on placed arrays (the step itself), or
`compilation.AheadOfTime` on their types (compiling the first step ahead),
so both follow one traversal.
"""

from trax.layers import combinators as cb

from trax_revplus import memory
from trax_revplus.trainer import step_fns
# `Run` is the type the walks take; callers subclass it as `units.Run`.
from trax_revplus.trainer.run import Run  # pylint: disable=unused-import
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
      segment that only runs backward (a backward split); with `keep`, a
      `Kind.SEGMENT_FORWARD_KEEP` function.
    backward_fn: compiled `Kind.SEGMENT_REVERSE_UPDATE` function; with
      `keep`, a `Kind.SEGMENT_BACKWARD_KEPT` function.
    keep: bool, the forward keeps what the backward needs (no reversal).
  """

  def __init__(self, indices, layers, forward_fn, backward_fn, keep=False):
    self.layers = list(indices)
    self.depth = max(layer.n_in for layer in layers)
    self.forward_fn = forward_fn
    self.backward_fn = backward_fn
    self.keep = keep

  def forward(self, stack, params, run):
    """Runs the layers in order; saves each one's old and new state.

    Returns:
      (stack, outputs): the stack after the segment; its top `depth` items.
    """
    weights, _ = params
    del params
    state = run.state(self.layers)
    inputs = cb.inputs_from_stack(stack, self.depth)
    results = run.call(
        self.forward_fn,
        (inputs, weights, state, [run.rngs[i] for i in self.layers]))
    outputs, new_state = results[:2]
    if self.keep:
      run.kept[tuple(self.layers)] = (inputs, results[2])
    del results
    for i, s, ns in zip(self.layers, state, new_state):
      run.saved[i] = (s, ns)
    stack = cb.outputs_onto_stack(outputs, stack, self.depth)
    return stack, cb.inputs_from_stack(stack, self.depth)

  def backward(self, stack, grad_stack, params, run):
    """Reverse + backward + update of each layer, last to first; returns
    the stack and cotangents with the reconstructed inputs in place."""
    weights, slots = params
    del params
    if self.keep:
      return self._backward_kept(stack, grad_stack, weights, slots, run)
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
    return self._updated(stack, grad_stack, inputs, grads_in, new_weights,
                         new_slots, new_state, stats, run)

  def _backward_kept(self, stack, grad_stack, weights, slots, run):
    """Backward + update from the kept vjp function; the kept inputs go
    back onto the stack."""
    inputs, vjp_fn = run.kept.pop(tuple(self.layers))
    new_state = [run.saved.pop(i)[1] for i in self.layers]
    grads = cb.inputs_from_stack(grad_stack, self.depth)
    new_weights, new_slots, grads_in, stats = run.call(
        self.backward_fn,
        (vjp_fn, weights, grads, slots,
         [run.opt_params[i] for i in self.layers], run.step_placed))
    del vjp_fn, grads, weights, slots
    return self._updated(stack, grad_stack, inputs, grads_in, new_weights,
                         new_slots, new_state, stats, run)

  def _updated(self, stack, grad_stack, inputs, grads_in, new_weights,
               new_slots, new_state, stats, run):
    """Puts the recovered inputs and their cotangents back on the stacks and
    hands the segment's updates to `run`, in backward order."""
    stack = cb.outputs_onto_stack(inputs, stack, self.depth)
    grad_stack = cb.outputs_onto_stack(grads_in, grad_stack, self.depth)
    order = range(len(self.layers) - 1, -1, -1)  # backward order
    run.updated([self.layers[k] for k in order],
                [new_weights[k] for k in order], [new_slots[k] for k in order],
                [new_state[k] for k in order], [stats[k] for k in order])
    return stack, grad_stack


class LossUnit:
  """The loss layer: one compiled forward + backward + update (`Kind.LOSS`).

  Attributes:
    layers: [index] of the loss layer (the last layer).
    depth: int, stack items it reads.
    fn: the compiled function.
  """

  def __init__(self, index, layer, fn):
    self.layers = [index]
    self.depth = layer.n_in
    self.fn = fn

  def backward(self, stack, params, run):
    """Returns the cotangents of the loss's inputs (cotangent of loss: 1)."""
    weights, slots = params
    del params
    i = self.layers[0]
    state = run.state(self.layers)[0]
    inputs = cb.inputs_from_stack(stack, self.depth)
    new_weights, new_state, new_slots, grad_stack, stats = run.call(
        self.fn, (inputs, weights[0], None, state, slots[0],
                  run.opt_params[i], run.rngs[i], run.step_placed))
    del weights, slots, inputs
    run.updated(self.layers, [new_weights], [new_slots], [new_state], [stats])
    return grad_stack


class Units:
  """The compiled units of a `plan.SegmentPlan`, and the walks over them.

  Attributes:
    plan: the `plan.SegmentPlan`.
    forward_units: list of `StandardUnit`s and `ReversibleSegment`s in
      forward order (per block: the standard layer, then its segments).
    loss_unit: the `LossUnit`.
  """

  def __init__(self, segment_plan, factory):
    """Compiles the units of `segment_plan` with `factory` (`UnitFactory`)."""
    self.plan = segment_plan
    self._factory = factory
    self._backward = {}  # forward segment (tuple) -> its backward units
    self.forward_units = []
    for std, segments in segment_plan.blocks:
      self.forward_units.append(factory.standard(std))
      for segment in segments:
        self.forward_units.append(factory.segment(
            segment, keep=segment in segment_plan.keep))
        if segment in segment_plan.backward:
          self.backward_units_of(self.forward_units[-1])
    self.loss_unit = factory.loss(segment_plan.loss)

  def with_plan(self, segment_plan):
    """New `Units` of `segment_plan`, compiled by the same factory."""
    return Units(segment_plan, self._factory)

  def replan(self, segment_plan):
    """Runs `segment_plan` from now on (these same `Units`, rebuilt)."""
    self.__init__(segment_plan, self._factory)

  def backward_units_of(self, unit):
    """The units that run forward unit `unit` backward, in forward order.

    A segment whose backward split is not decided yet runs backward whole.
    """
    if isinstance(unit, StandardUnit) or unit.keep:
      return [unit]
    key = tuple(unit.layers)
    split = self.plan.backward.get(key)
    if split is None:
      return [unit]
    if key not in self._backward:
      self._backward[key] = [unit] if split == [key] else [
          self._factory.segment(s, forward=False) for s in split]
    return self._backward[key]

  def decide_backward(self, unit, outputs):
    """Fixes how forward unit `unit` runs backward, from its `outputs`
    (arrays or `jax.ShapeDtypeStruct`s, all devices), if not yet decided."""
    if isinstance(unit, ReversibleSegment):
      key = tuple(unit.layers)
      if key not in self.plan.backward:
        self.plan.decide_backward(key, memory.array_bytes(outputs))
      self.backward_units_of(unit)

  def backward_units(self):
    """Every backward unit of a step, in backward order."""
    return [b for u in self.forward_units
            for b in self.backward_units_of(u)][::-1]

  def programs(self):
    """Every compiled function a step calls, in call order (with repeats
    where layers share one)."""
    return ([u.forward_fn for u in self.forward_units] + [self.loss_unit.fn] +
            [u.backward_fn for u in self.backward_units()])

  def forward(self, run):
    """The forward pass: `run.stack` through every forward unit."""
    units = self.forward_units
    if units:
      run.prefetch(units[0], with_slots=False)
    for unit, following in zip(units, units[1:] + [None]):
      run.stack, outputs = unit.forward(
          run.stack, run.advance(unit, following, with_slots=False), run)
      run.forward_done(unit, outputs)
      del outputs

  def loss(self, run):
    """The loss layer's forward, backward and update: sets `run.grad_stack`
    (and places the first backward unit's parameters)."""
    params = run.place(self.loss_unit.layers, with_slots=True)
    backward = self.backward_units()
    if backward:
      run.prefetch(backward[0], with_slots=True)
    run.grad_stack = self.loss_unit.backward(run.stack, params, run)

  def backward(self, run):
    """The backward pass, last unit first; empties `run.stack` and
    `run.grad_stack` (the batch's reconstruction and cotangents)."""
    units = self.backward_units()
    for unit, following in zip(units, units[1:] + [None]):
      run.stack, run.grad_stack = unit.backward(
          run.stack, run.grad_stack,
          run.advance(unit, following, with_slots=True), run)
      run.backward_done(unit)
    run.stack = run.grad_stack = None

  def walk(self, run):
    """The whole step's walk: forward, loss, backward."""
    self.forward(run)
    self.loss(run)
    self.backward(run)


class UnitFactory:
  """Builds units: their functions (`step_fns`), compiled by `compile`."""

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
    """The arguments `kind` replaces, where any of its layers has weights."""
    if any(step_fns.has_weights(self._layers[i]) for i in indices):
      return kind.donated
    return ()

  def standard(self, i):
    layer, opt = self._layers[i], self._optimizers[i]
    forward_fn = self._compile(Kind.FORWARD, [i], step_fns.forward_fn(layer),
                               ())
    fbo = step_fns.fbo_fn(layer, opt, self._n_devices, self._adasum)
    kind = Kind.FORWARD_BACKWARD_UPDATE
    backward_fn = self._compile(kind, [i], fbo, self._donated(kind, [i]))
    return StandardUnit(i, layer, forward_fn, backward_fn)

  def segment(self, indices, forward=True, keep=False):
    """A `ReversibleSegment`; without `forward` its forward_fn is None;
    with `keep` it keeps its activations for its backward."""
    layers = [self._layers[i] for i in indices]
    if keep:
      optimizers = [self._optimizers[i] for i in indices]
      forward_fn = self._compile(Kind.SEGMENT_FORWARD_KEEP, indices,
                                 step_fns.segment_forward_keep_fn(layers), ())
      kind = Kind.SEGMENT_BACKWARD_KEPT
      backward_fn = self._compile(
          kind, indices, step_fns.segment_backward_kept_fn(
              layers, optimizers, self._n_devices, self._adasum),
          self._donated(kind, indices))
      return ReversibleSegment(indices, layers, forward_fn, backward_fn,
                               keep=True)
    forward_fn = None
    if forward:
      forward_fn = self._compile(Kind.SEGMENT_FORWARD, indices,
                                 step_fns.segment_forward_fn(layers), ())
    fn = step_fns.segment_reverse_fn(
        layers, [self._optimizers[i] for i in indices], self._n_devices,
        self._adasum)
    # Weights, slots, the outputs and their cotangents are replaced by the
    # results and never read again: the stacks hold the outputs and
    # cotangents alone (a standard layer's saved inputs and a kept
    # segment's inputs are popped before this backward runs), and the
    # reconstructed inputs and input cotangents can take their buffers.
    kind = Kind.SEGMENT_REVERSE_UPDATE
    backward_fn = self._compile(kind, indices, fn,
                                self._donated(kind, indices))
    return ReversibleSegment(indices, layers, forward_fn, backward_fn)

  def loss(self, i):
    layer = self._layers[i]
    fn = step_fns.fbo_fn(layer, self._optimizers[i], self._n_devices,
                         self._adasum, 'loss')
    return LossUnit(i, layer, self._compile(Kind.LOSS, [i], fn,
                                            self._donated(Kind.LOSS, [i])))
