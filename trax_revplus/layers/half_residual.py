"""`ReversibleHalfResidual`: drop-in for trax's, with `reverse`.

Mirrors `trax.layers.reversible.ReversibleHalfResidual` (trax 1.4.1):
constructor signature, `n_in`/`n_out`, weights and state structure,
sublayers, forward computation and per-sublayer rng splitting. On top of
stock it implements `reverse` (stock raises `NotImplementedError`), checks
that `reverse`'s weights and states have one entry per sublayer, recomputes
the residual in the backward pass too when weights are sharded, and takes
numpy arrays as well as jax arrays.

Cotangents of stack items, as trax's reversible layers pass them: the
cotangent of an int/bool stack item (token ids, masks) is an array of
dtype `jax.float0` under JAX and None under trax's TFNP backend; neither is
ever added to anything (`add_cotangents`).
"""

from typing import Sequence

import jax
from trax import fastmath
from trax import shapes
from trax.layers import base
from trax.layers import combinators as cb
from trax.layers import reversible as trax_reversible

from trax_revplus.layers import arguments
from trax_revplus.layers import attention
from trax_revplus.trax_door import functions as trax_functions
from trax_revplus.trax_door import layers as layer_door
from trax_revplus.typing import Array
from trax_revplus.typing import PRNGKey
from trax_revplus.typing import PyTree
from trax_revplus.typing import Stack

_split_rngs = trax_functions.split_rngs

ReversibleLayer = trax_reversible.ReversibleLayer


def is_float0_or_none(x: Array | None) -> bool:
  # `None` is the TFNP backend's cotangent of an int/bool value; JAX uses an
  # array of dtype float0. Either way there is nothing to add.
  return x is None or getattr(x, 'dtype', None) == jax.float0


def add_cotangents(x: Array | None, y: Array | None) -> Array | None:
  """Adds two cotangents, ignoring those of int/bool values (float0/None)."""
  if is_float0_or_none(x):
    return y
  if is_float0_or_none(y):
    return x
  assert x is not None and y is not None  # is_float0_or_none was False.
  return x + y


class ReversibleHalfResidual(trax_reversible.ReversibleLayer):
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

  # `tl.Layer`'s properties, as this class sets them (trax has no type
  # information).
  weights: tuple[PyTree, ...]
  state: tuple[PyTree, ...]

  def __init__(
    self,
    *residual_layers: base.Layer | Sequence[base.Layer],
    attention_layer: base.Layer | None = None,
    name: str | None = None,
  ):
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
    self._forward_and_or_backward: attention.ForwardAndOrBackward | None
    if attention_layer is None:
      layer_door.set_sublayers(self, (self._compute_residual,))
      self._forward_and_or_backward = None
    else:
      if hasattr(attention_layer, 'forward_and_or_backward'):
        self._forward_and_or_backward = attention_layer.forward_and_or_backward
      else:
        self._forward_and_or_backward = attention.forward_and_or_backward(
          attention_layer
        )
      layer_door.set_sublayers(self, (self._compute_residual, attention_layer))

    running_max = 0
    running_total = 0
    for layer in self.sublayers:
      running_total += layer.n_in
      running_max = max(running_max, running_total)
      running_total -= layer.n_out
    layer_door.set_n_in_n_out(self, running_max + 1, running_max + 1)

  def forward(self, xs: tuple[Array, ...]) -> tuple[Array, ...]:
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
    weights, state = arguments.as_jax_arrays(self.weights, self.state)
    accumulator, *context_items = xs
    stack = context = tuple(context_items)
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

  def reverse(
    self,
    output: tuple[Array, ...],
    weights: PyTree = (),
    state: PyTree = (),
    new_state: PyTree = (),
    rng: PRNGKey | None = None,
  ) -> tuple[Array, ...]:
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
    arguments.check_per_sublayer(
      self, weights=weights, state=state, new_state=new_state
    )
    weights, state, new_state = arguments.as_jax_arrays(
      weights, state, new_state
    )
    rngs = _split_rngs(rng, len(self.sublayers))
    accumulator_output, *context_items = output
    context = tuple(context_items)

    state_to_pass = arguments.replace_second_time(state[0], new_state[0])
    inputs = cb.inputs_from_stack(context, self._compute_residual.n_in)
    outputs, _ = self._compute_residual.pure_fn(
      inputs, weights[0], state_to_pass, rngs[0]
    )
    stack = cb.outputs_onto_stack(outputs, context, self._compute_residual.n_in)
    if self._attention_layer is None:
      residual = stack[0] if isinstance(stack, (tuple, list)) else stack
    else:
      inputs = cb.inputs_from_stack(stack, self._attention_layer.n_in)
      assert self._forward_and_or_backward is not None  # Set with attention.
      residual, _, _, _ = self._forward_and_or_backward(
        inputs,
        weights[1],
        new_state[1],
        rngs[1],
        output_grad=None,
        compute_output=True,
        update_state=False,
      )
    return (accumulator_output - residual,) + context

  def reverse_and_grad(
    self,
    output: tuple[Array, ...],
    ct: tuple[Array | None, ...],
    weights: PyTree = (),
    state: PyTree = (),
    new_state: PyTree = (),
    rng: PRNGKey | None = None,
  ) -> tuple[tuple[Array, ...], tuple[Stack, tuple[PyTree, ...]]]:
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
    arguments.check_per_sublayer(
      self, weights=weights, state=state, new_state=new_state
    )
    ct, weights, state, new_state = arguments.as_jax_arrays(
      ct, weights, state, new_state
    )
    rngs = _split_rngs(rng, len(self.sublayers))
    accumulator_output, *context_items = output
    context = tuple(context_items)
    accumulator_output_ct, *context_ct_items = ct
    context_ct = tuple(context_ct_items)

    state_to_pass = arguments.replace_second_time(state[0], new_state[0])
    residual_fn = self._residual_fn()
    n_attention_in = (
      None if self._attention_layer is None else self._attention_layer.n_in
    )

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
      call_compute_residual, inputs, weights[0], has_aux=True
    )
    if outputs_aux is not None:
      n_differentiable_outputs = len(outputs)
      outputs = outputs + outputs_aux
    stack = cb.outputs_onto_stack(outputs, stack, self._compute_residual.n_in)

    stack_ct: Stack | None = accumulator_output_ct
    weights_ct_attention: tuple[PyTree, ...]
    if self._attention_layer is None:
      residual = stack[0] if isinstance(stack, (tuple, list)) else stack
      weights_ct_attention = ()
    else:
      inputs = cb.inputs_from_stack(stack, self._attention_layer.n_in)
      assert self._forward_and_or_backward is not None  # Set with attention.
      residual, _, attn_inputs_ct, attn_weights_ct = (
        self._forward_and_or_backward(
          inputs,
          weights[1],
          new_state[1],
          rngs[1],
          output_grad=accumulator_output_ct,
          compute_output=True,
          update_state=False,
        )
      )
      stack_ct = cb.outputs_onto_stack(
        attn_inputs_ct, stack_ct, self._attention_layer.n_out
      )
      weights_ct_attention = (attn_weights_ct,)

    compute_residual_ct = cb.inputs_from_stack(
      stack_ct, self._compute_residual.n_out
    )
    if outputs_aux is not None:
      compute_residual_ct = arguments.as_tuple(compute_residual_ct)
      compute_residual_ct = compute_residual_ct[:n_differentiable_outputs]
      if len(compute_residual_ct) != n_differentiable_outputs:
        raise ValueError(
          f'{self.name}: residual layers returned {n_differentiable_outputs}'
          f' differentiable outputs but only {len(compute_residual_ct)} '
          'cotangents reach them; check n_out of the residual layers.'
        )
    compute_residual_inputs_ct, compute_residual_weights_ct = (
      compute_residual_vjpfun(compute_residual_ct)
    )
    stack_ct = cb.outputs_onto_stack(
      compute_residual_inputs_ct, stack_ct, self._compute_residual.n_out
    )
    stack_ct = arguments.as_tuple(stack_ct)
    stack_ct = (
      (accumulator_output_ct,)
      + fastmath.nested_map_multiarg(
        add_cotangents, context_ct[: len(stack_ct)], stack_ct
      )
      + context_ct[len(stack_ct) :]
    )

    reconstructed_x = accumulator_output - residual
    stack = (reconstructed_x,) + context
    weights_ct = (compute_residual_weights_ct,) + weights_ct_attention
    return stack, (stack_ct, weights_ct)

  def init_weights_and_state(
    self, input_signature: tuple[shapes.ShapeDtype, ...]
  ) -> None:
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
    outputs, _ = layer_door.forward_abstract(self._compute_residual, inputs)
    stack = cb.outputs_onto_stack(outputs, stack, self._compute_residual.n_in)

    if self._attention_layer is None:
      self.state = (state,)
      self.weights = (weights,)
    else:
      inputs = cb.inputs_from_stack(stack, self._attention_layer.n_in)
      attn_weights, attn_state = self._attention_layer.init(inputs)
      self.state = (state, attn_state)
      self.weights = (weights, attn_weights)
