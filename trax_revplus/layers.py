# coding=utf-8
"""Reversible layers: drop-in replacements for `trax.layers.reversible`'s.

`ReversibleHalfResidual` and `ReversibleSerial` have the constructor
signatures, `n_in`/`n_out`, weights and state structure, sublayers and forward
computation (including per-sublayer rng splitting) of trax 1.4.1's classes of
the same names, so checkpoints and weights move between the two unchanged and
`trax.optimizers.trainer.extract_reversible_blocks` treats them alike. On top
of stock they

- implement `ReversibleHalfResidual.reverse` (stock raises
  `NotImplementedError`), so `reverse(forward(x))` works for every layer of a
  Reformer/Terraformer stack;
- check that `weights`, `state` and `new_state` passed to `reverse` and
  `reverse_and_grad` have one entry per sublayer (stock silently truncates a
  short tuple with `zip` and returns wrong results) and raise `ValueError`
  otherwise;
- rematerialise the residual in the backward pass too when weights are
  sharded (`trax.layers.base.N_WEIGHTS_SHARDS > 1`), not only in `forward`;
- take numpy arrays as well as jax arrays for weights, state and
  cotangents, also with efficient attention running `lax.fori_loop` (stock
  raises `TracerArrayConversionError` there).

`reconstruction_error` walks a layer or a whole model and reports, per
reversible layer, how far the inputs reconstructed from the outputs are from
the true inputs.

Stack layout (trax convention): a layer with `n_in` inputs takes the top
`n_in` items of the data stack, as a single array when `n_in == 1` and as a
tuple otherwise; item 0 is the top of the stack.
"""

import dataclasses
from typing import Tuple

import jax
import numpy as np
from trax import fastmath
from trax import shapes
from trax.layers import base
from trax.layers import combinators as cb
from trax.layers import reversible as trax_reversible

_split_rngs = cb._split_rngs  # pylint: disable=protected-access

ReversibleLayer = trax_reversible.ReversibleLayer


def _is_float0_or_none(x):
  # `None` is the TFNP backend's cotangent of an int/bool value; JAX uses an
  # array of dtype float0. Either way there is nothing to add.
  return x is None or getattr(x, 'dtype', None) == jax.float0


def _add_cotangents(x, y):
  """Adds two cotangents, ignoring those of int/bool values (float0/None)."""
  if _is_float0_or_none(x):
    return y
  if _is_float0_or_none(y):
    return x
  return x + y


def _as_tuple(xs):
  return tuple(xs) if isinstance(xs, (tuple, list)) else (xs,)


def _as_jax_arrays(*trees):
  """`trees` with numpy leaves turned into jax arrays (float0 ones kept).

  trax's efficient attention (e.g. `LSHSelfAttention` without
  `use_python_loop`) indexes its weights, state and output cotangents with
  loop counters inside `lax.fori_loop`, which a numpy array cannot take
  (`TracerArrayConversionError`, in stock trax too); jax arrays and tracers
  can, and pass through unchanged.
  """
  def convert(x):
    if (isinstance(x, (np.ndarray, np.generic)) and
        x.dtype != jax.dtypes.float0):
      return jax.numpy.asarray(x)
    return x
  return jax.tree_util.tree_map(convert, trees)


def _replace_second_time(state, new_state):
  """Marks states of `_RememberInReverse`-style layers as a second pass.

  A layer whose state is `(value, {'running_second_time': ...})` (trax's
  `sparsity._RememberInReverse`, used by Terraformer's sparse feed-forward)
  recorded `value` on the forward pass. When the residual is recomputed for
  the backward pass it must replay that value rather than recompute it, so it
  gets `(new_value, {'running_second_time_yes': ()})`. Mirrors the closure of
  the same name in trax's `ReversibleHalfResidual.reverse_and_grad`.

  Args:
    state: the state the forward pass started from (nested tuples/lists).
    new_state: the state the forward pass returned; same structure.

  Returns:
    `state` with every remembering layer's entry replaced as above.

  Raises:
    ValueError: if `state` and `new_state` differ in structure.
  """
  if (isinstance(state, tuple) and len(state) == 2 and
      isinstance(state[1], dict) and 'running_second_time' in state[1]):
    return (new_state[0], {'running_second_time_yes': ()})
  if isinstance(state, (tuple, list)):
    if (not isinstance(new_state, (tuple, list)) or
        len(new_state) != len(state)):
      raise ValueError(
          'state and new_state differ in structure: state has '
          f'{len(state)} entries, new_state is {type(new_state).__name__} '
          f'{new_state!r:.80}. Pass the new_state returned by the forward pass '
          'that started from this state.')
    return type(state)(
        _replace_second_time(s, ns) for s, ns in zip(state, new_state))
  return state


def _check_per_sublayer(layer, **trees):
  """Raises ValueError unless each tree has one entry per sublayer."""
  n = len(layer.sublayers)
  for arg_name, tree in trees.items():
    if not isinstance(tree, (tuple, list)) or len(tree) != n:
      got = len(tree) if isinstance(tree, (tuple, list)) else type(tree)
      raise ValueError(
          f'{layer.name}: {arg_name} must have one entry per sublayer '
          f'({n}), got {got}. Pass the layer\'s weights/state (e.g. '
          f'layer.weights, layer.state, and the state returned by forward).')


def _forward_and_or_backward(layer):
  """`forward_and_or_backward` for attention layers that do not define it.

  Same contract as `trax.layers.reversible._forward_and_or_backward`, except
  that without `output_grad` it runs `layer.pure_fn` alone instead of building
  a VJP it does not use (same outputs).

  Args:
    layer: a trax layer, e.g. `tl.Chunk(tl.SelfAttention(...), chunk_size)`.

  Returns:
    A function `(inputs, weights, state, rng, output_grad=None,
    compute_output=True, update_state=True) -> (output, new_state,
    inputs_grad, weights_grad)`; `output` is None unless `compute_output`,
    `new_state` is None unless `update_state`, the grads are None unless
    `output_grad` is given.
  """

  def forward_and_or_backward(inputs, weights, state, rng, output_grad=None,
                              compute_output=True, update_state=True):
    if output_grad is None:
      output, new_state = layer.pure_fn(inputs, weights, state, rng)
      grads_inputs, grads_weights = None, None
    else:
      output, vjp_fn, new_state = fastmath.vjp(
          layer.pure_fn, inputs, weights, state, rng, has_aux=True)
      grads_inputs, grads_weights, _, _ = vjp_fn(output_grad)
    output = output if compute_output else None
    new_state = new_state if update_state else None
    return output, new_state, grads_inputs, grads_weights

  return forward_and_or_backward


class ReversibleHalfResidual(ReversibleLayer):
  """Half of a RevNet-style residual, optionally ending in attention.

  Drop-in for `trax.layers.ReversibleHalfResidual` (trax 1.4.1).

  Stack layout (`n_in == n_out == k + 1`, `k` the most stack items the
  residual computation reads)::

      [accumulator, *context] -> [accumulator + f(context), *context]

  `f` is `Serial(*residual_layers)` applied to the top of `context`, followed,
  if given, by `attention_layer` applied to the top of the resulting stack;
  its first output is the residual. `context` is passed through unchanged;
  it may hold int/bool arrays (token ids, masks), whose cotangents are
  `float0`/None and are never added. The accumulator and residual must have
  the same shape and dtype, e.g. float `[batch, length, d_model]`.

  Weights and state: `(residual_weights,)` without attention,
  `(residual_weights, attention_weights)` with it (same for state); sublayers
  are `(Serial(*residual_layers),)` or `(Serial(...), attention_layer)`.

  The attention layer is special-cased as in trax: if it has
  `forward_and_or_backward` (trax's efficient attention, e.g.
  `LSHSelfAttention`, `SelfAttention`) that is used to compute the residual
  and its gradients together on the backward pass, and the backward pass uses
  the state from the forward pass (`new_state`, e.g. LSH bucket assignments),
  so attention is replayed exactly. Other attention layers (e.g. a
  `tl.Chunk`-wrapped one) get a VJP-based equivalent.

  Weights, state and cotangents may be numpy or jax arrays alike; numpy ones
  are turned into jax arrays first, which trax's efficient attention needs
  inside `lax.fori_loop` (stock raises `TracerArrayConversionError`).
  """

  def __init__(self, *residual_layers, attention_layer=None, name=None):
    """Creates the layer.

    Args:
      *residual_layers: layers (or lists of layers) computing the residual
        from the context, combined with `tl.Serial`.
      attention_layer: optional attention layer applied after them.
      name: optional layer name (trax models pass e.g.
        'ReversibleHalfResidualDecoderAttn').
    """
    super().__init__(name=name)
    self._compute_residual = cb.Serial(*residual_layers)
    self._attention_layer = attention_layer
    if attention_layer is None:
      self._sublayers = (self._compute_residual,)
      self._forward_and_or_backward = None
    else:
      if hasattr(attention_layer, 'forward_and_or_backward'):
        self._forward_and_or_backward = attention_layer.forward_and_or_backward
      else:
        self._forward_and_or_backward = _forward_and_or_backward(
            attention_layer)
      self._sublayers = (self._compute_residual, self._attention_layer)

    running_max = 0
    running_total = 0
    for layer in self._sublayers:
      running_total += layer.n_in
      running_max = max(running_max, running_total)
      running_total -= layer.n_out
    self._n_in = self._n_out = running_max + 1

  def forward(self, xs):
    """Computes `[accumulator + f(context), *context]`.

    Mirrors `trax.layers.ReversibleHalfResidual.forward`: sublayer rngs come
    from `_split_rngs(self.rng, n_sublayers)`; with
    `base.N_WEIGHTS_SHARDS > 1` each sublayer runs under `jax.checkpoint` so
    its unsharded (concatenated) weights are not kept for the backward pass.

    Args:
      xs: tuple of `n_in` arrays, `[accumulator, *context]`.

    Returns:
      Tuple of `n_out` arrays, `[accumulator + residual, *context]`.
    """
    rngs = _split_rngs(self.rng, len(self.sublayers))
    weights, state = _as_jax_arrays(self.weights, self.state)
    accumulator, *context = xs
    stack = context = tuple(context)
    new_state = []
    for layer, w, s, rng in zip(self.sublayers, weights, state, rngs):
      inputs = cb.inputs_from_stack(stack, layer.n_in)
      if base.N_WEIGHTS_SHARDS > 1:
        outputs, s = jax.checkpoint(layer.pure_fn)(inputs, w, s, rng)
      else:
        outputs, s = layer.pure_fn(inputs, w, s, rng)
      stack = cb.outputs_onto_stack(outputs, stack, layer.n_in)
      new_state.append(s)
    residual = stack[0] if isinstance(stack, (tuple, list)) else stack
    output = accumulator + residual
    self.state = tuple(new_state)
    return (output,) + context

  def _residual_fn(self):
    pure_fn = self._compute_residual.pure_fn
    if base.N_WEIGHTS_SHARDS > 1:
      # Keeps only the sharded weights as VJP residuals.
      pure_fn = jax.checkpoint(pure_fn)
    return pure_fn

  def reverse(self, output, weights=(), state=(), new_state=(), rng=None):
    """Reconstructs the inputs from the outputs of `forward`.

    Recomputes the residual from the (unchanged) context exactly as
    `reverse_and_grad` does and subtracts it from the accumulator. Stock
    trax's `reverse` raises `NotImplementedError`.

    Args:
      output: tuple of `n_out` arrays `[accumulator + residual, *context]`,
        as returned by `forward`.
      weights: this layer's weights, one entry per sublayer.
      state: the state `forward` started from, one entry per sublayer.
      new_state: the state `forward` returned, one entry per sublayer.
      rng: the rng `forward` used (JAX PRNG key), or None.

    Returns:
      Tuple of `n_in` arrays `[accumulator, *context]`.

    Raises:
      ValueError: if weights, state or new_state do not have one entry per
        sublayer, or state and new_state differ in structure.
    """
    _check_per_sublayer(self, weights=weights, state=state,
                        new_state=new_state)
    weights, state, new_state = _as_jax_arrays(weights, state, new_state)
    rngs = _split_rngs(rng, len(self.sublayers))
    accumulator_output, *context = output
    context = tuple(context)

    state_to_pass = _replace_second_time(state[0], new_state[0])
    inputs = cb.inputs_from_stack(context, self._compute_residual.n_in)
    outputs, _ = self._compute_residual.pure_fn(
        inputs, weights[0], state_to_pass, rngs[0])
    stack = cb.outputs_onto_stack(outputs, context, self._compute_residual.n_in)
    if self._attention_layer is None:
      residual = stack[0] if isinstance(stack, (tuple, list)) else stack
    else:
      inputs = cb.inputs_from_stack(stack, self._attention_layer.n_in)
      residual, _, _, _ = self._forward_and_or_backward(
          inputs, weights[1], new_state[1], rngs[1], output_grad=None,
          compute_output=True, update_state=False)
    return (accumulator_output - residual,) + context

  def reverse_and_grad(self, output, ct, weights=(), state=(), new_state=(),
                       rng=None):
    """Reconstructs the inputs and back-propagates cotangents.

    Mirrors `trax.layers.ReversibleHalfResidual.reverse_and_grad`: the
    residual is recomputed from the context (second-pass states replayed, see
    `_replace_second_time`), residual outputs beyond those the attention layer
    consumes are moved to aux and get no cotangent, and the attention layer's
    `forward_and_or_backward` runs with `new_state`.

    Args:
      output: tuple of `n_out` arrays `[accumulator + residual, *context]`.
      ct: cotangents of `output`, same structure, shapes and (float) dtypes;
        int/bool items have `float0` (or None) cotangents.
      weights: this layer's weights, one entry per sublayer.
      state: the state `forward` started from, one entry per sublayer.
      new_state: the state `forward` returned, one entry per sublayer.
      rng: the rng `forward` used (JAX PRNG key), or None.

    Returns:
      `(inputs, (inputs_ct, weights_ct))`: `inputs` the reconstructed
      `[accumulator, *context]` (tuple of `n_in` arrays), `inputs_ct` their
      cotangents (tuple, same structure), `weights_ct` cotangents of
      `weights` (tuple, one entry per sublayer).

    Raises:
      ValueError: if weights, state or new_state do not have one entry per
        sublayer, or state and new_state differ in structure.
    """
    _check_per_sublayer(self, weights=weights, state=state,
                        new_state=new_state)
    ct, weights, state, new_state = _as_jax_arrays(
        ct, weights, state, new_state)
    rngs = _split_rngs(rng, len(self.sublayers))
    accumulator_output, *context = output
    context = tuple(context)
    accumulator_output_ct, *context_ct = ct
    context_ct = tuple(context_ct)

    state_to_pass = _replace_second_time(state[0], new_state[0])
    residual_fn = self._residual_fn()
    n_attention_in = (None if self._attention_layer is None
                      else self._attention_layer.n_in)

    def call_compute_residual(x, w):
      res, _ = residual_fn(x, w, state_to_pass, rngs[0])
      if not isinstance(res, (tuple, list)):
        return res, None
      res = tuple(res)
      n_differentiable = 1
      if n_attention_in is not None:
        n_differentiable = min(len(res), n_attention_in)
      return res[:n_differentiable], res[n_differentiable:]

    stack = context
    inputs = cb.inputs_from_stack(stack, self._compute_residual.n_in)
    outputs, compute_residual_vjpfun, outputs_aux = fastmath.vjp(
        call_compute_residual, inputs, weights[0], has_aux=True)
    if outputs_aux is not None:
      n_differentiable_outputs = len(outputs)
      outputs = outputs + outputs_aux
    stack = cb.outputs_onto_stack(outputs, stack, self._compute_residual.n_in)

    stack_ct = accumulator_output_ct
    if self._attention_layer is None:
      residual = stack[0] if isinstance(stack, (tuple, list)) else stack
      weights_ct_attention = ()
    else:
      inputs = cb.inputs_from_stack(stack, self._attention_layer.n_in)
      residual, _, attn_inputs_ct, attn_weights_ct = (
          self._forward_and_or_backward(
              inputs, weights[1], new_state[1], rngs[1],
              output_grad=accumulator_output_ct,
              compute_output=True, update_state=False))
      stack_ct = cb.outputs_onto_stack(
          attn_inputs_ct, stack_ct, self._attention_layer.n_out)
      weights_ct_attention = (attn_weights_ct,)

    compute_residual_ct = cb.inputs_from_stack(
        stack_ct, self._compute_residual.n_out)
    if outputs_aux is not None:
      compute_residual_ct = _as_tuple(compute_residual_ct)
      compute_residual_ct = compute_residual_ct[:n_differentiable_outputs]
      if len(compute_residual_ct) != n_differentiable_outputs:
        raise ValueError(
            f'{self.name}: residual layers returned {n_differentiable_outputs}'
            f' differentiable outputs but only {len(compute_residual_ct)} '
            'cotangents reach them; check n_out of the residual layers.')
    compute_residual_inputs_ct, compute_residual_weights_ct = (
        compute_residual_vjpfun(compute_residual_ct))
    stack_ct = cb.outputs_onto_stack(
        compute_residual_inputs_ct, stack_ct, self._compute_residual.n_out)
    stack_ct = _as_tuple(stack_ct)
    stack_ct = ((accumulator_output_ct,) +
                fastmath.nested_map_multiarg(
                    _add_cotangents, context_ct[:len(stack_ct)], stack_ct) +
                context_ct[len(stack_ct):])

    reconstructed_x = accumulator_output - residual
    stack = (reconstructed_x,) + context
    weights_ct = (compute_residual_weights_ct,) + weights_ct_attention
    return stack, (stack_ct, weights_ct)

  # pylint: disable=protected-access
  def init_weights_and_state(self, input_signature):
    """Initializes weights and state; mirrors the stock method.

    Args:
      input_signature: tuple of `n_in` `ShapeDtype`s, `[accumulator,
        *context]`; the accumulator's is not used.
    """
    stack = input_signature[1:]
    if len(stack) == 1:
      stack = stack[0]

    inputs = cb.inputs_from_stack(stack, self._compute_residual.n_in)
    weights, state = self._compute_residual.init(inputs)
    outputs, _ = self._compute_residual._forward_abstract(inputs)
    stack = cb.outputs_onto_stack(outputs, stack, self._compute_residual.n_in)

    if self._attention_layer is None:
      self.state = (state,)
      self.weights = (weights,)
    else:
      inputs = cb.inputs_from_stack(stack, self._attention_layer.n_in)
      attn_weights, attn_state = self._attention_layer.init(inputs)
      self.state = (state, attn_state)
      self.weights = (weights, attn_weights)
  # pylint: enable=protected-access


class ReversibleSerial(ReversibleLayer, cb.Serial):
  """A reversible `tl.Serial`: every sublayer must be reversible.

  Drop-in for `trax.layers.ReversibleSerial` (trax 1.4.1). Forward, weights,
  state and sublayers are `tl.Serial`'s (sublayer rngs from
  `_split_rngs(rng, n_sublayers)`); nested lists of layers are flattened,
  nested `ReversibleSerial`s stay sublayers. Being a `tl.Serial`, it is
  flattened into its sublayers by trax's `extract_reversible_blocks`.
  """

  def __init__(self, *layers):
    """Creates the layer.

    Args:
      *layers: reversible layers, or (nested) lists of them.

    Raises:
      ValueError: if a sublayer is not a `trax.layers.ReversibleLayer`.
    """
    super().__init__(*layers)
    for i, layer in enumerate(self.sublayers):
      if not isinstance(layer, ReversibleLayer):
        raise ValueError(
            f'Sub-layer {i} of ReversibleSerial is not reversible: {layer}. '
            'Use tl.Serial, or make it a trax.layers.ReversibleLayer.')

  def reverse(self, output, weights=(), state=(), new_state=(), rng=None):
    """Reconstructs the inputs from the outputs, last sublayer first.

    Mirrors `trax.layers.ReversibleSerial.reverse`.

    Args:
      output: the `n_out` stack items `forward` returned.
      weights: this layer's weights, one entry per sublayer.
      state: the state `forward` started from, one entry per sublayer.
      new_state: the state `forward` returned, one entry per sublayer.
      rng: the rng `forward` used (JAX PRNG key), or None.

    Returns:
      The `n_in` reconstructed input stack items.

    Raises:
      ValueError: if weights, state or new_state do not have one entry per
        sublayer.
    """
    _check_per_sublayer(self, weights=weights, state=state,
                        new_state=new_state)
    rngs = _split_rngs(rng, self._n_layers)
    stack = output
    for layer, w, s, ns, layer_rng in reversed(list(zip(
        self.sublayers, weights, state, new_state, rngs))):
      layer_val = cb.inputs_from_stack(stack, layer.n_out)
      layer_val = layer.reverse(layer_val, w, s, ns, rng=layer_rng)
      stack = cb.outputs_onto_stack(layer_val, stack, layer.n_out)
    return stack

  def reverse_and_grad(self, output, grad, weights=(), state=(), new_state=(),
                       rng=None):
    """Reconstructs the inputs and back-propagates, last sublayer first.

    Mirrors `trax.layers.ReversibleSerial.reverse_and_grad`.

    Args:
      output: the `n_out` stack items `forward` returned.
      grad: their cotangents, same structure (`float0`/None for int/bool).
      weights: this layer's weights, one entry per sublayer.
      state: the state `forward` started from, one entry per sublayer.
      new_state: the state `forward` returned, one entry per sublayer.
      rng: the rng `forward` used (JAX PRNG key), or None.

    Returns:
      `(inputs, (inputs_ct, weights_ct))`: the reconstructed `n_in` input
      stack items, their cotangents, and a tuple of weight cotangents with
      one entry per sublayer.

    Raises:
      ValueError: if weights, state or new_state do not have one entry per
        sublayer.
    """
    _check_per_sublayer(self, weights=weights, state=state,
                        new_state=new_state)
    rngs = _split_rngs(rng, self._n_layers)
    stack = output
    stack_grad = grad
    weights_grad = []
    for layer, w, s, ns, layer_rng in reversed(list(zip(
        self.sublayers, weights, state, new_state, rngs))):
      layer_val = cb.inputs_from_stack(stack, layer.n_out)
      layer_ct = cb.inputs_from_stack(stack_grad, layer.n_out)
      layer_val, (layer_ct, w_ct) = layer.reverse_and_grad(
          layer_val, layer_ct, w, s, ns, rng=layer_rng)
      weights_grad.insert(0, w_ct)
      stack = cb.outputs_onto_stack(layer_val, stack, layer.n_out)
      stack_grad = cb.outputs_onto_stack(layer_ct, stack_grad, layer.n_out)
    return stack, (stack_grad, tuple(weights_grad))


# ---------------------------------------------------------------------------
# reconstruction_error


@dataclasses.dataclass(frozen=True)
class ReconstructionRecord:
  """Reconstruction error of one reversible layer.

  Errors compare reconstructed input stack items with the true ones, over all
  `n_in` items (int/bool items too, as floats), in float64:
  `max_abs_error = max |x_rec - x|`, `max_rel_error = max_abs_error /
  max |x|` (0 if both are 0; inf if only `max |x|` is 0).

  Attributes:
    index: position among the model's reversible layers, in forward order.
    path: sublayer indices from the walked layer down to this one, e.g.
      `(5, 3)` is `model.sublayers[5].sublayers[3]`; `()` is the layer itself.
    name: the layer's name.
    block: index of the run of consecutive reversible layers it belongs to
      (one run per reversible block as `extract_reversible_blocks` sees it).
    max_abs_error: error of the inputs reconstructed by reversing the whole
      block from its output down to this layer, as the reversible trainer
      does; grows with depth when reversal drifts.
    max_rel_error: `max_abs_error` relative to max |true inputs|.
    local_max_abs_error: error of reversing this layer alone from its true
      outputs.
    local_max_rel_error: `local_max_abs_error` relative to max |true inputs|.
  """
  index: int
  path: Tuple[int, ...]
  name: str
  block: int
  max_abs_error: float
  max_rel_error: float
  local_max_abs_error: float
  local_max_rel_error: float

  def as_dict(self):
    return dataclasses.asdict(self)


def _flat_leaves(layer, weights, state, rng, path):
  """Yields (path, layer, weights, state, rng) for the layers a run visits.

  `tl.Serial` (and so `ReversibleSerial`) layers are opened up, with the rngs
  `Serial.forward` would give their sublayers, so running the leaves in order
  on one stack is `layer.pure_fn` (as `extract_reversible_blocks` flattens).
  """
  if isinstance(layer, cb.Serial) and layer.sublayers:
    n = len(layer.sublayers)
    if not isinstance(weights, (tuple, list)) or len(weights) != n:
      raise ValueError(
          f'{layer.name} at path {path}: weights must have one entry per '
          f'sublayer ({n}); pass the weights of this layer or model.')
    if not isinstance(state, (tuple, list)) or len(state) != n:
      raise ValueError(
          f'{layer.name} at path {path}: state must have one entry per '
          f'sublayer ({n}); pass the state of this layer or model.')
    rngs = _split_rngs(rng, n)
    for i, (sub, w, s, r) in enumerate(
        zip(layer.sublayers, weights, state, rngs)):
      yield from _flat_leaves(sub, w, s, r, path + (i,))
  else:
    yield path, layer, weights, state, rng


def _zero_cotangent(x):
  x = jax.numpy.asarray(x)
  if jax.numpy.issubdtype(x.dtype, jax.numpy.inexact):
    return jax.numpy.zeros_like(x)
  return np.zeros(x.shape, dtype=jax.dtypes.float0)


def _reverse(layer, outputs, weights, state, new_state, rng):
  """`layer.reverse`, or `reverse_and_grad` for layers that only have that."""
  try:
    return layer.reverse(outputs, weights, state, new_state, rng)
  except NotImplementedError:
    ct = fastmath.nested_map(_zero_cotangent, outputs)
    return layer.reverse_and_grad(outputs, ct, weights, state, new_state,
                                  rng)[0]


def _errors(reconstructed, true):
  """(max abs error, max rel error) over stack items, in float64."""
  rec = [np.asarray(x).astype(np.float64) for x in _as_tuple(reconstructed)]
  ref = [np.asarray(x).astype(np.float64) for x in _as_tuple(true)]
  if len(rec) != len(ref):
    raise ValueError(f'reverse returned {len(rec)} stack items, '
                     f'expected {len(ref)}.')
  max_abs = max([float(np.max(np.abs(a - b))) if a.size else 0.0
                 for a, b in zip(rec, ref)] + [0.0])
  scale = max([float(np.max(np.abs(b))) if b.size else 0.0
               for b in ref] + [0.0])
  if max_abs == 0.0:
    max_rel = 0.0
  else:
    max_rel = max_abs / scale if scale > 0 else float('inf')
  return max_abs, max_rel


def reconstruction_error(layer_or_model, inputs, weights=None, state=None,
                         rng=None):
  """Measures how exactly reversible layers reconstruct their inputs.

  Runs `layer_or_model` forward on `inputs` layer by layer (opening up
  `tl.Serial` and `ReversibleSerial` combinators, with the same rng splits as
  `pure_fn`), then, for each run of consecutive reversible layers (a
  reversible block), reverses from the block's output down to its input and
  compares each layer's reconstructed inputs with the true ones. Works with
  trax's and trax_revplus's reversible layers (for layers without `reverse`,
  such as stock `ReversibleHalfResidual`, `reverse_and_grad` with zero
  cotangents is used). Non-reversible layers just run forward.

  Args:
    layer_or_model: a reversible layer, a `ReversibleSerial`, or a model (e.g.
      `trax.models.ReformerLM(...)`, with or without a loss layer).
    inputs: the model's inputs: an array or a tuple of `n_in` arrays, e.g.
      int32 tokens `[batch, length]` for a language model.
    weights: the model's weights; None uses `layer_or_model.weights`, and if
      it holds no arrays yet the model is first initialised with
      `layer_or_model.init(shapes.signature(inputs))`.
    state: the model's state; None uses `layer_or_model.state` (after the
      initialisation above, if any).
    rng: JAX PRNG key for the run (dropout etc.); None uses
      `layer_or_model.rng`.

  Returns:
    `(records, summary)`: `records` is a list of `ReconstructionRecord`, one
    per reversible layer in forward order (`record.as_dict()` gives a dict);
    `summary` is a one-line string naming the number of reversible layers and
    blocks and the worst layer by `max_rel_error`.

  Raises:
    ValueError: if the model holds no reversible layer, if `weights` or
      `state` do not match the model's structure, or if `weights` is given
      but `state` is None for an uninitialised model.
  """
  if weights is None:
    if not fastmath.tree_leaves(layer_or_model.weights):
      if state is not None:
        raise ValueError('reconstruction_error: state given but weights None '
                         'for an uninitialised model; pass both or neither.')
      layer_or_model.init(shapes.signature(inputs))
    weights = layer_or_model.weights
  if state is None:
    state = layer_or_model.state
  if rng is None:
    rng = layer_or_model.rng

  leaves = list(_flat_leaves(layer_or_model, weights, state, rng, ()))
  if not any(isinstance(l, ReversibleLayer) for _, l, _, _, _ in leaves):
    raise ValueError(
        f'reconstruction_error: {layer_or_model.name} holds no reversible '
        'layer (trax.layers.ReversibleLayer); nothing to reconstruct.')

  records = []
  # (path, layer, weights, state, new_state, rng, inputs, outputs,
  #  stack after the layer) for each layer of the current reversible run.
  block = []
  n_blocks = 0

  def close_block():
    nonlocal n_blocks
    if not block:
      return
    first_index = len(records)
    # Reversal starts from the whole stack after the block's last layer.
    stack = block[-1][8]
    out_records = []
    for path, layer, w, s, ns, r, x, y, _ in reversed(block):
      x_rec = _reverse(layer, cb.inputs_from_stack(stack, layer.n_out),
                       w, s, ns, r)
      stack = cb.outputs_onto_stack(x_rec, stack, layer.n_out)
      abs_err, rel_err = _errors(cb.inputs_from_stack(stack, layer.n_in), x)
      local_abs, local_rel = _errors(_reverse(layer, y, w, s, ns, r), x)
      out_records.append(ReconstructionRecord(
          index=0, path=path, name=layer.name, block=n_blocks,
          max_abs_error=abs_err, max_rel_error=rel_err,
          local_max_abs_error=local_abs, local_max_rel_error=local_rel))
    for i, rec in enumerate(reversed(out_records)):
      records.append(dataclasses.replace(rec, index=first_index + i))
    block.clear()
    n_blocks += 1

  stack = inputs
  for path, layer, w, s, r in leaves:
    x = cb.inputs_from_stack(stack, layer.n_in)
    y, ns = layer.pure_fn(x, w, s, r, use_cache=True)
    if isinstance(layer, ReversibleLayer):
      block.append((path, layer, w, s, ns, r, x, y,
                    cb.outputs_onto_stack(y, stack, layer.n_in)))
    else:
      close_block()
    stack = cb.outputs_onto_stack(y, stack, layer.n_in)
  close_block()

  worst = max(records, key=lambda rec: rec.max_rel_error)
  summary = (
      f'reconstruction_error: {len(records)} reversible layers in {n_blocks} '
      f'block(s); worst max_rel_error {worst.max_rel_error:.3g} '
      f'(max_abs_error {worst.max_abs_error:.3g}) at layer {worst.index} '
      f'{worst.name} (path {".".join(map(str, worst.path)) or "-"})')
  return records, summary
