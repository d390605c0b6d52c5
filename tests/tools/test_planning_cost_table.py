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
