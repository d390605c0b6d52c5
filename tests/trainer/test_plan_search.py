"""The search's families: a family's members with fewer slices or parts are
not compiled where one with more does not fit, and stock's schedule is
always weighed.

Reference: an exhaustive search of the same candidates under the same
figures (every plan weighed, in the speed model's order).
"""

import types

import pytest

from trax_revplus.trainer import TrainerOptions
from trax_revplus.trainer._search import candidates as candidates_lib
from trax_revplus.trainer._search import plan_search
from trax_revplus.trainer._search import weighers

pytestmark = pytest.mark.usefixtures('stock_trax')


def _candidates(**kwargs):
  # One block of 4 reversible layers, 8 rows: slices 1, 2, 4, 8; parts 2,
  # 4, 8; no sequence chunks.
  return candidates_lib.Candidates(
    [4],
    {i: 10 for i in range(6)},
    [2**10],
    rows=8,
    options=TrainerOptions(),
    **kwargs,
  )


def _figures():
  """A peak per plan: unfused plans hold a stack that shrinks with parts,
  and calls whose temporaries shrink with slices and parts; fused plans
  more; deeper copy-backs hold more, saved inputs on the device more
  (every part of a peak is bytes held or a call's, none negative: the
  search's rows bound rests on it)."""

  def peak(plan):
    k, m = plan.batch_slices, plan.micro_batches
    if plan.fused_from < plan.loss:
      return 4000 // k
    return (
      800 // m
      + 800 // (k * m)
      + 10 * plan.n_async_layers
      + 5 * (not plan.saved_on_host)
    )

  return peak


def _fused_stack_bound(plan):
  """What a fused plan keeps at least, known without compiling it: its
  block's stack states over its slices, and every layer's weights and
  slots (the candidates' figures above)."""
  if plan.fused_from < plan.loss:
    return 2**10 // plan.batch_slices + 60
  return 0


class _Weigher(weighers.FixedWeigher):
  """Weighs by `peak`; bounds fused plans by `_fused_stack_bound`."""

  def lower(self, plan):
    return _fused_stack_bound(plan)


def _search(peak, **kwargs):
  weighed = {}

  def weigh(plan):
    weighed.setdefault(
      plan, types.SimpleNamespace(peak_device_bytes=peak(plan), calls=())
    )
    return weighed[plan]

  search = plan_search.PlanSearch(
    _candidates(**kwargs), _Weigher(weigh, weighed.get)
  )
  return search, weighed


def _exhaustive(peak, budget_bytes):
  return next(
    (
      plan
      for group in _candidates().groups()
      for plan in group.plans
      if peak(plan) <= budget_bytes
    ),
    None,
  )


@pytest.mark.parametrize(
  'budget_bytes', [10**9, 4000, 1700, 1000, 900, 500, 450, 205, 200, 195, 10]
)
def test_the_search_finds_what_an_exhaustive_one_finds(budget_bytes):
  peak = _figures()
  search, _ = _search(peak)
  assert search.fastest_fitting(budget_bytes) == _exhaustive(peak, budget_bytes)


def test_members_with_fewer_slices_or_parts_are_not_compiled():
  peak = _figures()
  search, weighed = _search(peak)
  chosen = search.fastest_fitting(200)  # only 8 parts fit
  assert chosen.micro_batches == 8
  fused = [p.batch_slices for p in weighed if p.fused_from < p.loss]
  # Only the fused group of the most slices keeps its stack states within
  # the budget (the weigher's lower bound); it does not fit.
  assert fused == [8]
  unfused_one_pass = {
    p.batch_slices
    for p in weighed
    if p.fused_from == p.loss and p.micro_batches == 1
  }
  assert unfused_one_pass == {1, 8}
  assert 2 not in {p.micro_batches for p in weighed}
  # Fewer compilations than an exhaustive search's.
  n_plans = sum(len(g.plans) for g in _candidates().groups())
  assert len(weighed) < n_plans // 10


def test_stock_s_schedule_is_weighed_where_slicing_does_not_shrink():
  # Nothing is drawn and the backend is the CPU, so 2 slices rank first;
  # no plan fits but the unsliced unfused leanest one (stock's schedule):
  # every sliced plan is larger (a call slicing cannot shrink). The search
  # is tight from the 2-slice group on, and finds it all the same.
  def peak(plan):
    stock = (
      plan.fused_from == plan.loss
      and plan.batch_slices == 1
      and plan.micro_batches == 1
      and plan.saved_on_host
      and plan.n_async_layers == 0
      and not plan.prefetch
      and plan.settings()['segment_max_layers'] == 1
    )
    return 1500 if stock else 4000

  cpu = {
    'slices_change_draws': False,
    'hashes_activations': False,
    'platform': 'cpu',
  }
  search, _ = _search(peak, **cpu)
  assert next(_candidates(**cpu).groups()).leanest.batch_slices == 2
  chosen = search.fastest_fitting(1500)
  assert peak(chosen) == 1500
  assert search.least()[1].peak_device_bytes == 1500


def test_a_member_with_more_slices_is_bounded_by_one_with_fewer():
  """The fused program of 4 slices needs 1000 bytes: that of 8 needs at
  least half (`GroupBounds.rows`), above a budget of 450, and is not compiled;
  those of 1 and 2 keep more stack states than that (the weigher's lower
  bound)."""
  peak = _figures()
  search, weighed = _search(peak)
  assert search.fastest_fitting(450) == _exhaustive(peak, 450)
  assert [p.batch_slices for p in weighed if p.fused_from < p.loss] == [4]
  # A refused member bounds the rest by the bytes its refusal names.
  refusal = types.SimpleNamespace(least_bytes=1000)
  search = plan_search.PlanSearch(
    _candidates(),
    weighers.FixedWeigher(
      lambda plan: None,
      lambda plan: None,
      lambda plan: refusal if plan.batch_slices == 4 else None,
    ),
  )
  fused_8 = next(
    g
    for g in _candidates().groups()
    if g.fused_reversible_layers and g.leanest.batch_slices == 8
  )
  assert search._bounds.rows(fused_8) == 500  # pylint: disable=protected-access


def test_the_least_is_an_exhaustive_search_s_least_group_leanest():
  peak = _figures()
  search, _ = _search(peak)
  least_plan, least = search.least()
  assert least.peak_device_bytes == min(
    peak(g.leanest) for g in _candidates().groups()
  )
  assert peak(least_plan) == least.peak_device_bytes
