"""`ReversibleSerial`: drop-in for trax's, checking its sublayers.

Mirrors `trax.layers.reversible.ReversibleSerial` (trax 1.4.1), a
`tl.Serial` of reversible layers, whose `reverse` and `reverse_and_grad`
walk the sublayers last first; on top of stock it rejects a sublayer that
is not reversible and weights or states without one entry per sublayer.
"""

from typing import Any, Sequence

from trax.layers import base
from trax.layers import combinators as cb
from trax.layers import reversible as trax_reversible

from trax_revplus.layers import arguments
from trax_revplus.trax_door import functions as trax_functions
from trax_revplus.typing import PRNGKey
from trax_revplus.typing import PyTree
from trax_revplus.typing import Stack

_split_rngs = trax_functions.split_rngs

ReversibleLayer = trax_reversible.ReversibleLayer


class ReversibleSerial(trax_reversible.ReversibleLayer, cb.Serial):
  """A reversible `tl.Serial`: every sublayer must be reversible.

  Drop-in for `trax.layers.ReversibleSerial` (trax 1.4.1). Forward, weights,
  state and sublayers are `tl.Serial`'s (sublayer rngs from
  `_split_rngs(rng, n_sublayers)`); nested lists of layers are flattened,
  nested `ReversibleSerial`s stay sublayers. Being a `tl.Serial`, it is
  flattened into its sublayers by trax's `extract_reversible_blocks`.
  """

  def __init__(self, *layers: base.Layer | Sequence[base.Layer]):
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
          'Use tl.Serial, or make it a trax.layers.ReversibleLayer.'
        )

  def reverse(
    self,
    output: Stack,
    weights: PyTree = (),
    state: PyTree = (),
    new_state: PyTree = (),
    rng: PRNGKey | None = None,
  ) -> Stack:
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
    arguments.check_per_sublayer(
      self, weights=weights, state=state, new_state=new_state
    )
    rngs = _split_rngs(rng, len(self.sublayers))
    stack = output
    for layer, w, s, ns, layer_rng in reversed(
      list(zip(self.sublayers, weights, state, new_state, rngs))
    ):
      layer_val = cb.inputs_from_stack(stack, layer.n_out)
      layer_val = layer.reverse(layer_val, w, s, ns, rng=layer_rng)
      stack = cb.outputs_onto_stack(layer_val, stack, layer.n_out)
    return stack

  def reverse_and_grad(
    self,
    output: Stack,
    grad: Stack,
    weights: PyTree = (),
    state: PyTree = (),
    new_state: PyTree = (),
    rng: PRNGKey | None = None,
  ) -> tuple[Stack, tuple[Stack, tuple[PyTree, ...]]]:
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
    arguments.check_per_sublayer(
      self, weights=weights, state=state, new_state=new_state
    )
    rngs = _split_rngs(rng, len(self.sublayers))
    stack = output
    stack_grad = grad
    weights_grad: list[Any] = []
    for layer, w, s, ns, layer_rng in reversed(
      list(zip(self.sublayers, weights, state, new_state, rngs))
    ):
      layer_val = cb.inputs_from_stack(stack, layer.n_out)
      layer_ct = cb.inputs_from_stack(stack_grad, layer.n_out)
      layer_val, (layer_ct, w_ct) = layer.reverse_and_grad(
        layer_val, layer_ct, w, s, ns, rng=layer_rng
      )
      weights_grad.insert(0, w_ct)
      stack = cb.outputs_onto_stack(layer_val, stack, layer.n_out)
      stack_grad = cb.outputs_onto_stack(layer_ct, stack_grad, layer.n_out)
    return stack, (stack_grad, tuple(weights_grad))
