"""`forward_and_or_backward` for attention layers that do not define one.

trax's efficient attention layers (`LSHSelfAttention`, `SelfAttention`)
compute their output and gradients together in `forward_and_or_backward`;
`ReversibleHalfResidual` calls that on the backward pass. Other attention
layers (e.g. a `tl.Chunk`-wrapped one) get the VJP-based equivalent here.
"""

from typing import Callable

from trax import fastmath
from trax.layers import base

from trax_revplus.typing import PyTree
from trax_revplus.typing import Stack

# `(inputs, weights, state, rng, output_grad=None, compute_output=True,
# update_state=True) -> (output, new_state, inputs_grad, weights_grad)`.
ForwardAndOrBackward = Callable[
  ..., tuple[Stack | None, PyTree, Stack | None, PyTree]
]


def forward_and_or_backward(layer: base.Layer) -> ForwardAndOrBackward:
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

  def forward_and_or_backward(
    inputs,
    weights,
    state,
    rng,
    output_grad=None,
    compute_output=True,
    update_state=True,
  ):
    if output_grad is None:
      output, new_state = layer.pure_fn(inputs, weights, state, rng)
      grads_inputs, grads_weights = None, None
    else:
      output, vjp_fn, new_state = fastmath.vjp(
        layer.pure_fn, inputs, weights, state, rng, has_aux=True
      )
      grads_inputs, grads_weights, _, _ = vjp_fn(output_grad)
    output = output if compute_output else None
    new_state = new_state if update_state else None
    return output, new_state, grads_inputs, grads_weights

  return forward_and_or_backward
