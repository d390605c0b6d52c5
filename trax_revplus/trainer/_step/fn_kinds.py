"""The kinds of compiled step function: their arguments and their layouts.

`Kind` names what a compiled step function computes, the order of its
arguments and results, how each is laid out over the devices, which hold
parameters and which may be donated. The builders of each kind's function
are `step_fns`; the compile cache (`compilation`) and the unit factory
read the kinds alone, without building any function.
"""

import enum

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
  FUSED_LOSS: forward, backward and update of consecutive layers ending
    in the loss layer, in one program; every per-layer argument and result
    is a list over the layers.
    (inputs, weights, states, slots, opt params, rngs, step) -> (new
    weights, new states, new slots, input cotangents, stats)

  Each kind's function may run over batch slices (`slices`); its arguments
  and results are the same either way.
  """

  FORWARD = 'fwd'
  FORWARD_BACKWARD_UPDATE = 'std'
  LOSS = 'loss'
  SEGMENT_FORWARD = 'rev_fwd'
  SEGMENT_REVERSE_UPDATE = 'rev'
  FUSED_LOSS = 'fused_loss'

  @property
  def in_layouts(self) -> tuple[placement_lib.Layout, ...]:
    """`placement.Layout` of each positional argument."""
    return _IN_LAYOUTS[self]

  @property
  def out_layouts(self) -> tuple[placement_lib.Layout, ...]:
    """`placement.Layout` of each result."""
    return _OUT_LAYOUTS[self]

  @property
  def updates(self) -> bool:
    """Whether it updates weights, averaging gradients over devices (so its
    program holds cross-device collectives on N > 1 devices)."""
    return self not in (Kind.FORWARD, Kind.SEGMENT_FORWARD)

  @property
  def parameters(self) -> tuple[int, ...]:
    """Argument positions of the weights and the slots."""
    if self is Kind.SEGMENT_REVERSE_UPDATE:
      return (1, 5)
    if self is Kind.FUSED_LOSS:
      return (1, 3)
    return (1, 4) if self.updates else (1,)

  @property
  def donated(self) -> tuple[int, ...]:
    """Argument positions it replaces by its results, never read again, so
    their buffers may be donated: weights and slots; for a reverse step
    also the outputs and their cotangents, which its reconstructed inputs
    and their cotangents replace on the stacks (as trax's
    `_reverse_and_fbo_with_layer_and_opt` donates them)."""
    if self is Kind.SEGMENT_REVERSE_UPDATE:
      return (0, 1, 2, 5)
    if self is Kind.FUSED_LOSS:
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
  Kind.FUSED_LOSS: (_D, _R, _D, _R, _R, _D, _R),
}
_OUT_LAYOUTS = {
  Kind.FORWARD: _FORWARD_OUT,
  Kind.SEGMENT_FORWARD: _FORWARD_OUT,
  Kind.FORWARD_BACKWARD_UPDATE: _FBO_OUT,
  Kind.LOSS: _FBO_OUT,
  Kind.SEGMENT_REVERSE_UPDATE: (_R, _R, _D, _D, _D),
  Kind.FUSED_LOSS: (_R, _D, _R, _D, _D),
}
