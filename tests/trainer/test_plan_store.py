"""Stored plans: a second run, a resume, or another command of the same
config does not plan again; a stored plan that does not apply, and a file
that cannot be used, are one line each naming why, and the run plans
afresh.

References: the planner's own search on a fresh trainer (what a stored plan
must equal), trax's default `Trainer` for the values trained, and a run of
the same config on 2 forced CPU devices in a process of its own.
"""

import functools
import json
import os
import re
import subprocess
import sys

import pytest

import trainer_cases as cases
from trax_revplus import notices
from trax_revplus.trainer._search import plan_store

pytestmark = pytest.mark.usefixtures('stock_trax')

_BATCH = cases.lm_batch()
_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def accounted(monkeypatch):
  """The plans `Planner.account` compiles and accounts, in order."""
  return cases.count_accounted(monkeypatch)


@functools.lru_cache(maxsize=1)
def _budget():
  """A budget one byte under the fastest candidate's peak: the search
  accounts more than one plan."""
  _, trainer = cases.lm_trainer(_BATCH, device_memory_budget_bytes=None)
  p = trainer.planner
  types = p.step_types(_BATCH)
  fastest = next(iter(p.candidates(types).groups())).plans[0]
  return p.weigh(fastest, types).peak_device_bytes - 1


def _where(trainer):
  """`plan_store.environment` of `trainer`'s run."""
  p = trainer._placement  # pylint: disable=protected-access
  return plan_store.environment(
    p.platform, p.devices[0].device_kind, p.n_devices
  )


def _trainer(output_dir, budget_bytes, **settings):
  return cases.lm_trainer(
    _BATCH,
    device_memory_budget_bytes=budget_bytes,
    output_dir=str(output_dir),
    **settings,
  )


def _first_run(output_dir, accounted):
  """One step under `_budget()` in `output_dir`: (budget, trainer, plans
  its planning accounted); `accounted` is emptied after."""
  budget = _budget()
  del accounted[:]
  _, first = _trainer(output_dir, budget)
  first.one_step(_BATCH, cases.RNGS[0])
  searched = len(accounted)
  del accounted[:]
  return budget, first, searched


# A progress line of the search itself (`planning_log`): 'planning: 1.2 s
# <plan>: ...'.
_SEARCH_LINE = re.compile(r'planning: \d+\.\d s  ')


def _step_lines(trainer, batch=_BATCH, n_steps=1):
  """`n_steps` steps of `trainer` (`cases.train`): (what it said of stored
  plans: its warnings and its progress lines but the search's own, its
  `planned in` line)."""
  told, progress = [], []
  with (
    notices.listening(told.append),
    notices.showing_progress(progress.append),
  ):
    cases.train(trainer, batch, n_steps)
  [planned] = [line for line in progress if line.startswith('planned in ')]
  said = told + [
    line
    for line in progress
    if not _SEARCH_LINE.match(line) and not line.startswith('planned in ')
  ]
  return said, planned


def _rekeyed(path, change):
  """Rewrites the plans file at `path` with `change(entry)` applied to each
  entry, each keyed again (`plan_key` of its config and environment) as
  the run that planned it would have keyed it."""
  data = json.loads(path.read_text())
  plans = {}
  for entry in data['plans'].values():
    change(entry)
    entry['sha256'] = plan_store._digest(entry)  # pylint: disable=protected-access
    key = plan_store.plan_key(entry['config'], entry['environment'])
    plans[f'{key}/{entry["peak_device_bytes"]}'] = entry
  data['plans'] = plans
  path.write_text(json.dumps(data))


def test_a_plan_round_trips_through_json():
  _, trainer = cases.lm_trainer(_BATCH, device_memory_budget_bytes=None)
  p = trainer.planner
  for group in p.candidates(p.step_types(_BATCH)).groups():
    for plan in group.plans:
      data = json.loads(json.dumps(plan_store.plan_to_json(plan)))
      assert plan_store.plan_from_json(data) == plan


def test_a_second_run_reads_its_plan_back_and_trains_the_same(
  tmp_path, accounted
):
  budget, first, searched = _first_run(tmp_path, accounted)
  assert searched > 1  # the fastest plan was excluded
  assert os.path.exists(tmp_path / plan_store.FILENAME)
  model, second = _trainer(tmp_path, budget)
  said, planned = _step_lines(second, n_steps=3)
  assert accounted == [first.planned(_BATCH).plan]  # its own step's alone
  assert second.planned(_BATCH).plan == first.planned(_BATCH).plan
  assert not said
  assert f'(the plan kept in {tmp_path / plan_store.FILENAME})' in planned
  ref_weights, ref_slots, _ = cases.lm_reference_3_steps()
  cases.assert_all_close(ref_weights, model.weights)
  cases.assert_all_close(ref_slots, second.slots)


def test_settings_that_only_decide_the_log_share_the_plan(tmp_path, accounted):
  """`estimate` builds its trainer without TensorBoard or an output
  directory, `train --memory_log_every_n_steps` sets the log's steps: the
  plan is the same, and so is its key."""
  budget, first, _ = _first_run(tmp_path / 'run', accounted)
  _, second = _trainer(
    tmp_path / 'run',
    budget,
    memory_log_tensorboard=False,
    memory_log_every_n_steps=7,
    memory_log_per_layer=True,
  )
  said, planned = _step_lines(second)
  assert not said and '(the plan kept in ' in planned
  assert accounted == [first.planned(_BATCH).plan]


def test_each_range_of_budgets_keeps_its_plan(tmp_path, accounted):
  budget, first, _ = _first_run(tmp_path, accounted)
  # Room for the fastest plan: the stored answer is no longer the fastest.
  _, second = _trainer(tmp_path, 2**40)
  said, planned = _step_lines(second)
  assert second.planned(_BATCH).plan != first.planned(_BATCH).plan
  assert second.planned(_BATCH).plan.fused_from == 0
  [line] = said
  path = tmp_path / plan_store.FILENAME
  assert line.startswith(
    f'planning: the plan stored in {path} for this config answers budgets from '
  )
  assert line.endswith('; planning afresh') and ' not this run' in line
  assert '(the plan kept in' not in planned
  # Both plans are kept: the first budget's is read back.
  assert len(json.loads(path.read_text())['plans']) == 2
  del accounted[:]
  _, third = _trainer(tmp_path, budget)
  said, planned = _step_lines(third)
  assert not said and '(the plan kept in ' in planned
  assert accounted == [first.planned(_BATCH).plan]


@pytest.mark.parametrize(
  'damage', ['garbage', 'digest', 'format', 'no plans', 'not an entry']
)
def test_a_damaged_file_is_one_warning_and_a_fresh_plan(
  tmp_path, accounted, damage
):
  budget, first, searched = _first_run(tmp_path, accounted)
  path = tmp_path / plan_store.FILENAME
  data = json.loads(path.read_text())
  if damage == 'garbage':
    path.write_text('{"format": "%s", "plans": {' % plan_store.FORMAT)
    why = f'stored plans {path} ignored (not JSON: '
  elif damage == 'digest':
    for entry in data['plans'].values():
      entry['plan']['batch_slices'] += 1
    path.write_text(json.dumps(data))
    why = (
      f'the plan stored in {path} for this config is damaged (its digest '
      f'does not match its content); planning afresh'
    )
  elif damage == 'format':
    data['format'] = 'something else'
    path.write_text(json.dumps(data))
    why = (
      f'stored plans {path} ignored (not a plans file of this version: '
      f"'something else', this version reads '{plan_store.FORMAT}'); "
      f'planning afresh (a plan chosen now replaces the file)'
    )
  else:
    # This version's format, its plans damaged: a list, or an entry that
    # is not one.
    data['plans'] = [] if damage == 'no plans' else {'x': 1}
    path.write_text(json.dumps(data))
    why = (
      f'stored plans {path} ignored (damaged: its plans are not a mapping '
      f'of plan entries); planning afresh (a plan chosen now replaces the '
      f'file)'
    )
  _, second = _trainer(tmp_path, budget)
  said, planned = _step_lines(second)
  assert len(accounted) == searched  # planned afresh
  assert second.planned(_BATCH).plan == first.planned(_BATCH).plan
  [line] = said
  assert line.startswith(why) and 'planning afresh' in line
  assert '(the plan kept in' not in planned
  # The fresh plan is kept again, intact.
  [entry] = json.loads(path.read_text())['plans'].values()
  config, where = entry['config'], _where(second)
  stored = plan_store.PlanStore(str(tmp_path)).lookup(
    plan_store.plan_key(config, where), config, where, budget
  )
  assert stored.plan == first.planned(_BATCH).plan


def test_a_plan_planned_elsewhere_is_one_line_and_a_fresh_plan(
  tmp_path, accounted
):
  """Another JAX (or trax, or device) planned the stored entry: it is not
  used, one line says what differs, and the run plans afresh."""
  budget, first, searched = _first_run(tmp_path, accounted)
  path = tmp_path / plan_store.FILENAME

  def other_jax(entry):
    entry['environment']['jax'] = '0.0.1'

  _rekeyed(path, other_jax)
  _, second = _trainer(tmp_path, budget)
  said, _ = _step_lines(second)
  assert len(accounted) == searched  # planned afresh
  assert second.planned(_BATCH).plan == first.planned(_BATCH).plan
  jax_version = _where(second)['jax']
  assert said == [
    f'planning: the plan stored in {path} for this model was planned for '
    f'jax 0.0.1 (this run: {jax_version}); planning afresh'
  ]


def test_plans_of_another_config_name_what_differs(tmp_path, accounted):
  budget, _, _ = _first_run(tmp_path, accounted)
  path = tmp_path / plan_store.FILENAME
  _, second = _trainer(tmp_path, budget, segment_max_bytes=2**20)
  said, _ = _step_lines(second)
  assert said == [
    f'planning: the plan stored in {path} for this model was planned for '
    f'trainer settings segment_max_bytes=33554432 (this run: 1048576); '
    f'planning afresh'
  ]
  # Another batch's shapes.
  batch = cases.lm_batch(rows=8)
  _, third = cases.lm_trainer(
    batch, device_memory_budget_bytes=budget, output_dir=str(tmp_path)
  )
  said, _ = _step_lines(third, batch)
  assert said == [
    f'planning: the plan stored in {path} for this model was planned for '
    f'batch int32[4, 6], int32[4, 6], float32[4, 6] (this run: int32[8, 6], '
    f'int32[8, 6], float32[8, 6]); planning afresh'
  ]


def test_plans_of_another_model_are_one_line(tmp_path, accounted):
  budget, _, searched = _first_run(tmp_path, accounted)
  path = tmp_path / plan_store.FILENAME

  def other_model(entry):
    entry['config']['model'] = '0' * 64

  _rekeyed(path, other_model)
  _, second = _trainer(tmp_path, budget)
  said, _ = _step_lines(second)
  assert len(accounted) == searched
  assert said == [
    f'planning: no plan stored in {path} is for this model (its layers or '
    f"their weights' shapes differ from those of the 1 stored plan); "
    f'planning afresh'
  ]


_TWO_DEVICES = """
import sys
sys.path[:0] = sys.argv[3:]
import trainer_cases as cases
_, trainer = cases.lm_trainer(
    cases.lm_batch(), device_memory_budget_bytes=int(sys.argv[2]),
    output_dir=sys.argv[1], n_devices=2)
trainer.one_step(cases.lm_batch(), cases.RNGS[0])
print(trainer.placement.n_devices)
"""


def test_a_plan_of_another_device_count_is_one_line_naming_it(
  tmp_path, accounted
):
  """A run on 2 devices (a process of its own: the device count is fixed
  when JAX starts) kept its plan; the same config on this process's one
  device says so and plans afresh."""
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  env['XLA_FLAGS'] = (
    env.get('XLA_FLAGS', '') + ' --xla_force_host_platform_device_count=2'
  ).strip()
  proc = subprocess.run(
    [
      sys.executable,
      '-c',
      _TWO_DEVICES,
      str(tmp_path),
      str(2**40),
      _TESTS,
      os.path.join(_TESTS, 'trainer'),
    ],
    env=env,
    capture_output=True,
    text=True,
    check=False,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.split()[-1] == '2'
  path = tmp_path / plan_store.FILENAME
  [entry] = json.loads(path.read_text())['plans'].values()
  assert entry['environment']['n_devices'] == 2
  del accounted[:]
  _, second = _trainer(tmp_path, 2**40)
  said, planned = _step_lines(second)
  assert accounted  # planned afresh
  assert said == [
    f'planning: the plan stored in {path} for this model was planned for '
    f'2 devices (this run: 1); planning afresh'
  ]
  assert '(the plan kept in' not in planned
  # Both are kept: each device count reads its own back.
  assert len(json.loads(path.read_text())['plans']) == 2


def test_a_directory_in_place_of_the_store_is_one_line(tmp_path, accounted):
  budget = _budget()
  path = tmp_path / plan_store.FILENAME
  path.mkdir()
  _, trainer = _trainer(tmp_path, budget)
  said, planned = _step_lines(trainer)
  assert said == [
    f'stored plans {path} could not be read (it is a directory): no plan '
    f'is read from it or kept in it; planning afresh'
  ]
  assert '(the plan kept in' not in planned
  assert path.is_dir() and not os.listdir(path)
  assert [p for p in os.listdir(tmp_path) if p.startswith('.')] == []


def test_a_fifo_in_place_of_the_store_is_one_line(tmp_path, accounted):
  # Read, a FIFO would block the run for good.
  budget = _budget()
  path = tmp_path / plan_store.FILENAME
  os.mkfifo(path)
  _, trainer = _trainer(tmp_path, budget)
  said, planned = _step_lines(trainer)
  assert said == [
    f'stored plans {path} could not be read (it is not a regular file): '
    f'no plan is read from it or kept in it; planning afresh'
  ]
  assert '(the plan kept in' not in planned


def _with_cache(cache_dir):
  from trax_revplus import compilation_cache  # pylint: disable=g-import-not-at-top

  return compilation_cache.enabled(str(cache_dir))


def test_the_compilation_caches_plans_serve_every_output_dir(
  tmp_path, accounted
):
  """With the compilation cache on, a chosen plan is kept there: a run of
  the same config into another output directory plans nothing, and keeps
  the plan in its own directory too (the record of its plans)."""
  with _with_cache(tmp_path / 'cache'):
    budget, first, searched = _first_run(tmp_path / 'one', accounted)
    assert searched > 1
    assert (tmp_path / 'cache' / plan_store.FILENAME).exists()
    _, second = _trainer(tmp_path / 'two', budget)
    said, planned = _step_lines(second)
  assert accounted == [first.planned(_BATCH).plan]
  assert not said
  assert f'(the plan kept in {tmp_path / "cache" / plan_store.FILENAME})' in (
    planned
  )
  assert (tmp_path / 'two' / plan_store.FILENAME).exists()


def test_one_store_is_read_and_what_is_said_of_it_is_true(tmp_path, accounted):
  """With the cache on, its plans are the ones read: an output directory's
  damaged record is not read (and is rewritten), a damaged cache store is
  one line, and the run then plans afresh rather than read a plan from
  elsewhere; a record that cannot be written is one line naming it."""
  cache = tmp_path / 'cache' / plan_store.FILENAME
  record = tmp_path / 'run' / plan_store.FILENAME
  with _with_cache(tmp_path / 'cache'):
    budget, first, searched = _first_run(tmp_path / 'run', accounted)
    record.write_text('{')
    _, second = _trainer(tmp_path / 'run', budget)
    said, planned = _step_lines(second)
    assert not said and f'(the plan kept in {cache})' in planned
    assert len(json.loads(record.read_text())['plans']) == 1
    del accounted[:]
    cache.write_text('{')
    _, third = _trainer(tmp_path / 'run', budget)
    said, planned = _step_lines(third)
    assert len(accounted) == searched  # planned afresh
    [line] = said
    assert line.startswith(f'stored plans {cache} ignored (not JSON: ')
    assert '(the plan kept in' not in planned
    assert third.planned(_BATCH).plan == first.planned(_BATCH).plan
    record.unlink()
    record.mkdir()
    _, fourth = _trainer(tmp_path / 'run', budget)
    said, planned = _step_lines(fourth)
  assert said == [f'could not keep the plan in {record} (it is a directory)']
  assert f'(the plan kept in {cache})' in planned


def test_a_stored_plan_over_this_runs_host_budget_is_one_line(
  tmp_path, accounted
):
  """The host budget is not part of the key (the host's memory changes
  from run to run): a stored plan over this run's is weighed, not run, and
  one line says why before the run plans afresh."""
  from trax_revplus.trainer import HostMemoryBudgetError  # pylint: disable=g-import-not-at-top

  budget, first, _ = _first_run(tmp_path, accounted)
  host = first.planned(_BATCH).memory.peak_host_bytes
  _, second = _trainer(tmp_path, budget, host_memory_budget_bytes=host - 1)
  told, progress = [], []
  with (
    notices.listening(told.append),
    notices.showing_progress(progress.append),
  ):
    try:
      second.one_step(_BATCH, cases.RNGS[0])
    except HostMemoryBudgetError:
      pass  # no other plan fits both budgets: the search says so
  said = told + [line for line in progress if not _SEARCH_LINE.match(line)]
  path = tmp_path / plan_store.FILENAME
  assert said[0] == (
    f'planning: the plan stored in {path} for this config does not fit this '
    f'run (it needs {host} bytes of host memory, over the host budget of '
    f'{host - 1} bytes); planning afresh'
  )
  assert not any('(the plan kept in' in line for line in said)
