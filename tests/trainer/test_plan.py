"""The step plan: equal-length segments within a byte budget, how forward
segments split for the backward pass, what a plan counts, and that a step
never changes its plan."""

import dataclasses

import pytest

import trainer_cases as cases
from trax_revplus.trainer import TrainerOptions
from trax_revplus.trainer._plan import plan
from trax_revplus.trainer._plan import segment_lengths

pytestmark = pytest.mark.usefixtures('stock_trax')


def test_equal_segments_shorten_until_every_segment_fits():
  indices = list(range(1, 8))
  ten = {i: 10 for i in indices}
  equal_segments = segment_lengths.equal_segments
  assert equal_segments(indices, 3, ten, 30) == [[1, 2, 3], [4, 5, 6], [7]]
  assert equal_segments(indices, 3, ten, 29) == [[1, 2], [3, 4], [5, 6], [7]]
  assert equal_segments(indices, 8, ten, 0) == [[i] for i in indices]
  # One layer over the budget still runs, alone; so do all the others.
  assert equal_segments([1, 2, 3], 8, {1: 50, 2: 1, 3: 1}, 10) == [
    [1],
    [2],
    [3],
  ]
  assert equal_segments([], 8, {}, 10) == []


@pytest.mark.parametrize(
  'outputs_bytes,split',
  [
    (segment_lengths.ACTIVATION_BOUND_BYTES, ((1, 2, 3, 4),)),
    (segment_lengths.ACTIVATION_BOUND_BYTES - 1, ((1, 2), (3, 4))),
  ],
)
def test_auto_backward_split_follows_the_block_outputs(outputs_bytes, split):
  step_plan = plan.make_plan(
    [4],
    {i: 1 for i in range(6)},
    [outputs_bytes],
    segment_max_layers=4,
    segment_max_bytes=100,
    backward_segment_max_layers='auto',
  )
  assert step_plan.backward == {(1, 2, 3, 4): split}


def test_plan_of_blocks_counts_a_standard_layer_before_each_block():
  nbytes = {i: 1 for i in range(12)}
  step_plan = plan.make_plan(
    [4, 0, 5],
    nbytes,
    [0, 0, 0],
    segment_max_layers=3,
    segment_max_bytes=100,
    backward_segment_max_layers=2,
  )
  assert step_plan.blocks == (
    (0, ((1, 2, 3), (4,))),
    (5, ()),
    (6, ((7, 8, 9), (10, 11))),
  )
  assert step_plan.loss == 12
  assert step_plan.backward == {
    (1, 2, 3): ((1, 2), (3,)),
    (4,): ((4,),),
    (7, 8, 9): ((7, 8), (9,)),
    (10, 11): ((10, 11),),
  }
  # Forward: 3 standard layers and 4 segments; the loss; backward: 3
  # standard layers and 6 backward segments.
  assert step_plan.n_calls == 7 + 1 + 9
  assert step_plan.n_backward_calls == 6
  assert step_plan.unit_starts() == [0, 1, 4, 5, 6, 7, 10, 12]
  fused = dataclasses.replace(step_plan, fused_from=6)
  # Layers 6.. run inside the loss program: the first two blocks remain.
  assert fused.n_calls == 4 + 1 + 5
  assert fused.settings()['fused_layers'] == 6


def test_a_plan_without_fused_layers_holds_the_loss_index():
  """Omitted, `UNFUSED` or None, `fused_from` is stored as the loss
  layer's index (nothing fused), as plans.json writes it."""
  layout = dict(blocks=((0, ((1, 2),)),), loss=3, backward={(1, 2): ((1, 2),)})
  for given in ({}, {'fused_from': plan.UNFUSED}, {'fused_from': None}):
    step_plan = plan.StepPlan(**layout, **given)
    assert step_plan.fused_from == 3
    assert step_plan == plan.StepPlan(**layout, fused_from=3)
    assert step_plan.settings()['fused_layers'] == 0


def test_a_plan_must_decide_every_backward_split():
  with pytest.raises(ValueError, match='not decided'):
    plan.StepPlan(blocks=((0, ((1, 2),)),), loss=3, backward={})


def test_configured_plan_follows_the_settings():
  options = TrainerOptions(
    segment_max_layers=2,
    backward_segment_max_layers=1,
    n_async_layers=3,
    batch_slices=2,
  )
  step_plan = plan.configured_plan([4], {i: 1 for i in range(6)}, [0], options)
  assert step_plan.blocks == ((0, ((1, 2), (3, 4))),)
  assert (
    step_plan.batch_slices,
    step_plan.n_async_layers,
    step_plan.fused_from,
  ) == (2, 3, 5)


def test_a_step_never_changes_its_plan():
  batch = cases.batch()
  _, trainer, _ = cases.train_basic(n_steps=1)
  planned = trainer.planned(batch)
  plan_before = dataclasses.replace(planned.plan)
  backward_before = list(planned.units.backward_units)
  cases.train(trainer, batch, 2)
  again = trainer.planned(batch)
  assert again is planned
  assert again.plan == plan_before
  assert again.units.backward_units == backward_before
