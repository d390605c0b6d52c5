"""`train` and `estimate` of one config share one stored plan: whichever
runs second reads back the plan the first chose (the compilation cache's
plans.json) and says so in one line, with no planning search.

References: the first command's own search (its lines and its planning
figures: more programs compiled than its plan's own), which the second
must not repeat: it compiles its plan's programs alone. Each test runs
two commands (about a minute): marked slow. The planner's own tests
(tests/trainer/test_plan_store.py) check that the settings the two commands
set differently share a key.
"""

import json

import pytest

from cli_cases import MAIN
from cli_cases import TINY_MODEL
from trax_revplus import cli

# The tiny main job, one step, under a device memory budget the fastest
# plan does not fit: planning searches.
_BUDGET = 300000
_TINY = [
  'train.steps = 1',
  'train.eval_frequency = 1',
  'sequence_length = 32',
] + TINY_MODEL
# Lines of a planning search beyond weighing the chosen plan.
_SEARCH = ('ruled out', 'compiled the program of its largest call first')


def _main(capsys, command, *flags):
  code = cli.main(
    [
      'trax-revplus',
      command,
      f'--config_file={MAIN}',
      *[f'--config={b}' for b in _TINY],
      *flags,
    ]
  )
  out, err = capsys.readouterr()
  import trax_revplus  # pylint: disable=g-import-not-at-top

  trax_revplus.deactivate()
  assert code == 0, err[-3000:]
  assert 'Traceback' not in err
  return out, err


def _train(capsys, tmp_path):
  """`train` into `tmp_path / 'run'`: (its output, its planning figures)."""
  out, err = _main(
    capsys,
    'train',
    f'--output_dir={tmp_path / "run"}',
    f'--compilation_cache_dir={tmp_path / "cache"}',
    '--config=trax_revplus.ReversibleSerialTrainer.'
    f'device_memory_budget_bytes = {_BUDGET}',
  )
  stats = json.loads((tmp_path / 'run' / 'run_stats.json').read_text())
  [planning] = stats['planning']
  return out + err, planning


def _estimate(capsys, tmp_path):
  """`estimate` (its JSON in `tmp_path`): (its output, its planning
  figures)."""
  path = tmp_path / 'estimate.json'
  out, err = _main(
    capsys,
    'estimate',
    f'--device_memory={_BUDGET}',
    f'--compilation_cache_dir={tmp_path / "cache"}',
    f'--json={path}',
  )
  data = json.loads(path.read_text())
  return out + err, data['trainers']['revplus']['planning']


def _searched(output, planning):
  """Checks that a run planned afresh, with a search."""
  assert '(the plan kept in ' not in output
  assert any(words in output for words in _SEARCH), output
  assert planning['programs_compiled'] > planning['plan_programs']


def _reused(output, planning, tmp_path):
  """Checks that a run read its plan back and says so in one line."""
  store = tmp_path / 'cache' / 'plans.json'
  [line] = [
    line for line in output.splitlines() if line.startswith('planned in ')
  ]
  assert f'(the plan kept in {store})' in line
  for words in _SEARCH + ('stored plan', 'planning afresh'):
    assert words not in output, output
  # Its own plan's programs compiled, and nothing else.
  assert planning['programs_compiled'] == planning['plan_programs']


@pytest.mark.slow
def test_estimate_after_train_reuses_the_plan_train_stored(tmp_path, capsys):
  output, planning = _train(capsys, tmp_path)
  _searched(output, planning)
  output, planning = _estimate(capsys, tmp_path)
  _reused(output, planning, tmp_path)


@pytest.mark.slow
def test_train_after_estimate_reuses_the_plan_estimate_stored(tmp_path, capsys):
  output, planning = _estimate(capsys, tmp_path)
  _searched(output, planning)
  output, planning = _train(capsys, tmp_path)
  _reused(output, planning, tmp_path)
  # The run's output directory keeps the plan too, the record of its plans.
  assert (tmp_path / 'run' / 'plans.json').exists()
