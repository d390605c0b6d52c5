"""The segment plan: which layers each compiled call of a step runs.

A step runs, per block, its standard layer as one call and its reversible
layers as segments: consecutive layers in one call, forward in order and
backward (reverse + backward + update) last to first. The plan is data
(`SegmentPlan`); the rules here choose it from the layers' sizes and the
trainer's settings (`options.TrainerOptions`), and `units` compiles it.
"""

import dataclasses
from typing import Dict, List, Set, Tuple

from trax_revplus.trainer import options as options_lib

# Smallest outputs (bytes, all devices) of an activation-bound segment: above
# it activations set the peak host memory and long compiled calls run
# fastest; below it the compiler's memory sets the peak (a long backward
# segment raises it) and dispatch sets the speed. Used by
# backward_segment_max_layers='auto'.
ACTIVATION_BOUND_BYTES = 2**20
# backward_segment_max_layers='auto': the length of backward segments of
# segments below ACTIVATION_BOUND_BYTES.
SMALL_BACKWARD_SEGMENT_LAYERS = 2

Segment = Tuple[int, ...]  # layer indices, consecutive, in forward order


@dataclasses.dataclass
class SegmentPlan:
  """Which layers each compiled call of a step runs.

  Layer indices count the trainer's layers in forward order (block 0's
  standard layer, its reversible layers, block 1's standard layer, ...,
  the loss layer last).

  Attributes:
    blocks: list over blocks of (index of the standard layer, list of
      reversible segments run forward, in order).
    loss: int, index of the loss layer.
    backward: dict, forward segment -> the segments running it backward, in
      forward order (the segment itself, or shorter ones); a forward
      segment is absent until its split is decided (`decide_backward`).
    backward_max_layers: int or 'auto', the setting that splits forward
      segments for the backward pass.
    keep: set of forward segments whose forward call keeps what their
      backward needs (`store_activations`); each runs backward whole, from
      what it kept, without reversing or recomputing.
  """
  blocks: List[Tuple[int, List[Segment]]]
  loss: int
  backward: Dict[Segment, List[Segment]]
  backward_max_layers: object
  keep: Set[Segment] = dataclasses.field(default_factory=set)

  def forward_segments(self):
    """Every reversible forward segment, in forward order."""
    return [s for _, segments in self.blocks for s in segments]

  def decide_backward(self, segment, outputs_bytes=None):
    """Fixes how `segment` runs backward, unless that is decided already.

    Args:
      segment: a forward segment of this plan.
      outputs_bytes: int, bytes of its outputs on all devices (needed for
        backward_max_layers='auto').

    Returns:
      The backward segments of `segment`.
    """
    if segment in self.keep:
      self.backward[segment] = [segment]
    if segment not in self.backward:
      length = backward_segment_length(self.backward_max_layers, len(segment),
                                       outputs_bytes)
      self.backward[segment] = (
          [segment] if length >= len(segment) else
          [tuple(s) for s in _equal_runs(list(segment), length)])
    return self.backward[segment]


def backward_segment_length(setting, n_layers, outputs_bytes):
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
    return setting
  if outputs_bytes >= ACTIVATION_BOUND_BYTES:
    return n_layers
  return SMALL_BACKWARD_SEGMENT_LAYERS


def equal_segments(indices, max_layers, nbytes, max_bytes):
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


def _equal_runs(indices, length):
  return [indices[k:k + length] for k in range(0, len(indices), length)]


def plan_segments(block_sizes, nbytes, options):
  """The segment plan of a trainer's blocks.

  Args:
    block_sizes: list over blocks of the number of reversible layers of the
      block (each block also has one standard layer before them).
    nbytes: dict layer index -> int, bytes of its weights + slots.
    options: `options.TrainerOptions` (segment_max_layers,
      segment_max_bytes, backward_segment_max_layers).

  Returns:
    `SegmentPlan`; with an int backward_segment_max_layers, every backward
    split decided.
  """
  blocks = []
  k = 0
  for n_reversible in block_sizes:
    indices = list(range(k + 1, k + 1 + n_reversible))
    segments = equal_segments(indices, options.segment_max_layers, nbytes,
                              options.segment_max_bytes)
    blocks.append((k, [tuple(s) for s in segments]))
    k += 1 + n_reversible
  plan = SegmentPlan(blocks=blocks, loss=k, backward={},
                     backward_max_layers=options.backward_segment_max_layers)
  if options.store_activations == 'always':
    plan.keep = set(plan.forward_segments())
  if plan.backward_max_layers != options_lib.AUTO:
    for segment in plan.forward_segments():
      plan.decide_backward(segment)
  return plan
