"""The pure functions a training step compiles, one builder per kind.

Each builder takes layers (and optimizers) and returns a function of arrays
only, which `compilation.Compiler` jits for the trainer's devices. On N > 1
devices a function runs once per device (`placement.Placement.jit`): each
argument and result is either replicated (weights, slots, optimizer
hyperparameters, the step) or per-device (activations, cotangents, state,
RNGs, statistics), as `Kind.in_layouts` / `Kind.out_layouts` say.

The builders mirror trax 1.4.1's `trax.optimizers.trainer`:
`_fbo_with_layer_and_opt` (`fbo_fn`), `_reverse_and_fbo_with_layer_and_opt`
(`reverse_and_fbo_fn`) and `_average_multidevice_gradients`
(`average_gradients`).
"""

import enum

import jax
from trax import fastmath
from trax.fastmath import numpy as jnp
from trax.layers import combinators as cb
from trax.optimizers import trainer as stock_trainer

from trax_revplus import placement as placement_lib

_R = placement_lib.Layout.REPLICATED
_D = placement_lib.Layout.PER_DEVICE


class Kind(enum.Enum):
  """What a compiled step function computes; its arguments, in order.

  FORWARD: a standard layer's forward.
    (inputs, weights, state, rng) -> (outputs, new state)
  FORWARD_BACKWARD_UPDATE: a standard layer's forward, backward and
    optimizer update (FBO).
    (inputs, weights, output cotangents, state, slots, opt params, rng,
    step) -> (new weights, new state, new slots, input cotangents, stats)
  LOSS: the FBO of the loss layer, whose cotangent is 1.
  SEGMENT_FORWARD: the forward of consecutive reversible layers; every
    per-layer argument and result is a list over the layers.
  SEGMENT_REVERSE_UPDATE: reverse, backward and update of consecutive
    reversible layers, last to first.
    (outputs, weights, output cotangents, old states, new states, slots,
    opt params, rngs, step) -> (new weights, new slots, inputs, input
    cotangents, stats)
  SEGMENT_FORWARD_KEEP: SEGMENT_FORWARD that also returns what its
    backward needs (`jax.vjp`'s function, a pytree of residuals).
    (inputs, weights, states, rngs) -> (outputs, new states, vjp function)
  SEGMENT_BACKWARD_KEPT: backward and update of a SEGMENT_FORWARD_KEEP's
    layers from its kept vjp function (no reversal, no recompute).
    (vjp function, weights, output cotangents, slots, opt params, step) ->
    (new weights, new slots, input cotangents, stats)
  """
  FORWARD = 'fwd'
  FORWARD_BACKWARD_UPDATE = 'std'
  LOSS = 'loss'
  SEGMENT_FORWARD = 'rev_fwd'
  SEGMENT_REVERSE_UPDATE = 'rev'
  SEGMENT_FORWARD_KEEP = 'rev_fwd_keep'
  SEGMENT_BACKWARD_KEPT = 'rev_kept'

  @property
  def in_layouts(self):
    """`placement.Layout` of each positional argument."""
    return _IN_LAYOUTS[self]

  @property
  def out_layouts(self):
    """`placement.Layout` of each result."""
    return _OUT_LAYOUTS[self]

  @property
  def updates(self):
    """Whether it updates weights, averaging gradients over devices (so its
    program holds cross-device collectives on N > 1 devices)."""
    return self not in (Kind.FORWARD, Kind.SEGMENT_FORWARD,
                        Kind.SEGMENT_FORWARD_KEEP)

  @property
  def donated(self):
    """Argument positions it replaces by its results, never read again, so
    their buffers may be donated: weights and slots; for a reverse step
    also the outputs and their cotangents, which its reconstructed inputs
    and their cotangents replace on the stacks (as trax's
    `_reverse_and_fbo_with_layer_and_opt` donates them)."""
    if self is Kind.SEGMENT_REVERSE_UPDATE:
      return (0, 1, 2, 5)
    if self is Kind.SEGMENT_BACKWARD_KEPT:
      return (1, 3)
    return (1, 4) if self.updates else ()


_FORWARD_IN = (_D, _R, _D, _D)
_FORWARD_OUT = (_D, _D)
_FBO_IN = (_D, _R, _D, _D, _R, _R, _D, _R)
_FBO_OUT = (_R, _D, _R, _D, _D)
_IN_LAYOUTS = {
    Kind.FORWARD: _FORWARD_IN,
    Kind.SEGMENT_FORWARD: _FORWARD_IN,
    Kind.FORWARD_BACKWARD_UPDATE: _FBO_IN,
    Kind.LOSS: _FBO_IN,
    Kind.SEGMENT_REVERSE_UPDATE: (_D, _R, _D, _D, _D, _R, _R, _D, _R),
    Kind.SEGMENT_FORWARD_KEEP: _FORWARD_IN,
    Kind.SEGMENT_BACKWARD_KEPT: (_D, _R, _D, _R, _R, _R),
}
_OUT_LAYOUTS = {
    Kind.FORWARD: _FORWARD_OUT,
    Kind.SEGMENT_FORWARD: _FORWARD_OUT,
    Kind.FORWARD_BACKWARD_UPDATE: _FBO_OUT,
    Kind.LOSS: _FBO_OUT,
    Kind.SEGMENT_REVERSE_UPDATE: (_R, _R, _D, _D, _D),
    Kind.SEGMENT_FORWARD_KEEP: (_D, _D, _D),
    Kind.SEGMENT_BACKWARD_KEPT: (_R, _R, _D, _D),
}


def is_empty_tuple(x):
  """Whether x is empty or a tuple of (tuples of) empty things (as trax)."""
  if not isinstance(x, (list, tuple)):
    return False
  return all(is_empty_tuple(y) for y in x)


def has_weights(layer):
  """Whether a layer's weights hold any array (it was initialized or
  loaded; a layer without weights holds only empty tuples)."""
  return any(hasattr(x, 'shape')
             for x in jax.tree_util.tree_leaves(layer.weights))


def average_gradients(grads, n_devices, adasum):
  """Averages gradients over the devices' 'batch' axis.

  Mirrors trax's `_average_multidevice_gradients`, with N the devices of
  this trainer. Runs inside a per-device function.

  Args:
    grads: pytree of this device's gradients.
    n_devices: int N > 1.
    adasum: bool, merge pairs of devices with Adasum first (N a power of 2).

  Returns:
    The pytree of gradients averaged over the N devices.
  """
  if adasum:
    lg = max(i for i in range(20) if 2**i <= n_devices)
    for lg_i in range(lg):
      shift = 2**lg_i
      perm = []
      for i in range(n_devices):
        if i % (2 * shift) < shift:
          perm.append((i, i + shift))
        else:
          perm.append((i, i - shift))
      perm_grads = jax.lax.ppermute(
          grads, perm=perm, axis_name=placement_lib.AXIS_NAME)
      grads = fastmath.nested_map_multiarg(
          stock_trainer._adasum_merge, grads, perm_grads)  # pylint: disable=protected-access
  grads_psum = fastmath.psum(grads, placement_lib.AXIS_NAME)
  n = jnp.array(n_devices, dtype=jnp.float32)
  return fastmath.nested_map(lambda g: g / n, grads_psum)


def fbo_fn(layer, optimizer, n_devices, adasum, stats_name=None):
  """Forward + backward + optimizer update of a standard layer.

  Mirrors trax's `_fbo_with_layer_and_opt`. With `stats_name` (the loss
  layer: `Kind.LOSS`) the cotangent is 1 when none is given, and the
  layer's output is returned among the stats under that name.
  """
  def fbo(inputs, weights, grads, state, slots, opt_params, rng, step):
    def pure_fn_without_state_and_rng(x, w):
      return layer.pure_fn(x, w, state, rng)
    activations, vjp_fn, new_state = fastmath.vjp(
        pure_fn_without_state_and_rng, inputs, weights, has_aux=True)
    if grads is None and stats_name is not None:
      grads = jnp.ones((), dtype=activations.dtype)
    grads_inputs, grads_weights = vjp_fn(grads)
    if is_empty_tuple(weights):
      stats = {}
      if stats_name is not None:
        stats[stats_name] = activations
      return weights, new_state, slots, grads_inputs, stats
    if n_devices > 1:
      grads_weights = average_gradients(grads_weights, n_devices, adasum)
    new_weights, new_slots, stats = optimizer.tree_update(
        step, grads_weights, weights, slots, opt_params, store_slots=False)
    if stats_name is not None:
      stats[stats_name] = activations
    return new_weights, new_state, new_slots, grads_inputs, stats
  return fbo


def reverse_and_fbo_fn(layer, optimizer, n_devices, adasum):
  """Reverse + backward + optimizer update of a reversible layer.

  Mirrors trax's `_reverse_and_fbo_with_layer_and_opt`.
  """
  def reverse_and_fbo(output, weights, grads, state, new_state, slots,
                      opt_params, rng, step):
    inputs, (grads_inputs, grads_weights) = layer.reverse_and_grad(
        output, grads, weights, state, new_state, rng=rng)
    if is_empty_tuple(weights):
      return weights, slots, inputs, grads_inputs, {}
    if n_devices > 1:
      grads_weights = average_gradients(grads_weights, n_devices, adasum)
    new_weights, new_slots, stats = optimizer.tree_update(
        step, grads_weights, weights, slots, opt_params, store_slots=False)
    return new_weights, new_slots, inputs, grads_inputs, stats
  return reverse_and_fbo


def forward_fn(layer):
  """A standard layer's forward: `layer.pure_fn` (`Kind.FORWARD`)."""
  def forward(inputs, weights, state, rng):
    return layer.pure_fn(inputs, weights, state, rng)
  return forward


def segment_forward_fn(layers):
  """Forward of consecutive reversible layers in one call.

  The layers run in order on the top items of the stack (a reversible layer
  has `n_in == n_out`, so the stack depth does not change), each with its
  own weights, state and RNG, exactly as one call per layer would.

  Args (of the returned function):
    inputs: the top `depth` stack items (an array if depth is 1).
    weights, states, rngs: lists, one entry per layer.

  Returns (of the returned function):
    (outputs, new_states): the top `depth` stack items after the last
    layer; list of each layer's new state.
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


def segment_reverse_fn(layers, optimizers, n_devices, adasum):
  """Reverse + backward + update of consecutive reversible layers.

  Runs `reverse_and_fbo_fn` of each layer, last to first, inside one call;
  every layer keeps its own weights, slots, optimizer hyperparameters,
  states and RNG. Arguments are those of `reverse_and_fbo_fn` with a list
  (one entry per layer) in place of each per-layer value, and the top
  `depth` stack items as outputs and cotangents.

  Returns (of the returned function):
    (new_weights, new_slots, inputs, grads_inputs, stats): lists of each
    layer's new weights, slots and stats; the reconstructed inputs of the
    first layer and their cotangents (top `depth` stack items).
  """
  fns = [reverse_and_fbo_fn(layer, opt, n_devices, adasum)
         for layer, opt in zip(layers, optimizers)]

  def reverse(outputs, weights, grads, states, new_states, slots, opt_params,
              rngs, step):
    stack, grad_stack = outputs, grads
    n = len(layers)
    new_weights, new_slots, stats = [None] * n, [None] * n, [None] * n
    for k in range(n - 1, -1, -1):
      n_out = layers[k].n_out
      new_weights[k], new_slots[k], x, x_ct, stats[k] = fns[k](
          cb.inputs_from_stack(stack, n_out), weights[k],
          cb.inputs_from_stack(grad_stack, n_out), states[k], new_states[k],
          slots[k], opt_params[k], rngs[k], step)
      stack = cb.outputs_onto_stack(x, stack, n_out)
      grad_stack = cb.outputs_onto_stack(x_ct, grad_stack, n_out)
    return new_weights, new_slots, stack, grad_stack, stats
  return reverse


def _plain_forward(layer, x, weights, state, rng):
  """`layer.forward` with `weights`, `state` and `rng` swapped in, as
  trax's `Layer.pure_fn` runs it, but without a reversible layer's custom
  gradient (which would reverse the layer in the backward pass)."""
  saved = layer.weights, layer.state, layer._rng  # pylint: disable=protected-access
  try:
    layer.weights, layer.state = weights, state
    layer._rng = rng  # pylint: disable=protected-access
    y = layer.forward(x)
    return y, layer.state
  finally:
    layer.weights, layer.state = saved[:2]
    layer._rng = saved[2]  # pylint: disable=protected-access


def segment_forward_keep_fn(layers):
  """`segment_forward_fn` that keeps what its backward needs.

  Returns (of the returned function):
    (outputs, new_states, vjp_fn): as `segment_forward_fn`, and `jax.vjp`'s
    function of the segment's forward with respect to its inputs and
    weights (a pytree holding the residuals; call it with the outputs'
    cotangents to get (input cotangents, weight cotangents)).
  """
  def forward(inputs, weights, states, rngs):
    def f(x, ws):
      stack, new_states = x, []
      for layer, w, s, rng in zip(layers, ws, states, rngs):
        y, new_state = _plain_forward(
            layer, cb.inputs_from_stack(stack, layer.n_in), w, s, rng)
        stack = cb.outputs_onto_stack(y, stack, layer.n_in)
        new_states.append(new_state)
      return stack, new_states
    outputs, vjp_fn, new_states = jax.vjp(f, inputs, weights, has_aux=True)
    return outputs, new_states, vjp_fn
  return forward


def segment_backward_kept_fn(layers, optimizers, n_devices, adasum):
  """Backward + update of a segment from its kept vjp function.

  Returns (of the returned function):
    (new_weights, new_slots, grads_inputs, stats): lists over the layers
    (forward order) and the cotangents of the segment's inputs; each layer
    updated by its own optimizer as `reverse_and_fbo_fn` does.
  """
  def backward(vjp_fn, weights, grads, slots, opt_params, step):
    grads_inputs, grads_weights = vjp_fn(grads)
    new_weights, new_slots, stats = [], [], []
    for opt, w, g, sl, op in zip(optimizers, weights, grads_weights, slots,
                                 opt_params):
      if is_empty_tuple(w):
        new_weights.append(w)
        new_slots.append(sl)
        stats.append({})
        continue
      if n_devices > 1:
        g = average_gradients(g, n_devices, adasum)
      nw, ns, st = opt.tree_update(step, g, w, sl, op, store_slots=False)
      new_weights.append(nw)
      new_slots.append(ns)
      stats.append(st)
    return new_weights, new_slots, grads_inputs, stats
  del layers
  return backward
