"""The speed model's order of plans: the fused program first only where its
compilation stays within a few times the unfused plan's.

References: the layers each plan's distinct programs hold, counted by hand
for blocks of equal layers (the way trax's ReformerLM repeats its decoder
blocks), and the trainer's own fingerprints on a model the suite builds.
"""

import pytest

import trainer_cases as cases
from trax_revplus.trainer import AUTO
from trax_revplus.trainer import TrainerOptions
from trax_revplus.trainer._search import candidates as candidates_lib
from trax_revplus.trainer._search import speed_rank

pytestmark = pytest.mark.usefixtures('stock_trax')


def _candidates(n_reversible, kinds=True, platform='cpu'):
  """One block: a standard layer, then `n_reversible` reversible layers
  alternating two kinds (a half-residual and a swap), then the loss; on
  the CPU backend by default, whose fused program traces every layer
  (`speed_rank.SCAN_EQUAL_BLOCKS`)."""
  n = n_reversible + 2
  layer_kinds = None
  if kinds:
    layer_kinds = (
      ['embedding']
      + ['half' if i % 2 == 0 else 'swap' for i in range(n_reversible)]
      + ['loss']
    )
  return candidates_lib.Candidates(
    [n_reversible],
    {i: 1000 for i in range(n)},
    [2**20],
    rows=2,
    options=TrainerOptions(),
    layer_kinds=layer_kinds,
    platform=platform,
  )


def test_compiled_layers_count_equal_segments_once():
  candidates = _candidates(24)
  fused = next(
    g for g in candidates.groups() if g.fused_reversible_layers
  ).leanest
  # Every layer inside the fused program: 1 + 24 + the loss.
  assert candidates.compiled_layers(fused) == 26
  # Segments of 8 equal layers share one program: the standard layer, one
  # segment, the loss.
  unfused = next(
    g for g in candidates.groups() if not g.fused_reversible_layers
  ).plans[0]
  assert unfused.settings()['segment_max_layers'] == 8
  assert candidates.compiled_layers(unfused) == 1 + 8 + 1


def test_a_fused_program_that_loops_counts_its_equal_blocks_once():
  # On a backend whose fused program loops over equal blocks (an
  # accelerator's): the standard layer, one block of 2 (half-residual,
  # swap), the loss; a deep model's fused program compiles as cheaply as a
  # shallow one's and ranks first.
  candidates = _candidates(24, platform='tpu')
  fused = next(
    g for g in candidates.groups() if g.fused_reversible_layers
  ).leanest
  assert candidates.compiled_layers(fused) == 1 + 2 + 1
  assert _candidates(240, platform='tpu').fused_compiles_cheaply()
  assert not _candidates(240).fused_compiles_cheaply()


def test_a_shallow_model_ranks_the_fused_program_first():
  # 26 against 10 layers compiled: within FUSED_COMPILE_RATIO.
  assert 26 <= speed_rank.FUSED_COMPILE_RATIO * 10
  groups = list(_candidates(24).groups())
  assert groups[0].fused_reversible_layers == 24
  assert groups[0].leanest.batch_slices == 1
  assert not groups[-1].fused_reversible_layers


def test_a_deep_model_of_equal_blocks_ranks_every_unfused_plan_first():
  # 258 against 10 layers compiled: the fused program's compilation would
  # cost the run's start many times over.
  assert 258 > speed_rank.FUSED_COMPILE_RATIO * 10
  candidates = _candidates(256)
  assert not candidates.fused_compiles_cheaply()
  fused = [
    bool(g.fused_reversible_layers)
    for g in candidates.groups()
    if g.leanest.micro_batches == 1
  ]
  assert fused == sorted(fused) and fused[0] is False and fused[-1] is True
  # Still candidates: for `least`, and where no unfused plan fits.
  assert fused.count(True) == len(candidates.slices)


def test_layers_that_compile_alone_keep_the_fused_program_first():
  # Without shared compilations (memoize_jit=False) every unfused layer
  # compiles on its own, as inside the fused program.
  candidates = _candidates(256, kinds=False)
  assert candidates.fused_compiles_cheaply()
  assert next(iter(candidates.groups())).fused_reversible_layers == 256


def test_the_trainers_fingerprints_tell_equal_layers_apart():
  batch = cases.lm_batch()
  _, trainer = cases.lm_trainer(batch, device_memory_budget_bytes=None)
  p = trainer.planner
  candidates = p.candidates(p.step_types(batch))
  plan = next(
    g for g in candidates.groups() if not g.fused_reversible_layers
  ).plans[0]
  layers = trainer.all_layers
  kinds = p._facts._layer_kinds()  # pylint: disable=protected-access
  assert len(kinds) == len(layers)
  # Its decoder blocks repeat: equal layers share a kind.
  assert len(set(kinds)) < len(kinds)
  for i, layer_i in enumerate(layers):
    for j, layer_j in enumerate(layers):
      if kinds[i] == kinds[j]:
        assert type(layer_i) is type(layer_j), (i, j)
  assert candidates.compiled_layers(plan) <= len(layers)


def _parts_candidates(rows, refused=False, **settings):
  return candidates_lib.Candidates(
    [4],
    {i: 1000 for i in range(6)},
    [2**20],
    rows=rows,
    options=TrainerOptions(**settings),
    micro_batches_refused=refused,
  )


def test_micro_batches_come_after_every_one_pass_plan_fewest_parts_first():
  groups = list(_parts_candidates(8).groups())
  parts = [g.leanest.micro_batches for g in groups]
  first_micro = parts.index(2)
  assert set(parts[:first_micro]) == {1}
  assert parts[first_micro:] == [2, 4, 8]
  for group in groups[first_micro:]:
    assert not group.fused_reversible_layers
    assert all(
      p.micro_batches == group.leanest.micro_batches and p.batch_slices == 1
      for p in group.plans
    )


def test_micro_batches_refused_or_pinned():
  refused = _parts_candidates(8, refused=True).groups()
  assert {g.leanest.micro_batches for g in refused} == {1}
  pinned = list(_parts_candidates(8, micro_batches=4).groups())
  assert {g.leanest.micro_batches for g in pinned} == {4}
  # Pinned slices: parts keep those whose rows they divide.
  sliced = list(_parts_candidates(8, batch_slices=2).groups())
  assert [
    g.leanest.micro_batches for g in sliced if g.leanest.micro_batches > 1
  ] == [2, 4]
  assert all(g.leanest.batch_slices == 2 for g in sliced)
  assert {
    g.leanest.micro_batches
    for g in _parts_candidates(8, micro_batches=1).groups()
  } == {1}


def _sliced(
  slices_change_draws,
  platform,
  batch_slices=AUTO,
  rows=8,
  hashes_activations=False,
):
  candidates = candidates_lib.Candidates(
    [4],
    {i: 1000 for i in range(6)},
    [2**20],
    rows=rows,
    options=TrainerOptions(batch_slices=batch_slices),
    slices_change_draws=slices_change_draws,
    platform=platform,
    hashes_activations=hashes_activations,
  )
  return [
    g.leanest.batch_slices
    for g in candidates.groups()
    if g.fused_reversible_layers
  ]


def test_two_slices_rank_first_on_the_cpu_where_slices_change_no_draw():
  assert _sliced(slices_change_draws=False, platform='cpu') == [2, 1, 4, 8]
  # A draw of slice shape: the unsliced plan gives stock's draws first.
  assert _sliced(slices_change_draws=True, platform='cpu') == [1, 2, 4, 8]
  # A layer hashing its activations: another summation order can change
  # its buckets, the unsliced plan keeps stock's.
  assert _sliced(
    slices_change_draws=False, platform='cpu', hashes_activations=True
  ) == [1, 2, 4, 8]
  # Not measured on accelerators: larger matrices use them better.
  assert _sliced(slices_change_draws=False, platform='tpu') == [1, 2, 4, 8]
  assert _sliced(slices_change_draws=False, platform='cpu', rows=3) == [1, 3]
  assert _sliced(slices_change_draws=False, platform='cpu', batch_slices=4) == [
    4
  ]


def _heads(
  platform,
  parallel_heads=AUTO,
  hashes_activations=False,
  attention=(('Attention', 4, None),),
  rows=2,
):
  candidates = candidates_lib.Candidates(
    [4],
    {i: 1000 for i in range(6)},
    [2**20],
    rows=rows,
    options=TrainerOptions(parallel_heads=parallel_heads),
    platform=platform,
    attention=attention,
    hashes_activations=hashes_activations,
  )
  return [g.leanest.parallel_heads for g in candidates.groups()]


def test_all_pairs_at_once_ranks_first_where_the_rule_says(monkeypatch):
  # Layers configured one pair at a time (trax's enwik8 config): on a
  # backend whose rule is MOST, all pairs of a call at once (2 rows x 4
  # heads) first, as configured after; no plan raises them elsewhere.
  monkeypatch.setitem(speed_rank.SPEED_PARALLEL_HEADS, 'gpu', speed_rank.MOST)
  most = _heads('gpu', attention=(('Attention', 4, 1),))
  half = len(most) // 2
  assert most == [8] * half + [None] * half
  assert set(_heads('cpu', attention=(('Attention', 4, 1),))) == {None}
  assert set(_heads('tpu', attention=(('Attention', 4, 1),))) == {None}
  # Heads of 4 and 2: a multiple of both, times the rows.
  assert (
    _heads('gpu', attention=(('Attention', 4, 1), ('Other', 2, 1)), rows=3)[0]
    == 12
  )
  # Even where a layer hashes its activations.
  assert (
    _heads('gpu', attention=(('Attention', 4, 1),), hashes_activations=True)
    == most
  )
  # Layers configured with all pairs at once: one at a time, last.
  assert (
    _heads('gpu', attention=(('Attention', 4, 8),))
    == [None] * half + [1] * half
  )


def test_pinned_pairs_at_once_keep_the_slicings_they_divide():
  # 8 pairs at once over 4 heads: 2 rows a group; a call of 1 row runs all
  # its 4 pairs at once; one of 3 rows (12 pairs) cannot run 8 at a time.
  candidates = candidates_lib.Candidates(
    [4],
    {i: 1000 for i in range(6)},
    [2**20],
    rows=6,
    options=TrainerOptions(parallel_heads=8),
    attention=[('Attention', 4, 1)],
  )
  assert candidates.slices == [1, 3, 6]
  assert candidates.heads == [8]


def test_one_pair_at_a_time_ranks_first_on_the_cpu_only():
  cpu, tpu = _heads('cpu'), _heads('tpu')
  assert len(cpu) == len(tpu) and len(cpu) % 2 == 0
  half = len(cpu) // 2
  assert cpu == [1] * half + [None] * half
  assert tpu == [None] * half + [1] * half
  # Not where a layer hashes its activations: as configured first.
  assert _heads('cpu', hashes_activations=True) == tpu
  # A pinned number is the only one.
  assert set(_heads('cpu', parallel_heads=2)) == {2}


def test_pairs_by_kind_rank_first_where_the_kinds_rule_says():
  # trax's enwik8 Reformer: SelfAttention and LSHSelfAttention layers of 8
  # heads, each configured one pair at a time. On a TPU SelfAttention's
  # rule (ROW) ranks one row's heads at once first, LSHSelfAttention as
  # configured; then the layers as configured, one pair at a time last.
  enwik8 = (('SelfAttention', 8, 1), ('LSHSelfAttention', 8, 1))
  tpu = _heads('tpu', attention=enwik8)
  half = len(tpu) // 2
  assert tpu == [(('SelfAttention', 8),)] * half + [None] * half
  # No rule names a kind elsewhere; nor where the kind is configured so
  # (there one pair at a time comes last, as for any layer).
  assert set(_heads('gpu', attention=enwik8)) == {None}
  assert _heads('tpu', attention=(('SelfAttention', 8, 8),))[0] is None
  assert set(_heads('tpu', attention=(('LSHSelfAttention', 8, 1),))) == {None}
  # A pinned number is the only one.
  assert set(_heads('tpu', parallel_heads=2, attention=enwik8)) == {2}


def test_heads_by_kind_of_the_rules():
  enwik8 = [('SelfAttention', 8, 1), ('LSHSelfAttention', 8, 1)]
  assert speed_rank.heads_by_kind('tpu', enwik8, rows=4) == (
    ('SelfAttention', 8),
  )
  assert speed_rank.heads_by_kind('cpu', enwik8, rows=4) is None
  # Never lowered: configured all pairs at once (None) or above a row.
  for own in (None, 16):
    assert speed_rank.heads_by_kind('tpu', [('SelfAttention', 8, own)], 4) is (
      None
    )
  # Layers of one kind with other numbers of heads: no one number.
  mixed = [('SelfAttention', 8, 1), ('SelfAttention', 4, 1)]
  assert speed_rank.heads_by_kind('tpu', mixed, rows=3) is None
  # All of a call's pairs at once already (None: all): no change.
  assert (
    speed_rank.heads_by_kind('tpu', [('SelfAttention', 8, None)], 1) is None
  )
