"""The step plan: which calls a step makes, over what, and what they hold.

A step runs, per block, its standard layer as one call and its reversible
layers as segments: consecutive layers in one call, forward in order and
backward (reverse + backward + update) last to first; then the loss layer's
forward, backward and update. A `StepPlan` fixes every choice that changes a
step's speed or device memory but never its result:

  segments        which reversible layers share a forward call, and how
                  each forward segment splits for the backward pass;
  batch_slices    each call runs over k slices of each device's rows, one
                  after the other (per-call temporaries shrink about k-fold);
  fused_from      layers from this index on run forward, loss and backward
                  in the loss's one program, as trax's default `Trainer`
                  runs the whole model (reversible layers recompute their
                  activations through their reverse inside it);
  n_async_layers  how long an update stays on the device before its copy
                  back to the host is committed;
  prefetch        whether the next call's weights are placed during the
                  current call;
  saved_on_host   where what a unit's forward keeps for its backward (a
                  standard layer's inputs and new state, a reversible
                  layer's old and new state) waits: on the device, or on
                  the host as stock trax's `one_step` keeps it (`tl.on_cpu`),
                  placed back just before the unit's backward;
  sequence_chunks the loss layer's position-wise tail (its last layers and
                  the loss) runs over k chunks of the sequence, one after
                  the other (`sequence_chunks`);
  micro_batches   the step's forward and backward run over m parts of each
                  device's rows, one after the other, accumulating weight
                  gradients, and update once (`micro_batches`);
  grads_on_host   where those accumulated gradients wait between parts: on
                  the device, or on the host;
  parallel_heads  how many (example, head) pairs trax's efficient attention
                  layers compute at once (`attention_heads`);
  params_on_device whether every layer's weights and slots stay on the
                  device across steps (as trax's default `Trainer` keeps
                  them), or go to the host after each update and come back
                  for each call (as stock's memory-efficient trainer).

A plan is data, made before a step and never changed by it; `units` compiles
it and `planner` chooses it. The rules here build one from the trainer's
settings (`options.TrainerOptions`).
"""

import dataclasses
from typing import Any, Mapping, Sequence

from trax_revplus.trainer._plan import dimensions
from trax_revplus.trainer._plan import options as options_lib
from trax_revplus.trainer._plan import segment_lengths
from trax_revplus.trainer._plan.segment_lengths import Segment

# `StepPlan.fused_from`'s default, resolved to the plan's `loss` (no layer
# fused) when the plan is made: a stored plan always holds the index.
UNFUSED = -1

# `StepPlan`'s first fields, its layout: the rest are settings.
_LAYOUT = ('blocks', 'loss', 'backward')


# (example, head) pairs at once per kind of trax efficient attention layer:
# (the layer's class name, n) pairs sorted by name; a kind not named
# computes its pairs as configured. A plan sets one where kinds differ in
# which number runs fastest (e.g. on a TPU, `SelfAttention` one example's
# heads at once, `LSHSelfAttention` one pair at a time).
PairsByKind = tuple[tuple[str, int], ...]
# A plan's `parallel_heads`: n for every layer, None (as configured) or
# by kind.
PairsAtOnce = int | PairsByKind | None


def pairs_words(n: PairsAtOnce) -> str:
  """A plan's `parallel_heads` in words, e.g. '2 (example, head) pairs at
  a time' or 'SelfAttention 8 pairs at a time'."""
  if n is None:
    return 'as configured'
  if isinstance(n, tuple):
    return ', '.join(
      f'{kind} {k} pair{"s" * (k != 1)} at a time' for kind, k in n
    )
  return f'{n} (example, head) pair{"s" * (n != 1)} at a time'


@dimensions.declare
@dataclasses.dataclass(frozen=True)
class StepPlan:
  """How a step runs: its calls and what each holds (never its results).

  Layer indices count the trainer's layers in forward order (block 0's
  standard layer, its reversible layers, block 1's standard layer, ...,
  the loss layer last).

  Attributes:
    blocks: tuple over blocks of (index of the standard layer, tuple of
      reversible segments run forward, in order).
    loss: int, index of the loss layer.
    backward: mapping, forward segment -> tuple of the segments running it
      backward, in forward order (the segment itself, or shorter ones).
    batch_slices: int k >= 1; every call runs over k equal slices of each
      device's rows of the batch, summing the slices' weight gradients
      before its one optimizer update.
    fused_from: int, the first layer whose forward and backward run inside
      the loss layer's program (`loss`: none). It is a unit boundary: a
      block's standard layer or the first layer of a forward segment.
      Given as `UNFUSED` (the default) or None, it is set to `loss`.
    n_async_layers: int >= 0, the copy-back depth (the rule: `commit`; the
      setting: `options.TrainerOptions.n_async_layers`).
    prefetch: bool, place the next call's weights (and slots) during the
      current call, so the copy overlaps compute; False places them just
      before their call, holding one call's parameters at a time.
    saved_on_host: bool, what each unit's forward keeps for its backward
      (`step_run.StepRun.saved`) waits on the host from right after that forward
      until just before that unit's backward, where it is placed back;
      False keeps it on the device. It costs one copy each way per unit
      and a wait for each forward call, and holds none of it on the device
      in between.
    sequence_chunks: int k >= 1; the loss layer's own program (`fused_from`
      equal to `loss` where k > 1) runs its position-wise tail over k equal
      chunks of the sequence (`sequence_chunks`): its temporaries (the
      logits and their cotangents) shrink about k-fold.
    micro_batches: int m >= 1; the step walks its units over m equal parts
      of each device's rows (`fused_from` equal to `loss` where m > 1),
      accumulating each layer's weight gradients and updating once, in
      the last part (`micro_batches`): the stack and cotangent stack held
      across the step are one part's, and every layer's weights go to the
      device m times.
    grads_on_host: bool (micro_batches > 1 only), the accumulated
      gradients wait on the host between parts: each accumulating call's
      gradients are copied back with its updates and added there, and the
      last part's call takes their sum, placed with its slots; False keeps
      them on the device from a layer's first backward call to its update
      (one copy of every layer's weights held across the step).
    parallel_heads: int n >= 1, None or a `PairsByKind`; in every call,
      trax's efficient attention layers compute n of their (example, head)
      pairs at once (all of the call's where it has fewer), one group after
      another (`attention_heads`: their `n_parallel_heads`, set to n, lower
      or higher than configured); None: as the model configures them; a
      `PairsByKind`: each kind of layer it names (by class) at its own
      number, the others as configured. A call's attention temporaries
      shrink with fewer, an accelerator's matrix units fill with more; the
      results are the same up to float32 summation order.
    params_on_device: bool, every layer's weights and slots stay on the
      device across steps: each call takes them where they are and its
      update replaces them there, nothing copied either way (the host gets
      a copy only where it reads them: a checkpoint); the step holds all
      of them on the device across every call. False: they live on the
      host between uses, each call's are placed for it and its updates
      copied back (`commit`). Layer state goes to the host either way.
      Not where layers share weights, under `on_non_finite='skip'`, or in
      a multi-process run (`options.params_on_device_refusal`).
  """

  blocks: tuple[tuple[int, tuple[Segment, ...]], ...]
  loss: int
  backward: Mapping[Segment, tuple[Segment, ...]]
  # The plan's dimensions (`dimensions.field`): each field's default is
  # the value that changes nothing, its metadata its entry.
  batch_slices: int = dimensions.field(
    1,
    check=dimensions.check_slices,
    replaced='the plans with the slicing set do not fit',
    reordering=lambda k: f'{k} batch slices',
  )
  fused_from: int = UNFUSED
  n_async_layers: int = 8
  prefetch: bool = True
  saved_on_host: bool = False
  sequence_chunks: int = dimensions.field(
    1,
    check=dimensions.check_chunks,
    reordering=lambda k: f'{k} sequence chunks',
  )
  micro_batches: int = dimensions.field(
    1,
    check=dimensions.check_parts,
    reordering=lambda m: f'{m} micro-batches',
  )
  grads_on_host: bool = False
  parallel_heads: PairsAtOnce = dimensions.field(
    None,
    check=dimensions.check_heads,
    reordering=lambda n: f'attention {pairs_words(n)}',
  )
  params_on_device: bool = False

  def __post_init__(self) -> None:
    # None too: the default before `UNFUSED`, still accepted.
    if self.fused_from is None or self.fused_from == UNFUSED:
      object.__setattr__(self, 'fused_from', self.loss)
    if self.sequence_chunks > 1 and self.fused_from != self.loss:
      raise ValueError(
        "sequence chunks run the loss layer's own program; "
        'no layer may be fused into it.'
      )
    if self.micro_batches > 1 and self.fused_from != self.loss:
      raise ValueError(
        'micro-batches accumulate per-layer calls; no layer '
        'may be fused into the loss program.'
      )
    if self.grads_on_host and self.micro_batches == 1:
      raise ValueError(
        'gradients are accumulated on the host only over micro-batches.'
      )
    missing = [s for s in self.forward_segments() if s not in self.backward]
    if missing:
      raise ValueError(f'backward split of segments {missing} not decided.')

  def __hash__(self):
    # `backward` is a mapping: hashed by its items, so that equal plans key
    # one dict entry (`weighed_plans.Weighing`'s accounted plans).
    return hash(
      tuple(
        frozenset(value.items()) if isinstance(value, Mapping) else value
        for value in (getattr(self, f.name) for f in dataclasses.fields(self))
      )
    )

  def forward_segments(self) -> list[Segment]:
    """Every reversible forward segment, in forward order."""
    return [s for _, segments in self.blocks for s in segments]

  def unit_spans(self) -> list[Segment]:
    """The layers of every forward unit in forward order: each standard
    layer alone, each forward segment (fused ones included)."""
    out: list[Segment] = []
    for std, segments in self.blocks:
      out.append((std,))
      out.extend(segments)
    return out

  def unit_starts(self) -> list[int]:
    """First layer of each forward unit, then the loss: the values
    `fused_from` can take."""
    return [u[0] for u in self.unit_spans()] + [self.loss]

  @property
  def n_calls(self) -> int:
    """Calls per step as the plan lays them out, for the speed model's
    rank: forward units and backward units outside the loss program, and
    the loss program (each micro-batch's). A unit that only reorders the
    stack (`unit_kinds.SelectSegment`) runs without a compiled call, so a step
    makes fewer; the calls it makes are its accounting's
    (`device_memory.StepMemory.calls`)."""
    n = 1
    for unit in self.unit_spans():
      if unit[0] >= self.fused_from:
        continue
      n += 1 + (len(self.backward[unit]) if unit in self.backward else 1)
    return n * self.micro_batches

  @property
  def n_backward_calls(self) -> int:
    """Backward calls of reversible segments outside the loss program."""
    return sum(
      len(self.backward[s])
      for s in self.forward_segments()
      if s[0] < self.fused_from
    )

  def settings(self) -> dict[str, object]:
    """The plan as the trainer's settings would name it (for logs and
    `estimate`)."""
    forward = [len(s) for s in self.forward_segments()]
    backward = [
      len(b) for s in self.forward_segments() for b in self.backward[s]
    ]
    out: dict[str, object] = {
      'segment_max_layers': max(forward, default=0),
      'backward_segment_max_layers': max(backward, default=0),
    }
    # Every setting field (the plan's dimensions among them) in field
    # order; `fused_from` as the layers it fuses.
    for f in dataclasses.fields(self)[len(_LAYOUT) :]:
      if f.name == 'fused_from':
        out['fused_layers'] = self.loss - self.fused_from
      else:
        out[f.name] = getattr(self, f.name)
    return out

  def describe(self, n_calls: int | None = None) -> str:
    """One line, e.g. 'segment_max_layers=8, backward_segment_max_layers=2,
    batch_slices=1, fused_layers=0, n_async_layers=8, prefetch=True,
    saved_on_host=False, sequence_chunks=1, micro_batches=1,
    grads_on_host=False, parallel_heads=None, 9 calls per step'.

    Args:
      n_calls: the compiled calls a step makes, where its accounting
        counted them (`device_memory.StepMemory.calls`); else the plan's
        own layout (`n_calls`).
    """
    settings = ', '.join(f'{k}={v}' for k, v in self.settings().items())
    n_calls = self.n_calls if n_calls is None else n_calls
    calls = 'call' if n_calls == 1 else 'calls'
    return f'{settings}, {n_calls} {calls} per step'


def make_plan(
  block_sizes: Sequence[int],
  nbytes: Mapping[int, int],
  stack_bytes: Sequence[int],
  *,
  segment_max_layers: int,
  segment_max_bytes: int,
  backward_segment_max_layers: int | str,
  fused_from: int = UNFUSED,
  n_async_layers: int = 8,
  prefetch: bool = True,
  saved_on_host: bool = False,
  grads_on_host: bool = False,
  params_on_device: bool = False,
  **dimension_values: Any,
) -> StepPlan:
  """The plan of a trainer's blocks for given settings.

  Args:
    block_sizes: list over blocks of the number of reversible layers of the
      block (each block also has one standard layer before them).
    nbytes: dict layer index -> int, bytes of its weights + slots.
    stack_bytes: list over blocks of the bytes (all devices) of the stack
      items the block's reversible layers read and write (their outputs);
      read by backward_segment_max_layers='auto' only.
    segment_max_layers, segment_max_bytes, backward_segment_max_layers,
      n_async_layers: as `options.TrainerOptions`.
    fused_from: int or `UNFUSED` (nothing fused), see
      `StepPlan.fused_from`.
    prefetch, saved_on_host, grads_on_host, params_on_device: see
      `StepPlan`.
    **dimension_values: the plan's dimensions by name
      (`dimensions.DIMENSIONS`), each as its `StepPlan` field; one not
      given is its field's default.

  Returns:
    `StepPlan`, every backward split decided.

  Raises:
    TypeError: a keyword that is no field of `StepPlan`.
  """
  blocks, backward = [], {}
  k = 0
  for n_reversible, outputs_bytes in zip(block_sizes, stack_bytes):
    indices = list(range(k + 1, k + 1 + n_reversible))
    segments = tuple(
      tuple(s)
      for s in segment_lengths.equal_segments(
        indices, segment_max_layers, nbytes, segment_max_bytes
      )
    )
    for segment in segments:
      length = segment_lengths.backward_segment_length(
        backward_segment_max_layers, len(segment), outputs_bytes
      )
      backward[segment] = segment_lengths.backward_split(segment, length)
    blocks.append((k, segments))
    k += 1 + n_reversible
  return StepPlan(
    blocks=tuple(blocks),
    loss=k,
    backward=backward,
    fused_from=fused_from,
    n_async_layers=n_async_layers,
    prefetch=prefetch,
    saved_on_host=saved_on_host,
    grads_on_host=grads_on_host,
    params_on_device=params_on_device,
    **dimension_values,
  )


def configured_plan(
  block_sizes: Sequence[int],
  nbytes: Mapping[int, int],
  stack_bytes: Sequence[int],
  options: options_lib.TrainerOptions,
) -> StepPlan:
  """The plan the trainer's settings name, without a device budget: no
  layer fused into the loss program; weights and slots on the device only
  where the setting pins them there."""
  return make_plan(
    block_sizes,
    nbytes,
    stack_bytes,
    segment_max_layers=options.unplanned('segment_max_layers'),
    segment_max_bytes=options.segment_max_bytes,
    backward_segment_max_layers=options.backward_segment_max_layers,
    n_async_layers=options.n_async_layers,
    params_on_device=options.params_on_device is True,
    **dimensions.unplanned(options),
  )
