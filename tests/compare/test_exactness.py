"""The line that explains a final weight difference from stock's.

References: plans.json files written by the trainer's own `PlanStore`
(what a run leaves), and the plan dimensions `StepPlan` documents as
changing the float32 summation order.
"""

import pytest

from trax_revplus.compare import exactness
from trax_revplus.trainer._plan import plan as plan_lib
from trax_revplus.trainer._search import plan_store


def _plan(**settings):
  return plan_lib.make_plan(
    [2],
    {i: 10 for i in range(4)},
    [2**20],
    segment_max_layers=2,
    segment_max_bytes=2**20,
    backward_segment_max_layers=2,
    **settings,
  )


def _kept(tmp_path, *plans):
  """The plans as a run keeps them in `tmp_path`, read back."""
  store = plan_store.PlanStore(str(tmp_path))
  for i, plan in enumerate(plans):
    store.save(f'key{i}', plan, 100, None, {})
  return exactness.stored_reorderings(tmp_path)


def test_the_plans_a_run_keeps_are_read_back(tmp_path):
  assert exactness.PLANS_FILENAME == plan_store.FILENAME
  assert exactness.REORDERINGS == plan_store.REORDERINGS
  assert exactness.stored_reorderings(tmp_path) == []  # none kept
  plans = [
    _plan(batch_slices=2),
    _plan(micro_batches=2, sequence_chunks=4),
    _plan(),
  ]
  assert _kept(tmp_path, *plans) == [
    ['2 batch slices'],
    ['4 sequence chunks', '2 micro-batches'],
    [],
  ]
  (tmp_path / exactness.PLANS_FILENAME).write_text('{"plans": [')
  assert exactness.stored_reorderings(tmp_path) == []  # damaged


def test_a_difference_within_rounding_or_none_needs_no_line(tmp_path):
  plans = _kept(tmp_path, _plan(batch_slices=2))
  assert exactness.explanation(plans, None) is None
  assert exactness.explanation(plans, 0.0) is None
  assert exactness.explanation(plans, exactness.TOLERANCE) is None


def test_slices_are_named_with_the_setting_that_runs_stocks_order(tmp_path):
  line = exactness.explanation(_kept(tmp_path, _plan(batch_slices=2)), 0.03)
  assert line == (
    "final weights differ from stock's by 0.03 (over 1e-05): "
    'trax_revplus ran 2 batch slices, which can sum in another float32 '
    'order than stock (where a layer hashes its activations, as LSH '
    'attention does, rounding can change a bucket and grow); '
    "--config='trax_revplus.ReversibleSerialTrainer."
    "device_memory_budget_bytes = None' runs stock's order."
  )


@pytest.mark.parametrize(
  'settings,named',
  [
    ({'micro_batches': 2}, '2 micro-batches'),
    ({'sequence_chunks': 4}, '4 sequence chunks'),
    (
      {'parallel_heads': 1},
      'attention 1 (example, head) pair at a time',
    ),
    ({'fused_from': 0}, 'the step as one program'),
    (
      {'batch_slices': 2, 'parallel_heads': 2, 'fused_from': 0},
      '2 batch slices, attention 2 (example, head) pairs at a time, '
      'the step as one program',
    ),
  ],
)
def test_every_dimension_that_can_reorder_is_named(tmp_path, settings, named):
  line = exactness.explanation(_kept(tmp_path, _plan(**settings)), 2e-5)
  assert f'trax_revplus ran {named}, which can sum' in line
  assert line.endswith(
    "--config='trax_revplus.ReversibleSerialTrainer."
    "device_memory_budget_bytes = None' runs stock's order."
  )
  assert '\n' not in line


def test_stocks_order_is_not_the_cause(tmp_path):
  line = exactness.explanation(_kept(tmp_path, _plan(), _plan()), 0.5)
  assert line.startswith(
    "final weights differ from stock's by 0.5 (over "
    "1e-05), although trax_revplus ran stock's float32 "
    'summation order'
  )
  assert line.endswith('the plan is not the cause.')


def test_no_kept_plan_says_so(tmp_path):
  line = exactness.explanation(exactness.stored_reorderings(tmp_path), 1e-3)
  assert 'kept no plan (plans.json)' in line
  assert line.endswith(
    "--config='trax_revplus.ReversibleSerialTrainer."
    "device_memory_budget_bytes = None', with every setting the planner "
    "chooses left at 'auto', runs it."
  )


def test_compare_prints_the_line_under_the_weights_row(tmp_path):
  """compare.json and the table carry the line, from the runs' files."""
  import gzip  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from trax_revplus import compare  # pylint: disable=g-import-not-at-top

  runs = {}
  for k, shift in (('stock', 0.0), ('revplus', 0.03)):
    run_dir = tmp_path / k
    run_dir.mkdir()
    for name in ('model.weights.npy.gz', 'model.opt_slots0.npy.gz'):
      with gzip.open(run_dir / name, 'wb') as f:  # as trax's np_to_file
        np.save(f, np.full((2, 3), 1.0 + shift, np.float32), allow_pickle=False)
    runs[k] = compare.collect_run(
      k, 0, '', str(run_dir), str(tmp_path / f'{k}.log'), 1.0
    )
  plan_store.PlanStore(str(tmp_path / 'revplus')).save(
    'key', _plan(batch_slices=2), 100, None, {}
  )
  report = compare.build_report(['c.gin'], [], 2, 0, False, runs)
  note = report['final_weights_note']
  assert note.startswith("final weights differ from stock's by 0.03")
  assert 'trax_revplus ran 2 batch slices' in note
  table = compare.format_table(report)
  assert f'\n  {note}\n' in table  # one line, pasteable
  runs['revplus']['output_dir'] = runs['stock']['output_dir']
  report = compare.build_report(['c.gin'], [], 2, 0, False, runs)
  assert report['final_weights_note'] is None
  assert 'which can sum' not in compare.format_table(report)
