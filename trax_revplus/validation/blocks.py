"""Checks of the trainer's blocks, loss layer and positional encodings.

Abstract: nothing is traced or run. trax is imported inside the checks (it
takes seconds of CPU), so that the CLI can import the error types at once.
"""

import math
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from trax_revplus import trax_import
from trax_revplus.trax_door import layers as layer_door
from trax_revplus.validation import errors

if TYPE_CHECKING:  # Annotations only: trax is imported inside the checks.
  from trax import layers as tl
  from trax import shapes

  from trax_revplus.typing import Blocks


def layer_name(layer: 'tl.Layer') -> str:
  return getattr(layer, 'name', type(layer).__name__)


def standard_layer_list(std_layers: object) -> list[Any] | None:
  """A block's standard part as a flat list of layers.

  As trax's `ReversibleSerialTrainer` runs it, `tl.Serial(std_layers)`: a
  single layer (e.g. a `tl.Serial`) or a list or tuple of layers, nested
  lists flattened.

  Args:
    std_layers: a `tl.Layer`, or a (nested) list or tuple of them.

  Returns:
    list of the layers in order, or None when `std_layers` is neither a
    layer nor a list or tuple (its items are not checked here).
  """
  base = trax_import.module('trax.layers.base')
  if isinstance(std_layers, base.Layer):
    return [std_layers]
  if not isinstance(std_layers, (list, tuple)):
    return None
  return _flattened(std_layers)


def _flattened(items: Sequence[object]) -> list[object]:
  flat: list[object] = []
  for x in items:
    if isinstance(x, (list, tuple)):
      flat.extend(_flattened(x))
    else:
      flat.append(x)
  return flat


def check_blocks(blocks: object) -> None:
  """Checks that `blocks` is a list of (standard, reversible) layer pairs.

  The shape `trax.optimizers.trainer.extract_reversible_blocks` returns and
  `ReversibleSerialTrainer` / `init_reversible_blocks` take; like trax's
  trainer, which runs a block's standard part as `tl.Serial(standard)`, the
  standard part may also be a single layer (e.g. a `tl.Serial`) or hold
  nested lists of layers.

  Args:
    blocks: Sequence of pairs `(standard_layers, reversible_layers)`:
      `standard_layers` a `tl.Layer` or a (nested) list or tuple of them;
      `reversible_layers` a list (or tuple) of `tl.ReversibleLayer`.

  Raises:
    BlockStructureError: naming the block (and layer) index that is not a
      pair, not a layer or list of layers, or not reversible in a
      reversible list.
  """
  # Imported here: trax takes seconds of CPU to import, and the CLI imports
  # this module for its error types before it needs trax.
  base = trax_import.module('trax.layers.base')
  reversible = trax_import.module('trax.layers.reversible')
  fix = (
    'build them with trax.optimizers.trainer.extract_reversible_blocks'
    '([model, loss_layer]), which returns [(standard_layers, '
    'reversible_layers), ...] and the loss layer'
  )
  if isinstance(blocks, (str, bytes)) or not isinstance(blocks, (list, tuple)):
    raise errors.BlockStructureError(
      f'blocks must be a list of (standard_layers, reversible_layers) '
      f'pairs, got {type(blocks).__name__}; {fix}.'
    )

  for b, block in enumerate(blocks):
    if not isinstance(block, (list, tuple)) or len(block) != 2:
      what = (
        f'a {type(block).__name__} of length {len(block)}'
        if isinstance(block, (list, tuple))
        else f'a {type(block).__name__}'
      )
      raise errors.BlockStructureError(
        f'block {b} is {what}, not a (standard_layers, reversible_layers) '
        f'pair; {fix}.'
      )
    std_layers, rev_layers = block
    standard = standard_layer_list(std_layers)
    if standard is None:
      raise errors.BlockStructureError(
        f'block {b}: the standard layers must be a layer or a list of '
        f'layers, got {type(std_layers).__name__}; {fix}.'
      )
    if not isinstance(rev_layers, (list, tuple)):
      raise errors.BlockStructureError(
        f'block {b}: the reversible layers must be a list of layers, got '
        f'{type(rev_layers).__name__}; wrap a single layer in a list, '
        f'e.g. ([], [layer]).'
      )
    for part, layers in (('standard', standard), ('reversible', rev_layers)):
      for k, layer in enumerate(layers):
        if not isinstance(layer, base.Layer):
          raise errors.BlockStructureError(
            f'block {b}: {part} layer {k} is a {type(layer).__name__}, not '
            f'a trax Layer; {fix}.'
          )
    for k, layer in enumerate(rev_layers):
      if not isinstance(layer, reversible.ReversibleLayer):
        raise errors.BlockStructureError(
          f'block {b}: reversible layer {k} ({layer_name(layer)}, '
          f'{type(layer).__name__}) is not a tl.ReversibleLayer, so its '
          f'inputs cannot be recomputed on the way back; move it to the '
          f'standard layers of the next block, or make it reversible '
          f'(e.g. wrap a residual branch in tl.ReversibleHalfResidual).'
        )


def _walk(layer: 'tl.Layer') -> Iterator['tl.Layer']:
  yield layer
  for sublayer in getattr(layer, 'sublayers', ()) or ():
    yield from _walk(sublayer)


def check_sequence_length(
  blocks: 'Blocks',
  input_signature: 'shapes.ShapeDtype | Sequence[shapes.ShapeDtype]',
) -> None:
  """Checks the batch's sequence length against positional encodings.

  Looks for trax's `PositionalEncoding` (sequences up to `max_len`) and
  `AxialPositionalEncoding` (sequences of exactly the product of its
  `shape`) anywhere in the blocks, and compares them with the length of
  the first input, axis 1 (the token axis of (B, L) inputs, which LMs such as
  `trax.models.ReformerLM` and `TransformerLM` embed and then encode).
  Inputs of rank < 2 are not checked. Abstract: nothing is traced or run.

  Args:
    blocks: list of (standard layers, reversible layers) pairs.
    input_signature: `ShapeDtype` or tuple of them, the batch's.

  Raises:
    SequenceLengthError: naming the layer, its limit and the length seen.
  """
  attention = trax_import.module('trax.layers.attention')
  position_encodings = trax_import.module(
    'trax.layers.research.position_encodings'
  )
  first = (
    input_signature[0]
    if isinstance(input_signature, (list, tuple))
    else input_signature
  )
  shape = tuple(getattr(first, 'shape', ()))
  if len(shape) < 2:
    return
  length = shape[1]
  for b, (std_layers, rev_layers) in enumerate(blocks):
    for top in list(std_layers) + list(rev_layers):
      for layer in _walk(top):
        if isinstance(layer, attention.PositionalEncoding):
          max_len = layer_door.positional_max_len(layer)
          if max_len is not None and length > max_len:
            raise errors.SequenceLengthError(
              f'sequence length {length} (axis 1 of input shape {shape}) '
              f'exceeds max_len={max_len} of {layer_name(layer)} in block '
              f"{b}; set the model's max_len >= {length} (e.g. gin "
              f'ReformerLM.max_len = {length}) or shorten the sequences.'
            )
        elif isinstance(layer, position_encodings.AxialPositionalEncoding):
          axial = layer_door.axial_shape(layer)
          if axial and length != math.prod(axial):
            raise errors.SequenceLengthError(
              f'sequence length {length} (axis 1 of input shape {shape}) '
              f'differs from {math.prod(axial)}, the product of the axial '
              f'shape {axial} of {layer_name(layer)} in block {b}; make '
              f'the axial shape multiply to {length} (e.g. '
              f'ReformerLM.axial_pos_shape) or pad sequences to '
              f'{math.prod(axial)}.'
            )


def check_loss_output(
  loss_layer: 'tl.Layer',
  input_signature: 'shapes.ShapeDtype | Sequence[shapes.ShapeDtype]',
) -> None:
  """Checks that `loss_layer` outputs one scalar for `input_signature`.

  Abstract (`Layer.output_signature`): no computation runs. The layer must
  be initialized or hold no weights.

  Args:
    loss_layer: the trainer's final layer.
    input_signature: `ShapeDtype` or tuple of them reaching the loss layer.

  Raises:
    LossLayerError: if it has more than one output or a non-scalar output.
  """
  if loss_layer.n_out != 1:
    raise errors.LossLayerError(
      f'loss layer {layer_name(loss_layer)} has {loss_layer.n_out} '
      f'outputs; it must output one scalar loss (e.g. end it with '
      f'tl.CrossEntropyLoss() or tl.WeightedCategoryCrossEntropy()).'
    )
  out = loss_layer.output_signature(input_signature)
  shape = tuple(getattr(out, 'shape', ()))
  if shape:
    raise errors.LossLayerError(
      f'loss layer {layer_name(loss_layer)} outputs shape {shape}, not a '
      f'scalar; the trainer differentiates one number per step: average '
      f'over the batch (e.g. tl.CrossEntropyLoss() or '
      f'tl.WeightedCategoryCrossEntropy() rather than tl.CrossEntropy()).'
    )
