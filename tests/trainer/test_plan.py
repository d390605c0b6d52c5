"""The segment plan: equal-length segments within a byte budget, and how
forward segments split for the backward pass."""

import pytest

from trax_revplus.trainer import options as options_lib
from trax_revplus.trainer import plan


def test_equal_segments_shorten_until_every_segment_fits():
  indices = list(range(1, 8))
  ten = {i: 10 for i in indices}
  assert plan.equal_segments(indices, 3, ten, 30) == [[1, 2, 3], [4, 5, 6],
                                                      [7]]
  assert plan.equal_segments(indices, 3, ten, 29) == [[1, 2], [3, 4], [5, 6],
                                                      [7]]
  assert plan.equal_segments(indices, 8, ten, 0) == [[i] for i in indices]
  # One layer over the budget still runs, alone; so do all the others.
  assert plan.equal_segments([1, 2, 3], 8, {1: 50, 2: 1, 3: 1}, 10) == [
      [1], [2], [3]]
  assert plan.equal_segments([], 8, {}, 10) == []


@pytest.mark.parametrize('outputs_bytes,split', [
    (plan.ACTIVATION_BOUND_BYTES, [(1, 2, 3, 4)]),
    (plan.ACTIVATION_BOUND_BYTES - 1, [(1, 2), (3, 4)])])
def test_auto_backward_split_is_decided_once_from_the_outputs(outputs_bytes,
                                                              split):
  segment_plan = plan.SegmentPlan(blocks=[(0, [(1, 2, 3, 4)])], loss=5,
                                  backward={}, backward_max_layers='auto')
  assert segment_plan.decide_backward((1, 2, 3, 4), outputs_bytes) == split
  # Decided: other outputs change nothing.
  assert segment_plan.decide_backward((1, 2, 3, 4), 0) == split
  assert segment_plan.decide_backward((1, 2, 3, 4), 2**40) == split


def test_plan_of_blocks_counts_a_standard_layer_before_each_block():
  options = options_lib.TrainerOptions(segment_max_layers=3,
                                       backward_segment_max_layers=2)
  nbytes = {i: 1 for i in range(12)}
  segment_plan = plan.plan_segments([4, 0, 5], nbytes, options)
  assert segment_plan.blocks == [(0, [(1, 2, 3), (4,)]), (5, []),
                                 (6, [(7, 8, 9), (10, 11)])]
  assert segment_plan.loss == 12
  # An int setting is decided at once.
  assert segment_plan.backward == {
      (1, 2, 3): [(1, 2), (3,)], (4,): [(4,)], (7, 8, 9): [(7, 8), (9,)],
      (10, 11): [(10, 11)]}
  auto = plan.plan_segments([4, 0, 5], nbytes, options_lib.TrainerOptions())
  assert auto.backward == {}
