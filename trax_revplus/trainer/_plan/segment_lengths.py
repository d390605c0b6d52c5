"""How a block's reversible layers are cut into segments.

Forward segments of equal length that fit a byte limit, and how each splits
for the backward pass ('auto': by the bytes of the block's outputs). Kept
apart from `plan` because these rules read layer sizes, not the plan: they
are the one place a segment's length is decided.
"""

from typing import Mapping

from trax_revplus.trainer._plan import options as options_lib

# Smallest outputs (bytes, all devices) of an activation-bound segment: above
# it activations set the peak host memory and long compiled calls run
# fastest; below it the compiler's memory sets the peak (a long backward
# segment raises it) and dispatch sets the speed. Used by
# backward_segment_max_layers='auto'.
ACTIVATION_BOUND_BYTES = 2**20
# backward_segment_max_layers='auto': the length of backward segments of
# segments below ACTIVATION_BOUND_BYTES.
SMALL_BACKWARD_SEGMENT_LAYERS = 2
Segment = tuple[int, ...]  # layer indices, consecutive, in forward order


def backward_segment_length(
  setting: int | str, n_layers: int, outputs_bytes: int
) -> int:
  """Most layers of one backward call of an `n_layers` forward segment.

  Args:
    setting: int >= 1 or 'auto' (`backward_segment_max_layers`).
    n_layers: int, layers of the forward segment.
    outputs_bytes: int, bytes of its outputs on all devices ('auto' only).

  Returns:
    int: `setting`; for 'auto', `n_layers` when the outputs hold at least
    `ACTIVATION_BOUND_BYTES`, else `SMALL_BACKWARD_SEGMENT_LAYERS`.
  """
  if setting != options_lib.AUTO:
    assert isinstance(setting, int)  # else options rejected it
    return setting
  if outputs_bytes >= ACTIVATION_BOUND_BYTES:
    return n_layers
  return SMALL_BACKWARD_SEGMENT_LAYERS


def equal_segments(
  indices: list[int], max_layers: int, nbytes: Mapping[int, int], max_bytes: int
) -> list[list[int]]:
  """Splits consecutive layer indices into equal-length segments.

  The length is the largest one up to `max_layers` for which every
  segment's bytes fit in `max_bytes` (1 always does); the last segment may
  be shorter.

  Args:
    indices: list of int, layer indices in forward order.
    max_layers: int >= 1.
    nbytes: dict index -> int, bytes of the layer's weights + slots.
    max_bytes: int, most bytes of one segment.

  Returns:
    List of segments (lists of indices) covering `indices` in order.
  """
  length = max(1, min(max_layers, len(indices)))
  while length > 1:
    segments = _equal_runs(indices, length)
    if all(sum(nbytes[i] for i in s) <= max_bytes for s in segments):
      return segments
    length -= 1
  return [[i] for i in indices]


def _equal_runs(indices: list[int], length: int) -> list[list[int]]:
  return [indices[k : k + length] for k in range(0, len(indices), length)]


def backward_split(segment: Segment, length: int) -> tuple[Segment, ...]:
  """`segment` split into backward segments of at most `length` layers."""
  if length >= len(segment):
    return (segment,)
  return tuple(tuple(s) for s in _equal_runs(list(segment), length))
