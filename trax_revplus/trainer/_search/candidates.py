"""The plans a device budget chooses from, fastest first.

Every dimension of `plan.StepPlan` that costs device memory is varied:

  fused layers      every layer runs in the loss's one program, as trax's
                    default `Trainer` runs the whole model (reversible
                    layers recompute their activations through their
                    reverse inside it), or none;
  batch slices      every divisor k of each device's rows;
  segment lengths   forward and backward segments of 1, 2, 4 or 8 layers
                    (a backward length at most the forward one);
  n_async_layers    the setting's value, then 4, 2, 1 and 0 below it;
  prefetch          on, then off;
  saved_on_host     what each unit's forward keeps for its backward waits
                    on the device, then on the host as stock trax keeps it
                    (unfused plans; the fused program keeps none);
  sequence chunks   the loss layer's tail over 2, 4, ... 64 chunks of the
                    sequence (those dividing it; unfused plans, where the
                    loss layer has a position-wise tail: `loss_tail`),
                    only after every plan without (they lower only the
                    loss call's peak), fewest chunks first, then fewest
                    slices;
  micro-batches     the step over 2, 4, ... parts of each device's rows
                    (divisors of them, where the step can add its parts'
                    gradients exactly: `batch_parts.refusal`; unfused
                    plans, each part's calls over the fewest batch slices
                    that divide its rows), only after every plan without,
                    fewest parts first, then fewest chunks;
  grads_on_host     in micro-batches, the accumulated gradients wait on
                    the device, then on the host;
  attention heads   trax's efficient attention layers as configured, one
                    (example, head) pair at a time (where some layer
                    computes more at once), and on the backends where the
                    speed model ranks them first, all of a call's pairs at
                    once (where some layer computes fewer:
                    `attention_heads`; the same results up to float32
                    summation order): every group above again for each,
                    in `speed_rank.ranked_heads`' order (one pair at a
                    time after all the others, so a budget takes it only
                    where nothing else fits, but on the backends where it
                    ranks first);
  params_on_device  each plan with every layer's weights and slots kept on
                    the device across steps, just before the same plan with
                    them on the host, on the backends where the speed model
                    ranks it first (`speed_rank.ranked_params_on_device`);
                    the group's leanest plan keeps them on the host;
  other dimensions  the setting's value ('auto': its value without a budget).

The speed model (`speed_rank`) orders the plans without timing them: the
fused program where it compiles cheaply, fewer batch slices, fewer calls,
a deeper copy-back, prefetching; saved inputs and states on the device.

A setting the user gave as an int pins its dimension (`options.AUTO`
leaves it to the budget): the batch slices' keeps only that slicing,
`segment_max_layers` only segments of that length (never the fused
program), `backward_segment_max_layers` only backward calls of that length.
Where layers share weights (`ties.Ties`), the fused program runs unsliced
only: trax updates the later holder before the earlier one's backward.

Plans in micro-batches come after those in sequence chunks, fewest parts
first: they shrink what the step holds across its calls, and cost every
layer's weights a trip to the device per part. In such a group, plans that
keep the accumulated gradients on the device come before those whose
gradients wait on the host (copied out, added there, their sum placed
with the last part's slots).

Plans are grouped by (1), (2), their chunks and parts: the members of a
group share their slicing, and the group's leanest member (one layer per
call, no copy-back depth, no prefetch, saved inputs and states on the host,
accumulated gradients on the host; or its one fused program) needs the
least memory of the group, so a group whose leanest member does not fit is
skipped whole.

The leanest unfused plan of one slice runs stock trax's own schedule
(`device_memory.stock_trainer`): one layer per call, each call's weights
placed for it, saved inputs and states on the host; and no update waits on
the device to be copied back, where stock's wait one layer. More slices
and the fused program can only lower the least of all plans
(`planner.Planner.least_plan`) below it.
"""

import dataclasses
from typing import Any, Hashable, Iterator, Mapping, Sequence

from trax_revplus.trainer._plan import dimensions
from trax_revplus.trainer._plan import options as options_lib
from trax_revplus.trainer._plan import plan as plan_lib
from trax_revplus.trainer._search import speed_rank
from trax_revplus.trainer._search.families import Group
from trax_revplus.trainer._step import attention_heads
from trax_revplus.trainer._step import loss_tail

# The plan's dimensions the candidates vary (`dimensions`); every other
# runs its setting's value without a budget.
_VARIED = ('batch_slices', 'micro_batches', 'sequence_chunks', 'parallel_heads')
SEGMENT_LENGTHS = (1, 2, 4, 8)
ASYNC_DEPTHS = (4, 2, 1, 0)


class Candidates:
  """The candidate plans of one trainer on one batch's shapes."""

  def __init__(
    self,
    block_sizes: Sequence[int],
    nbytes: Mapping[int, int],
    stack_bytes: Sequence[int],
    rows: int,
    options: options_lib.TrainerOptions,
    shared_weights: bool = False,
    layer_kinds: Sequence[Hashable] | None = None,
    sequence_length: int | None = None,
    micro_batches_refused: bool = False,
    slices_change_draws: bool = True,
    platform: str | None = None,
    attention: Sequence[tuple[str, int, int | None]] = (),
    hashes_activations: bool = True,
    params_on_device: Sequence[bool] = (False,),
  ) -> None:
    """Args:
    block_sizes: list over blocks of their numbers of reversible layers.
    nbytes: dict layer index -> bytes of its weights + slots.
    stack_bytes: list over blocks of the bytes (all devices) of the stack
      items its reversible layers read.
    rows: int, rows of the batch each device gets.
    options: `options.TrainerOptions` (segment_max_bytes,
      n_async_layers).
    shared_weights: bool, whether layers share weights (`ties.Ties`):
      then the fused program runs unsliced only
      (`loss_slices.fused_loss`).
    layer_kinds: list by layer index of hashables, equal where two layers
      compute the same thing (they share a compilation,
      `compilation.Compiler.fingerprint_of`); None: every layer its own.
    sequence_length: int, the sequence the loss layer's tail would run
      in chunks (`loss_tail.tail_length`), or None where it has no
      such tail.
    micro_batches_refused: bool, the step cannot run in micro-batches
      (`batch_parts.refusal`).
    slices_change_draws: bool, whether batch slices change a random
      draw of some layer (`row_draws`; `stack_bytes.StackTrace`); where
      not, `speed_rank.SPEED_SLICES[platform]` slices rank first.
    platform: str, the devices' backend ('cpu', 'gpu', 'tpu'), or None.
    attention: list of (kind, heads, configured `n_parallel_heads` or
      None) of trax's efficient attention layers
      (`attention_heads.layer_kinds`): the numbers of (example, head)
      pairs at once the plans may set.
    hashes_activations: bool, whether some layer hashes its activations
      (`hashing`): then `speed_rank.SPEED_SLICES` does not reorder the
      plans, nor does one pair at a time rank first
      (`speed_rank.ranked_heads`).
    params_on_device: where the plans keep the weights and slots between
      steps, in the speed model's order
      (`speed_rank.ranked_params_on_device`); each plan is listed once per
      value, the last being the leaner.
    """
    self._shared_weights = shared_weights
    self._scan = speed_rank.scans_equal_blocks(platform)
    self._params_on_device = tuple(params_on_device)
    self._kinds = layer_kinds
    self._sizes = list(block_sizes)
    self._nbytes = nbytes
    self._stack_bytes = list(stack_bytes)
    self._options = options
    pinned = options.pinned('batch_slices')
    if pinned is None:
      self.slices = speed_rank.ranked_slices(
        [k for k in range(1, rows + 1) if rows % k == 0],
        platform,
        slices_change_draws,
        hashes_activations,
      )
    else:
      self.slices = [pinned]
    pinned = options.pinned('sequence_chunks')
    if pinned is None:
      self.chunks = loss_tail.chunk_counts(sequence_length)
    else:
      self.chunks = [pinned] if pinned > 1 else []
    # Whether plans without chunks are candidates (not where an int > 1 is
    # pinned).
    self._unchunked = pinned is None or pinned == 1
    pinned = options.pinned('micro_batches')
    if micro_batches_refused:
      self.parts = []
    elif pinned is None:
      self.parts = [m for m in range(2, rows + 1) if rows % m == 0]
    else:
      self.parts = [pinned] if pinned > 1 else []
    self._rows = rows
    # Whether plans in one pass are candidates.
    self._one_pass = pinned is None or pinned == 1
    self._heads = options.pinned('parallel_heads')
    self._attention = [(heads, own) for _, heads, own in attention]
    if self._heads is None:
      most = attention_heads.all_pairs(self._attention, rows)
      self.heads = speed_rank.ranked_heads(
        platform,
        hashes_activations,
        fewest=1 if attention_heads.changes(self._attention, 1, rows) else None,
        most=(
          most if attention_heads.changes(self._attention, most, rows) else None
        ),
        by_kind=speed_rank.heads_by_kind(platform, attention, rows),
      )
    else:
      self.heads = [self._heads]
      if options.pinned('batch_slices') is None:
        self.slices = [k for k in self.slices if self._runs(rows // k)]
    self.parts = [m for m in self.parts if self._part_slices(rows // m)]
    self._fixed = dimensions.unplanned(options, excluded=_VARIED)

  @property
  def configured_heads(self) -> int | None:
    """The plans' `parallel_heads` as a step without a budget runs it:
    the pinned number, or None (the layers as configured)."""
    return self._heads

  def _runs(self, call_rows: int) -> bool:
    """Whether the pinned pairs at once (if any) run in a call of
    `call_rows` rows (`attention_heads.runs_at`)."""
    return self._heads is None or attention_heads.runs_at(
      self._attention, self._heads, call_rows
    )

  def _part_slices(self, part_rows: int) -> int | None:
    """Batch slices each part's calls run over: the fewest of `slices`
    dividing the part's rows (and running the pinned pairs at once in
    each call's rows; None where none does)."""
    return min(
      (
        k
        for k in self.slices
        if part_rows % k == 0 and self._runs(part_rows // k)
      ),
      default=None,
    )

  def _make(self, **settings: Any) -> plan_lib.StepPlan:
    """`make_plan` of `settings` and `_fixed` (`parallel_heads` as
    pinned unless given, the other varied dimensions at their `none`)."""
    settings.setdefault('segment_max_bytes', self._options.segment_max_bytes)
    settings.setdefault('parallel_heads', self._heads)
    return plan_lib.make_plan(
      self._sizes,
      self._nbytes,
      self._stack_bytes,
      **settings,
      **self._fixed,
    )

  def _twins(self, plans: Sequence[plan_lib.StepPlan]) -> tuple:
    """Each of `plans` once per place of the weights and slots between
    steps (`params_on_device`), in its order, each plan's twins together."""
    return tuple(
      dataclasses.replace(p, params_on_device=on_device)
      for p in plans
      for on_device in self._params_on_device
    )

  def _leaner(self, plan: plan_lib.StepPlan) -> plan_lib.StepPlan:
    """`plan` with its weights and slots where they hold the least device
    memory of the places tried."""
    return dataclasses.replace(
      plan, params_on_device=self._params_on_device[-1]
    )

  def _fused(self, k):
    plan = self._make(
      batch_slices=k,
      segment_max_layers=max(self._sizes + [1]),
      backward_segment_max_layers=max(self._sizes + [1]),
      fused_from=0,
      n_async_layers=self._options.n_async_layers,
    )
    return Group(self._twins([plan]), self._leaner(plan), sum(self._sizes))

  def _usable(self, name):
    """Lengths to try for segment setting `name`: the pinned one, or
    `SEGMENT_LENGTHS`, capped at the longest block."""
    longest = max(max(self._sizes, default=0), 1)
    pinned = self._options.pinned(name)
    lengths = SEGMENT_LENGTHS if pinned is None else (pinned,)
    return sorted({min(n, longest) for n in lengths})

  def _lengths(self):
    """(forward, backward) segment lengths, fewest calls first."""
    pairs = []
    backward = self._usable('backward_segment_max_layers')
    for f in self._usable('segment_max_layers'):
      for b in backward:
        if b <= f or len(backward) == 1:
          plan = self._make(segment_max_layers=f, backward_segment_max_layers=b)
          pairs.append(((plan.n_calls, plan.n_backward_calls, -f), f, b))
    return [(f, b) for _, f, b in sorted(pairs)]

  def _depths(self):
    n = self._options.n_async_layers
    return [n] + [d for d in ASYNC_DEPTHS if d < n]

  def _unfused(self, k, chunks=1, parts=1):
    plans = [
      self._make(
        batch_slices=k,
        sequence_chunks=chunks,
        micro_batches=parts,
        segment_max_layers=f,
        backward_segment_max_layers=b,
        n_async_layers=depth,
        prefetch=prefetch,
        saved_on_host=on_host,
        grads_on_host=grads_on_host,
      )
      for grads_on_host in ((False, True) if parts > 1 else (False,))
      for on_host in (False, True)
      for f, b in self._lengths()
      for depth in self._depths()
      for prefetch in (True, False)
    ]
    return Group(self._twins(plans), self.leanest(k, chunks, parts), 0)

  def leanest(
    self, k: int, chunks: int = 1, parts: int = 1
  ) -> plan_lib.StepPlan:
    """The unfused plan of k slices (`chunks` sequence chunks, `parts`
    micro-batches) with the least device memory: one layer per call (or
    the pinned segment lengths), nothing placed ahead or waiting to be
    copied back, saved inputs and states on the host, and in micro-batches
    the accumulated gradients too."""
    return self._make(
      batch_slices=k,
      sequence_chunks=chunks,
      micro_batches=parts,
      segment_max_layers=self._usable('segment_max_layers')[0],
      backward_segment_max_layers=self._usable('backward_segment_max_layers')[
        0
      ],
      n_async_layers=0,
      prefetch=False,
      saved_on_host=True,
      grads_on_host=parts > 1,
      params_on_device=self._params_on_device[-1],
    )

  def ready_plan(self, plan: plan_lib.StepPlan) -> plan_lib.StepPlan | None:
    """The plan a run steps on while fused `plan`'s programs compile: of
    the unfused plans with its batch slices, (example, head) pairs at once
    and place of the weights and slots, the first in the speed model's
    order of those that compile the fewest layers (`compiled_layers`:
    the shortest segments, equal ones sharing a program); None where
    `plan` fuses no layer."""
    if plan.fused_from >= plan.loss:
      return None
    plans = [
      dataclasses.replace(
        p,
        parallel_heads=plan.parallel_heads,
        params_on_device=plan.params_on_device,
      )
      for p in self._unfused(plan.batch_slices).plans
    ]
    return min(plans, key=self.compiled_layers)

  def may_fuse(self, k: int) -> bool:
    """Whether the fused program may run over k batch slices."""
    return k == 1 or not self._shared_weights

  def may_run(self, plan: plan_lib.StepPlan) -> bool:
    """Whether `plan` (one kept from an earlier run) is one this trainer
    may run."""
    chunks, parts = plan.sequence_chunks, plan.micro_batches
    heads = plan.parallel_heads
    if (
      chunks > 1
      and chunks not in self.chunks
      or parts > 1
      and parts not in self.parts
      or heads not in self.heads
      or plan.params_on_device not in self._params_on_device
      or any(getattr(plan, k) != v for k, v in self._fixed.items())
    ):
      return False
    return plan.fused_from >= plan.loss or self.may_fuse(plan.batch_slices)

  def compiled_layers(self, plan: plan_lib.StepPlan) -> int:
    """`speed_rank.compiled_layers` of `plan`, with this trainer's layer
    kinds."""
    return speed_rank.compiled_layers(plan, self._kinds, self._scan)

  def fused_compiles_cheaply(self) -> bool:
    """Whether the fused program compiles at most
    `speed_rank.FUSED_COMPILE_RATIO` times the layers of the fastest
    unfused plan."""
    forward, backward = self._lengths()[0]
    unfused = self._make(
      segment_max_layers=forward, backward_segment_max_layers=backward
    )
    fused = self._fused(1).leanest
    return self.compiled_layers(
      fused
    ) <= speed_rank.FUSED_COMPILE_RATIO * self.compiled_layers(unfused)

  def groups(self) -> Iterator[Group]:
    """Every group, in the speed model's order: each group of the plans
    with the attention layers as configured, again for each number of
    (example, head) pairs at once of `heads` (`speed_rank.ranked_heads`),
    in that order; the groups of one number in the same order as the
    configured ones."""
    groups = list(self._configured_heads_groups())
    for n in self.heads:
      if n == self._heads:
        yield from groups
        continue
      for group in groups:
        yield dataclasses.replace(
          group,
          plans=tuple(
            dataclasses.replace(p, parallel_heads=n) for p in group.plans
          ),
          leanest=dataclasses.replace(group.leanest, parallel_heads=n),
        )

  def _configured_heads_groups(self) -> Iterator[Group]:
    if self._one_pass:
      yield from self._one_pass_groups()
    chunks = ([1] if self._unchunked else []) + self.chunks
    for parts in self.parts:
      k = self._part_slices(self._rows // parts)
      for c in chunks:
        yield self._unfused(k, c, parts)

  def _one_pass_groups(self) -> Iterator[Group]:
    if self._unchunked:
      fused = []
      if self._options.pinned('segment_max_layers') is None:
        fused = [self._fused(k) for k in self.slices if self.may_fuse(k)]
      unfused = [self._unfused(k) for k in self.slices]
      if fused and self.fused_compiles_cheaply():
        yield from fused
        yield from unfused
      else:
        yield from unfused
        yield from fused
    for chunks in self.chunks:
      for k in self.slices:
        yield self._unfused(k, chunks)
