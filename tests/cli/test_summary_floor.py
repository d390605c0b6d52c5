"""The summary's step floor rows (`train --step_floor`): the floor at the
plan's attention pairs at once, as configured and at the best setting, the
step against each, and each layer kind's share and rate; from
run_stats.json's `step_floor`, a run's before the settings were timed
included."""

import copy
import json

import pytest

from trax_revplus.cli import summary as summaries
from trax_revplus.progress.printer import RunSummary

MEDIAN = 0.03


def _summary(floor, median=MEDIAN):
  """A `ProgressPrinter.summary()` of a 4-step run, with `floor`."""
  return RunSummary(
    last_step=4,
    steps_run=4,
    last_train_loss_step=4,
    last_train_loss=2.5,
    mean_train_loss_from_step=4,
    mean_train_loss=2.5,
    eval_losses=[],
    train_seconds=1.0,
    compiling_steps=[],
    steps_per_second_without_compiling=30.0,
    peak_host_rss_bytes=2**30,
    median_step_seconds=median,
    step_floor=floor,
  )


def _rows(floor, median=MEDIAN):
  text = summaries.format_summary(
    _summary(floor, median), None, None, None, 'train.log', 4
  )
  return summaries.summary_rows(text)


# run_stats.json's `step_floor` of a run that timed attention settings: an
# attention kind (plan 2 pairs at once, config 1; timed 2, 1, 8 refused
# for memory, 4) and a feed-forward kind, 2 calls a step, no whole program.
ATTN = 'ReversibleHalfResidualDecoderAttn (layer 9)'
FF = 'ReversibleHalfResidualDecoderFF (layer 11)'
NEW = {
  'rows_per_call': 2,
  'calls_per_step': 2,
  'flops_per_step': 4e9,
  'step_floor_seconds': 0.02,
  'configured_step_floor_seconds': 0.024,
  'best_step_floor_seconds': 0.012,
  'layer_floor_seconds': 0.02,
  'configured_layer_floor_seconds': 0.024,
  'best_layer_floor_seconds': 0.012,
  'whole_program_seconds': None,
  'whole_program_note': 'not tried',
  'kinds': [
    {
      'name': ATTN,
      'count': 2,
      'flops': 1e9,
      'seconds': 0.003,
      'temp_bytes': 0,
      'configured_seconds': 0.004,
      'best_seconds': 0.001,
      'best_parallel_heads': 4,
      'configured_parallel_heads': 1,
      'parallel_heads_seconds': [[2, 0.003], [1, 0.004], [8, None], [4, 0.001]],
      'attention': True,
    },
    {
      'name': FF,
      'count': 2,
      'flops': 1e8,
      'seconds': 0.002,
      'temp_bytes': 0,
      'configured_seconds': 0.002,
      'best_seconds': 0.002,
      'best_parallel_heads': None,
      'configured_parallel_heads': None,
      'parallel_heads_seconds': [],
      'attention': False,
    },
  ],
  'shares': [
    {
      'name': ATTN,
      'count': 2,
      'share_of_floor': 0.6,
      'tflops_per_second': 0.333,
      'seconds_per_step': 0.012,
      'attention': True,
      'configured_tflops_per_second': 0.25,
      'best_tflops_per_second': 1.0,
      'best_parallel_heads': 4,
      'configured_parallel_heads': 1,
    },
    {
      'name': FF,
      'count': 2,
      'share_of_floor': 0.4,
      'tflops_per_second': 0.05,
      'seconds_per_step': 0.008,
      'attention': False,
    },
  ],
  'parallel_heads': 2,
  'plan_is_configured': False,
}


def test_three_floors_and_the_step_against_each():
  rows = _rows(json.loads(json.dumps(NEW)))
  assert rows['step floor'] == (
    "0.02 s (each distinct layer's forward and gradient alone, 2 rows a "
    "call, x 2 calls, attention at the plan's 2 (example, head) pairs at "
    'once); the median step is 1.50x it'
  )
  assert rows['floor as configured'] == (
    f'0.024 s (layer by layer, attention {ATTN} 1 pair at once); the '
    'median step is 1.25x it'
  )
  assert rows['floor at best setting'] == (
    '0.012 s (layer by layer, each attention kind at its fastest setting '
    f"timed: {ATTN} 4 pairs at once, of 2 (the plan's), 1 (the config's), "
    '8 refused, 4); the median step is 2.50x it'
  )
  # Each kind's share of the floor and of the step, its rate; an attention
  # kind's also as configured and at its fastest, the other kind one.
  assert rows['floor by layer kind'] == (
    f'{ATTN} x 2: 60%, 40% of the step, 0.333 TFLOP/s (as configured 0.25, '
    f'fastest 1 at 4 pairs at once); {FF} x 2: 40%, 27% of the step, '
    '0.05 TFLOP/s'
  )
  assert rows['arithmetic'].startswith('0.004 TFLOP a step a device')
  # The rows in this order, between the planning and the checkpoint.
  names = list(rows)
  at = names.index('step floor')
  assert names[at : at + 5] == [
    'step floor',
    'floor as configured',
    'floor at best setting',
    'arithmetic',
    'floor by layer kind',
  ]


def test_without_a_median_step_no_ratios():
  rows = _rows(NEW, median=None)
  assert 'median step' not in rows['step floor']
  assert rows['floor as configured'].endswith('1 pair at once)')
  assert 'of the step' not in rows['floor by layer kind']


def test_a_plan_as_configured_and_the_best_as_one_program():
  """The plan keeps the config's pairs at once: the floor as configured is
  the step floor; the whole program, faster than the layers at their
  best, is the best floor as it is the plan's."""
  floor = copy.deepcopy(NEW)
  floor.update(
    parallel_heads=None,
    plan_is_configured=True,
    whole_program_seconds=0.01,
    step_floor_seconds=0.01,
    configured_step_floor_seconds=0.01,
    best_step_floor_seconds=0.01,
  )
  attention = floor['kinds'][0]
  attention['parallel_heads_seconds'] = [[1, 0.004], [8, 0.002], [4, 0.001]]
  rows = _rows(floor)
  assert rows['step floor'] == (
    "0.01 s (the model's forward and gradient as one program, attention as "
    'configured); the median step is 3.00x it'
  )
  assert rows['floor as configured'] == (
    "0.01 s, the step floor: the plan's attention pairs at once are the "
    "config's"
  )
  assert rows['floor at best setting'] == (
    "0.01 s = the step floor (the model as one program at the plan's "
    'setting, faster than layer by layer with each attention kind at its '
    'fastest setting '
    f"timed: {ATTN} 4 pairs at once, of 1 (the plan's and the config's), 8, "
    '4); the median step is 3.00x it'
  )


def test_the_config_refused_for_memory():
  floor = copy.deepcopy(NEW)
  floor['configured_step_floor_seconds'] = None
  floor['kinds'][0]['configured_seconds'] = None
  floor['shares'][0]['configured_tflops_per_second'] = None
  rows = _rows(floor)
  assert rows['floor as configured'] == (
    "not measured: the backend refused the config's pairs at once of "
    f'{ATTN} for memory'
  )
  assert '(as configured refused, fastest 1 at 4' in rows['floor by layer kind']


def test_a_model_without_attention_has_one_floor():
  floor = copy.deepcopy(NEW)
  floor['kinds'] = floor['kinds'][1:]
  floor['shares'] = [dict(floor['shares'][1], share_of_floor=1.0)]
  floor.update(
    parallel_heads=None,
    plan_is_configured=True,
    configured_step_floor_seconds=0.02,
    best_step_floor_seconds=0.02,
  )
  rows = _rows(floor)
  assert rows['step floor'].endswith('x 2 calls); the median step is 1.50x it')
  assert 'floor as configured' not in rows
  assert 'floor at best setting' not in rows
  assert rows['floor by layer kind'] == (
    f'{FF} x 2: 100%, 27% of the step, 0.05 TFLOP/s'
  )


# run_stats.json's `step_floor` as runs before the settings were timed
# wrote it: no configured or best figures, kinds and shares without them.
OLD = {
  'rows_per_call': 2,
  'calls_per_step': 2,
  'flops_per_step': 4e9,
  'step_floor_seconds': 0.02,
  'layer_floor_seconds': 0.02,
  'whole_program_seconds': None,
  'whole_program_note': 'not tried',
  'kinds': [
    {'name': ATTN, 'count': 2, 'flops': 1e9, 'seconds': 0.003, 'temp_bytes': 0},
    {'name': FF, 'count': 2, 'flops': 1e8, 'seconds': 0.002, 'temp_bytes': 0},
  ],
  'shares': [
    {
      'name': ATTN,
      'count': 2,
      'share_of_floor': 0.6,
      'tflops_per_second': 0.333,
    },
    {'name': FF, 'count': 2, 'share_of_floor': 0.4, 'tflops_per_second': 0.05},
  ],
  'parallel_heads': 2,
}


@pytest.mark.parametrize('parallel_heads', [2, None])
def test_an_older_run_stats_reads_as_before(parallel_heads):
  floor = dict(OLD, parallel_heads=parallel_heads)
  rows = _rows(floor)
  at_plan = (
    ''
    if parallel_heads is None
    else ", attention at the plan's 2 (example, head) pairs at once"
  )
  assert rows['step floor'] == (
    "0.02 s (each distinct layer's forward and gradient alone, 2 rows a "
    f'call, x 2 calls{at_plan}); the median step is 1.50x it'
  )
  assert 'floor as configured' not in rows
  assert 'floor at best setting' not in rows
  assert rows['floor by layer kind'] == (
    f'{ATTN} x 2: 60%, 0.333 TFLOP/s; {FF} x 2: 40%, 0.05 TFLOP/s'
  )


def test_the_oldest_run_stats_without_shares_or_plan():
  floor = {
    k: v for k, v in OLD.items() if k not in ('shares', 'parallel_heads')
  }
  rows = _rows(floor)
  assert rows['step floor'].endswith('x 2 calls); the median step is 1.50x it')
  assert 'floor by layer kind' not in rows
  assert rows['arithmetic'] == (
    "0.004 TFLOP a step a device (forward and gradient, XLA's count); "
    '0.133 TFLOP/s at the median step'
  )


def test_rows_of_a_measured_floor(monkeypatch):
  """The rows of `StepFloor.as_json` itself, through JSON: the figures
  the summary prints are the floor's."""
  from trax_revplus import step_floor  # pylint: disable=g-import-not-at-top

  attention = step_floor.LayerKind(
    ATTN,
    2,
    1e9,
    0.003,
    configured_seconds=0.004,
    best_seconds=0.001,
    best_parallel_heads=4,
    configured_parallel_heads=1,
    parallel_heads_seconds=((2, 0.003), (1, 0.004), (4, 0.001)),
  )
  ff = step_floor.LayerKind(FF, 2, 1e8, 0.002, 0, 0.002, 0.002)
  floor = step_floor.StepFloor(
    (attention, ff), 2, 2, parallel_heads=2, plan_is_configured=False
  )
  assert floor.seconds == pytest.approx(0.02)
  assert floor.configured_seconds == pytest.approx(0.024)
  assert floor.best_seconds == pytest.approx(0.012)
  rows = _rows(json.loads(json.dumps(floor.as_json())))
  assert rows['step floor'].startswith('0.02 s (')
  assert rows['floor as configured'].startswith('0.024 s (')
  assert rows['floor at best setting'].startswith('0.012 s (')
  assert rows['floor by layer kind'].startswith(
    f'{ATTN} x 2: 60%, 40% of the step, 0.333 TFLOP/s (as configured 0.25, '
    'fastest 1 at 4 pairs at once)'
  )
