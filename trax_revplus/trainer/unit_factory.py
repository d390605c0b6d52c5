"""Building a plan's units: their functions, compiled once per computation.

`UnitFactory` makes the units `units.Units` walks, from the step functions
(`step_fns`, over batch slices: `slices`, `loss_slices`), compiled by the
trainer's `compilation.Compiler`.
"""

from trax_revplus.trainer import chains
from trax_revplus.trainer import loss_slices
from trax_revplus.trainer import slices
from trax_revplus.trainer import step_fns
from trax_revplus.trainer import ties as ties_lib
from trax_revplus.trainer.step_fns import Kind
from trax_revplus.trainer.units import LossUnit
from trax_revplus.trainer.units import ReversibleSegment
from trax_revplus.trainer.units import SelectSegment
from trax_revplus.trainer.units import StandardUnit


def is_permutation(layer) -> bool:
  """Whether `layer` is a reversible layer that only permutes its inputs
  (trax's `ReversibleSelect` with each input once: `ReversibleSwap`)."""
  indices = getattr(layer, '_indices', None)
  return (type(layer).__name__ == 'ReversibleSelect' and
          indices is not None and sorted(indices) == list(range(layer.n_in)))



def _variant(n_slices, in_call):
  """What tells compiled functions of equal layers apart: their batch
  slices, and the shared weights they pass between their layers."""
  return (n_slices, in_call) if in_call else n_slices


class UnitFactory:
  """Builds units: their functions (`step_fns`, `slices`), compiled by
  `compile`."""

  def __init__(self, layers, optimizers, compile_fn, n_devices, adasum,
               ties=None):
    """Args:
      layers, optimizers: lists by layer index (forward order).
      compile_fn: `compilation.Compiler.compile`.
      n_devices: int, devices the gradients are averaged over.
      adasum: bool, average them with Adasum.
      ties: `ties.Ties` of the layers (default: none shared).
    """
    self._ties = ties if ties is not None else ties_lib.Ties()
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

  def standard(self, i: int, n_slices: int = 1) -> StandardUnit:
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

  def segment(self, indices: list[int], n_slices: int = 1,
              forward: bool = True) -> ReversibleSegment | SelectSegment:
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
          slices.forward(chains.segment_forward_fn(layers), n_slices, rows),
          (), n_slices)
    in_call = self._ties.in_call(indices)
    fn = slices.segment_reverse(
        layers, [self._optimizers[i] for i in indices], self._n_devices,
        self._adasum, n_slices, rows, in_call)
    # Weights, slots, the outputs and their cotangents are replaced by the
    # results and never read again: the stacks hold the outputs and
    # cotangents alone (a standard layer's saved inputs are popped before
    # this backward runs), and the reconstructed inputs and input
    # cotangents can take their buffers.
    kind = Kind.SEGMENT_REVERSE_UPDATE
    backward_fn = self._compile(kind, indices, fn,
                                self._donated(kind, indices),
                                _variant(n_slices, in_call))
    return ReversibleSegment(indices, layers, forward_fn, backward_fn)

  def loss(self, indices: list[int], n_slices: int = 1,
           chunks: int = 1) -> LossUnit:
    """The `LossUnit` of layers `indices` (the loss layer last); the
    reversible layers before the loss recompute their activations in its
    backward pass (`chains.chain_forward_fn`). `chunks`: the loss layer's
    tail over that many chunks of the sequence (`sequence_chunks`; the
    loss layer alone only, as `plan.StepPlan` holds).

    Raises:
      ValueError: chunks > 1 and the loss layer has no tail to chunk.
    """
    layers = [self._layers[i] for i in indices]
    optimizers = [self._optimizers[i] for i in indices]
    depth = chains.chain_depth(layers)
    variant = n_slices
    if len(indices) == 1:
      kind = Kind.LOSS
      fn = loss_slices.loss_fbo(layers[0], optimizers[0], self._n_devices,
                                self._adasum, n_slices, chunks)
      if chunks > 1:
        variant = (n_slices, 'sequence_chunks', chunks)
    else:
      kind = Kind.FUSED_LOSS
      in_call = self._ties.in_call(indices)
      fn = loss_slices.fused_loss(layers, optimizers, self._n_devices,
                                  self._adasum, n_slices, self._rows(indices),
                                  in_call)
      variant = _variant(n_slices, in_call)
    return LossUnit(indices, depth, self._compile(
        kind, indices, fn, self._donated(kind, indices), variant))
