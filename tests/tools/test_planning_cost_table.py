"""tools/planning_cost.py and tools/accelerator_targets.py: the tables they
make from the planner's own figures say which targets hold, and a command's
first step is timed from the command's start."""

import json

from tools import accelerator_targets
from tools import planning_cost


def _cost(seconds, plan_seconds, programs=1, plan_programs=1):
  return {
    'seconds': seconds,
    'plan_compile_seconds': plan_seconds,
    'search_seconds': seconds - plan_seconds,
    'programs_compiled': programs,
    'plan_programs': plan_programs,
    'plan': 'whole model in one program, 1 batch slice',
  }


def test_the_table_marks_each_target(tmp_path):
  parts = {
    'bench': {
      'l12': {'costs': [_cost(16.0, 15.0)]},
      'l48': {'costs': [_cost(24.0, 12.0, 6, 5)]},
    },
    'configs': {
      'quick': {
        'estimate_seconds': 10.0,
        'train_seconds': 20.0,
        'train_planning': _cost(4.0, 3.0),
      },
      'slow': {
        'estimate_seconds': 30.0,
        'train_seconds': 20.0,
        'estimate_planning': _cost(9.0, 3.0, 4, 1),
      },
    },
  }
  for part, figures in parts.items():
    (tmp_path / f'{part}.json').write_text(json.dumps(figures))
  table = planning_cost.render(str(tmp_path))
  rows = {}
  for line in table.splitlines():  # the first table's row of each name
    rows.setdefault(line.split(' | ')[0].strip('| '), line)
  assert '0.07 (met)' in rows['bench l12']
  assert '1.00 (missed)' in rows['bench l48'] and '6 / 5' in rows['bench l48']
  assert '0.33 (met)' in rows['quick']
  assert '2.00 (missed)' in rows['slow']  # the estimate's, where no train's
  assert '1.50 (missed, target <= 1.3)' in rows['l48 / l12']
  assert '| quick | 10.0 | 20.0 | met |' in table
  assert '| slow | 30.0 | 20.0 | missed |' in table


def test_a_run_s_first_step_is_timed_from_its_start(tmp_path):
  result = accelerator_targets._run(  # pylint: disable=protected-access
    'x',
    ['bash', '-c', 'echo hello; sleep 0.3; echo "step 1/3  loss 1.0"'],
    str(tmp_path),
    30,
  )
  assert result['exit'] == 0
  assert 0.2 < result['first_step_seconds_from_start'] < 10
  log = (tmp_path / 'x.log').read_text().splitlines()
  assert log[1].endswith('hello') and log[1].startswith('[')
  assert result['tail'][-1] == 'step 1/3  loss 1.0'
  timed_out = accelerator_targets._run(  # pylint: disable=protected-access
    'y', ['sleep', '5'], str(tmp_path), 0.5
  )
  assert timed_out['exit'] == 'timeout'


def test_the_first_step_is_read_as_run_stats_json_writes_it(tmp_path):
  # A run_stats.json written by the run's own writer: two steps, the
  # first (compiling) 12.5 s.
  from trax_revplus.progress import run_stats  # pylint: disable=g-import-not-at-top

  stats = run_stats.StepFigures([])
  stats.end_step(1, 2.0, 12.5, 3)
  stats.end_step(2, 1.5, 0.25, 0)
  stats.write(str(tmp_path))
  assert accelerator_targets.first_step_seconds(str(tmp_path)) == 12.5
  assert accelerator_targets.first_step_seconds(str(tmp_path / 'none')) is None


def test_the_arithmetic_table_names_the_layer_kinds(tmp_path):
  run = {
    'median_step_seconds': 12.0,
    'over_floor': 1.2,
    'tflops_per_second': 16.0,
    'step_floor': {'step_floor_seconds': 10.0, 'parallel_heads': None},
    'profile': {'transfer_wait_fraction': 0.014},
  }
  run['step_floor']['shares'] = [
    {
      'name': 'Attn (layer 9)',
      'count': 9,
      'share_of_floor': 0.55,
      'tflops_per_second': 5.6,
    },
  ]
  (tmp_path / 'arithmetic.json').write_text(json.dumps({'enwik8_ours': run}))
  table = accelerator_targets.render(str(tmp_path))
  # A run measured before the floor timed attention settings: '-' as
  # configured and at the best setting.
  assert (
    '| enwik8_ours | 12 s | - | 10 s (as configured) | - | - / 1.2 / - | 16 '
    '| 1.4% | Attn (layer 9) x 9: 55%, 5.6 |'
  ) in table


def test_the_arithmetic_table_has_the_three_floors(tmp_path):
  """A run's floor as configured, at the plan's setting and at the best
  setting, the median step over each, and an attention kind's best rate
  with its pairs at once, from run_stats.json's `step_floor` as the
  arithmetic part keeps it."""
  floor = {
    'step_floor_seconds': 10.0,
    'configured_step_floor_seconds': 24.0,
    'best_step_floor_seconds': 8.0,
    'parallel_heads': 8,
    'shares': [
      {
        'name': 'Attn (layer 9)',
        'count': 9,
        'share_of_floor': 0.55,
        'tflops_per_second': 5.6,
        'attention': True,
        'best_tflops_per_second': 11.2,
        'best_parallel_heads': 32,
      },
      {
        'name': 'FF (layer 10)',
        'count': 12,
        'share_of_floor': 0.45,
        'tflops_per_second': 107.0,
        'attention': False,
      },
    ],
  }
  run = {
    'median_step_seconds': 12.0,
    'step_floor': floor,
    'tflops_per_second': 16.0,
    'profile': {'transfer_wait_fraction': 0.014},
  }
  (tmp_path / 'arithmetic.json').write_text(json.dumps({'enwik8_ours': run}))
  table = accelerator_targets.render(str(tmp_path))
  lines = table.splitlines()
  assert lines[0].startswith(
    '| model, trainer | median step | floor as configured | floor at the '
    "plan's setting (attention pairs at once) | floor at the best setting "
    "| step / floor: configured / plan's / best |"
  )
  assert lines[0].count('|') == lines[1].count('|')
  assert lines[2] == (
    '| enwik8_ours | 12 s | 24 s | 10 s (8) | 8 s | 0.5 / 1.2 / 1.5 | 16 | '
    '1.4% | Attn (layer 9) x 9: 55%, 5.6 (best 11.2 at 32); '
    'FF (layer 10) x 12: 45%, 107 |'
  )
  assert lines[2].count('|') == lines[0].count('|')
