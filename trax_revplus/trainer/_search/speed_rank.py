"""The speed model's rank of candidate plans, and the facts it rests on.

Kept apart from `candidates` (which lists the plans): the rules below are
measured per backend, and change with measurements, not with the plan
space.

The speed model ranks plans without timing them, in this order of
importance: (1) the fused program first: one call per step, with no host
work and no dispatch between layers, where unfused plans run two calls per
segment and recompute the same activations; but only where it compiles at
most `FUSED_COMPILE_RATIO` times the layers the fastest unfused plan
compiles (`compiled_layers`): unrolled, XLA compiles the fused program's
layers one by one, while equal segments share one compilation, so on a
deep model of equal blocks the fused program's compilation would cost many
times the run's first step (and there, with many small layers, it did not
step faster either: docs/performance.md); such a model ranks its fused
groups after every unfused one; where the fused program loops over equal
blocks (`SCAN_EQUAL_BLOCKS`: accelerators), their run counts as one
block; (2) fewer batch slices: an accelerator runs
larger matrices faster, and a draw that slices change (a layer drawing a
mask of slice shape other than trax's `Dropout` and efficient attention:
`row_draws`) gives stock trax's weights only unsliced; but where slices
change no draw (they change only float32 summation order), on the CPU
backend 2 slices rank before 1 (`SPEED_SLICES`): there 2 slices stepped
faster than one in every kind of plan measured, and 4 no faster than 2
(docs/performance.md), except where a layer hashes its activations
(`hashing`: LSH attention; another summation order can change its
buckets); (3) fewer compiled calls (each costs a dispatch and host work
for its weights, slots and updates), then fewer backward calls, then
longer forward segments; (4) a deeper copy-back, then prefetching (each
overlaps host work with device work).
Within a group, every plan whose saved inputs and states wait on the
device comes before every plan whose wait on the host: those copy them out
and back, and wait for each forward call before dispatching the next. The
benchmark checks the rank against measured step times
(docs/performance.md).
"""

from typing import Hashable, Mapping, Sequence

from trax_revplus.trainer._plan import plan as plan_lib
from trax_revplus.trainer._step import attention_heads
from trax_revplus.trainer._step import chains

# The fused program ranks first where it compiles at most this many times
# the layers of the fastest unfused plan's distinct programs. Measured on
# one CPU (docs/performance.md, the benchmark's ReformerLMs): at 2.9, 5.6
# and 10.9 times (6, 12 and 24 blocks) the fused program stepped 15-25%
# faster than segments of 8, its compilation adding 0 to 17 s to the first
# step; at 29 times (64 small blocks) it stepped no faster and its
# compilation took 77 s, against stock's whole first step of 5.6 s.
FUSED_COMPILE_RATIO = 16
# Where slices change no random draw (`row_draws`) and no layer hashes its
# activations (`hashing`), on these backends this many slices rank first.
SPEED_SLICES: Mapping[str | None, int] = {'cpu': 2}
# How many (example, head) pairs trax's efficient attention layers compute
# at once ranks first on each backend: FEWEST (one pair at a time) before
# the layers as configured, where no layer hashes its activations
# (`hashing`); MOST (all of a call's pairs) before them. A backend not
# named keeps the layers as configured first. Measured by
# tools/attention_speed.py (docs/performance.md): on the CPU one pair at a
# time stepped 10-17% faster on the benchmark's ReformerLMs and
# encoder-decoder Reformer; on a TPU v5e chip, of trax's enwik8
# Reformer's layers (configured one pair at a time) `LSHSelfAttention`
# stepped slower with more pairs at once and `SelfAttention` twice as
# fast: no rule for every kind there, one per kind
# (`SPEED_PARALLEL_HEADS_BY_KIND`).
FEWEST = 'fewest'
MOST = 'most'
SPEED_PARALLEL_HEADS: Mapping[str | None, str] = {'cpu': FEWEST}
# Where kinds of attention layer (`attention_heads.kind`) differ in which
# number of pairs at once steps fastest on a backend, the kinds named here
# rank first at theirs (ROW: one example's heads at once), the others as
# configured (`heads_by_kind`), before the backend's rule for all.
# Measured on a TPU v5e chip, trax's enwik8 Reformer at 65536 tokens a row
# (docs/performance.md): `SelfAttention`'s forward and gradient at 4 rows
# a call took 0.119 s with one row's 8 heads at once against 0.249 s one
# pair at a time (16 at once, 7% faster again, held twice the
# temporaries); `LSHSelfAttention`'s took 0.61 s one pair at a time, 0.83
# s at 2 and 2.35 s at 8 (its gathers): a step of that model took 9.9 s
# with `SelfAttention` at 8 and `LSHSelfAttention` at 1, 12.7 s with both
# at 1 as the config sets them.
ROW = 'row'
SPEED_PARALLEL_HEADS_BY_KIND: Mapping[str | None, Mapping[str, str]] = {
  'tpu': {'SelfAttention': ROW},
}
# Whether each plan with every layer's weights and slots kept on the device
# across steps (`plan.StepPlan.params_on_device`) ranks just before the
# same plan with them on the host, per backend (a backend not named: it
# does). On an accelerator they cross its host link twice a step otherwise
# (the whole model's on a TPU v5e chip: a quarter of the 12-layer LM's
# step, docs/performance.md). On the CPU backend a device buffer is host
# memory: the host's copies are views of it and the calls read host arrays
# in place, so neither way copies, and the plans on the host need no
# device memory for the layers not called.
SPEED_PARAMS_ON_DEVICE: Mapping[str | None, bool] = {'cpu': False}
# Whether the fused program runs equal consecutive blocks of reversible
# layers as one loop over their stacked weights
# (`chains.scanned_forward_fn`), per backend (a backend not named: it
# does). The loop is compiled once whatever the depth; it stacks the
# blocks' weights and unstacks their gradients each step. On one CPU (2
# cores; ReformerLM blocks of d_model 512, d_ff 2048, 8 heads, 2 rows of
# 256 tokens; docs/performance.md) the forward and gradient compiled in
# 4.3 s against 8.9 s unrolled at 12 layers and 6.3 s against 45.5 s at
# 48, and stepped 3-5% slower with twice the temporaries (the stacked
# copies): on the CPU, where those copies cost the step what they save
# in compiling within 50 to 110 steps, the program stays unrolled.
SCAN_EQUAL_BLOCKS: Mapping[str | None, bool] = {'cpu': False}

# A run's first steps run on the unfused plan that compiles the fewest
# layers while the fused program the speed model ranks first compiles,
# and the run moves to it at the first step after it compiled
# (`candidates.Candidates.ready_plan`), where the fused program compiles
# more than this many times the layers of the ready plan
# (`compiled_layers`), per backend (a backend not named: whatever it
# compiles). On an accelerator the compiler runs on the host's cores
# while the device steps. On one CPU (2 cores, the benchmark's
# ReformerLMs, docs/performance.md) the compiler and the steps share the
# cores: at 24 layers (19.6 times the layers) the first step took 25 s
# against 37 s, the steps until the switch at stock's speed; at 6 layers
# (5.2 times) 12.7 s against 9.9 s.
READY_FIRST_RATIO: Mapping[str | None, float] = {'cpu': 16}


def starts_on_ready(
  platform: str | None, fused_layers: int, ready_layers: int
) -> bool:
  """Whether a run steps on a ready plan that compiles `ready_layers`
  layers while the fused program, `fused_layers`, compiles on `platform`
  (`READY_FIRST_RATIO`)."""
  return fused_layers > READY_FIRST_RATIO.get(platform, 0) * ready_layers


def scans_equal_blocks(platform: str | None) -> bool:
  """Whether the fused program loops over equal blocks of layers on
  `platform` (`SCAN_EQUAL_BLOCKS`; a backend not named: it does)."""
  return SCAN_EQUAL_BLOCKS.get(platform, True)


def compiled_layers(
  plan: plan_lib.StepPlan,
  layer_kinds: Sequence[Hashable] | None,
  scan: bool = False,
) -> int:
  """Layers in the distinct programs `plan`'s step compiles, the loss
  layer's included: each fused layer (with `scan`, the fused layers' run
  of equal blocks counted once: `chains.repeats_of` of their kinds), and
  each forward unit outside the loss program whose layers compute what an
  earlier unit's do once (its backward calls compile the same layers
  again).

  Args:
    plan: the `plan.StepPlan`.
    layer_kinds: list by layer index of hashables, equal where two layers
      share a compilation (`candidates.Candidates`'s); None: every layer
      its own.
    scan: bool, the fused program loops over equal blocks
      (`scans_equal_blocks`).
  """
  seen = set()
  n = 1 + plan.loss - plan.fused_from
  if scan and layer_kinds is not None:
    run = chains.repeats_of(layer_kinds[plan.fused_from : plan.loss])
    if run is not None:
      n -= (run.count - 1) * run.period
  for unit in plan.unit_spans():
    if unit[0] >= plan.fused_from:
      continue
    key = (
      tuple(unit)
      if layer_kinds is None
      else tuple(layer_kinds[i] for i in unit)
    )
    if key not in seen:
      seen.add(key)
      n += len(unit)
  return n


def ranked_slices(
  slices: list[int],
  platform: str | None,
  slices_change_draws: bool,
  hashes_activations: bool,
) -> list[int]:
  """`slices` (batch slice counts, fewest first) in the speed model's
  order: `SPEED_SLICES[platform]` first where slices change no random
  draw and no layer hashes its activations, else as given."""
  first = SPEED_SLICES.get(platform)
  if not slices_change_draws and not hashes_activations and first in slices:
    slices.remove(first)
    slices.insert(0, first)
  return slices


def heads_by_kind(
  platform: str | None,
  kinds: Sequence[tuple[str, int, int | None]],
  rows: int,
) -> plan_lib.PairsByKind | None:
  """The pairs at once by kind of attention layer that rank first on
  `platform` (`SPEED_PARALLEL_HEADS_BY_KIND`: ROW, one example's heads at
  once, for a kind some of whose layers are configured with fewer and
  whose layers all have as many heads), or None where its rules raise
  none of the model's layers in a call of `rows` rows.

  Args:
    platform: str, the devices' backend, or None.
    kinds: (kind, heads, configured pairs at once or None) of each
      attention layer (`attention_heads.layer_kinds`).
    rows: int, rows of the batch each device gets.
  """
  rules = SPEED_PARALLEL_HEADS_BY_KIND.get(platform) or {}
  heads_of: dict[str, set[int]] = {}
  below: set[str] = set()
  for name, heads, own in kinds:
    if rules.get(name) == ROW:
      heads_of.setdefault(name, set()).add(heads)
      if own is not None and own < heads:
        below.add(name)
  # ROW raises a kind configured below one row's heads; it never lowers
  # one configured above (all pairs at once: None), nor sets a kind whose
  # layers differ in heads (one number cannot be each one's row).
  numbers = {
    name: next(iter(heads))
    for name, heads in heads_of.items()
    if name in below and len(heads) == 1
  }
  if not numbers:
    return None
  n = attention_heads.by_kind(numbers)
  if not attention_heads.changes_kinds(kinds, n, rows):
    return None
  if not attention_heads.runs_kinds_at(kinds, n, rows):
    return None
  return n


def ranked_heads(
  platform: str | None,
  hashes_activations: bool,
  fewest: int | None,
  most: int | None,
  by_kind: plan_lib.PairsByKind | None = None,
) -> list[plan_lib.PairsAtOnce]:
  """The numbers of (example, head) pairs at once the plans set, in the
  speed model's order (`SPEED_PARALLEL_HEADS`): None (the layers as
  configured), `fewest` and `most` where given (those that change some
  layer); `most` only on a backend where it ranks first (it is never
  leaner), `fewest` last but where it ranks first (a budget takes it
  where nothing else fits).

  Args:
    platform: str, the devices' backend ('cpu', 'tpu', ...), or None.
    hashes_activations: bool, whether some layer hashes its activations
      (`hashing`): then one pair at a time does not rank first.
    fewest: int (1) or None: one pair at a time, where that changes some
      attention layer.
    most: int or None: all of a call's pairs at once
      (`attention_heads.all_pairs`), where that changes some layer.
    by_kind: the pairs at once by kind that rank first on the backend
      (`heads_by_kind`), or None: first where given.
  """
  rule = SPEED_PARALLEL_HEADS.get(platform)
  ranked: list[plan_lib.PairsAtOnce] = [None]
  if rule == MOST and most is not None:
    ranked.insert(0, most)
  if fewest is not None:
    if rule == FEWEST and not hashes_activations:
      ranked.insert(0, fewest)
    else:
      ranked.append(fewest)
  if by_kind is not None:
    ranked.insert(0, by_kind)
  return ranked


def ranked_params_on_device(
  platform: str | None, pinned: bool | None, refusal: str | None
) -> list[bool]:
  """Where the plans keep the weights and slots between steps
  (`plan.StepPlan.params_on_device`), in the speed model's order: on the
  device first where `SPEED_PARAMS_ON_DEVICE` ranks it first, then on the
  host (the leaner: a plan on the host that does not fit, its twin on the
  device does not either).

  Args:
    platform: str, the devices' backend, or None.
    pinned: bool, the setting where the user gave one, or None ('auto').
    refusal: why they cannot stay on the device
      (`options.params_on_device_refusal`), or None.
  """
  if refusal is not None:
    return [False]
  if pinned is not None:
    return [pinned]
  return (
    [True, False] if SPEED_PARAMS_ON_DEVICE.get(platform, True) else [False]
  )
