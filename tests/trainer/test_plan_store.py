"""Plans kept in the run's output directory: a second run, or a resume,
does not plan again; a damaged or foreign file is ignored with a warning.

References: the planner's own search on a fresh trainer (what a kept plan
must equal), and trax's default `Trainer` for the values trained.
"""

import functools
import json
import os

import pytest

import trainer_cases as cases
from trax_revplus import notices
from trax_revplus.trainer._search import plan_store

pytestmark = pytest.mark.usefixtures('stock_trax')

_BATCH = cases.lm_batch()


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


def _trainer(output_dir, budget_bytes):
  return cases.lm_trainer(
    _BATCH, device_memory_budget_bytes=budget_bytes, output_dir=str(output_dir)
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
  cases.train(second, _BATCH, 3)
  assert accounted == [first.planned(_BATCH).plan]  # its own step's alone
  assert second.planned(_BATCH).plan == first.planned(_BATCH).plan
  ref_weights, ref_slots, _ = cases.lm_reference_3_steps()
  cases.assert_all_close(ref_weights, model.weights)
  cases.assert_all_close(ref_slots, second.slots)


def test_a_kept_plan_is_not_read_for_a_budget_outside_its_range(
  tmp_path, accounted
):
  _, first, _ = _first_run(tmp_path, accounted)
  # Room for the fastest plan: the kept answer is no longer the fastest.
  _, second = _trainer(tmp_path, 2**40)
  second.one_step(_BATCH, cases.RNGS[0])
  assert second.planned(_BATCH).plan != first.planned(_BATCH).plan
  assert second.planned(_BATCH).plan.fused_from == 0


@pytest.mark.parametrize('damage', ['garbage', 'digest', 'format'])
def test_a_damaged_file_is_one_warning_and_a_fresh_plan(
  tmp_path, accounted, damage
):
  told = []
  budget, first, searched = _first_run(tmp_path, accounted)
  path = tmp_path / plan_store.FILENAME
  data = json.loads(path.read_text())
  if damage == 'garbage':
    path.write_text('{"format": "%s", "plans": {' % plan_store.FORMAT)
  elif damage == 'digest':
    for entry in data['plans'].values():
      entry['plan']['batch_slices'] += 1
    path.write_text(json.dumps(data))
  else:
    data['format'] = 'something else'
    path.write_text(json.dumps(data))
  _, second = _trainer(tmp_path, budget)
  with notices.listening(told.append):
    second.one_step(_BATCH, cases.RNGS[0])
  assert len(accounted) == searched  # planned afresh
  assert second.planned(_BATCH).plan == first.planned(_BATCH).plan
  warnings = [m for m in told if 'stored plans' in m]
  assert len(warnings) == 1 and 'planning afresh' in warnings[0]
  # The fresh plan is kept again, intact.
  assert plan_store.PlanStore(str(tmp_path)).load(
    next(iter(json.loads(path.read_text())['plans'])),
    budget,
    _where(second),
  ) == (first.planned(_BATCH).plan)


def test_a_plan_planned_elsewhere_is_one_line_and_a_fresh_plan(
  tmp_path, accounted
):
  """Another JAX (or trax, or device) planned the stored entry: it is not
  used, one line says what differs, and the run plans afresh."""
  budget, first, searched = _first_run(tmp_path, accounted)
  path = tmp_path / plan_store.FILENAME
  data = json.loads(path.read_text())
  for entry in data['plans'].values():
    entry['environment']['jax'] = '0.0.1'
    entry['sha256'] = plan_store._digest(entry)  # pylint: disable=protected-access
  path.write_text(json.dumps(data))
  told = []
  _, second = _trainer(tmp_path, budget)
  with notices.listening(told.append):
    second.one_step(_BATCH, cases.RNGS[0])
  assert len(accounted) == searched  # planned afresh
  assert second.planned(_BATCH).plan == first.planned(_BATCH).plan
  [line] = told
  assert 'planned elsewhere: jax ' in line and "'0.0.1' (this run: " in line
  assert line.endswith('planning afresh')


def test_plans_of_another_config_are_one_line(tmp_path, accounted):
  budget, _, _ = _first_run(tmp_path, accounted)
  told = []
  _, second = cases.lm_trainer(
    _BATCH,
    device_memory_budget_bytes=budget,
    output_dir=str(tmp_path),
    segment_max_bytes=2**20,  # another setting: another config
  )
  with notices.listening(told.append):
    second.one_step(_BATCH, cases.RNGS[0])
  assert len(told) == 1 and 'of another config' in told[0]


def test_the_compilation_caches_plans_serve_every_output_dir(
  tmp_path, accounted
):
  """With the compilation cache on, a chosen plan is kept there too: a run
  of the same config into another output directory plans nothing."""
  from trax_revplus import compilation_cache  # pylint: disable=g-import-not-at-top

  with compilation_cache.enabled(str(tmp_path / 'cache')):
    budget, first, searched = _first_run(tmp_path / 'one', accounted)
    assert searched > 1
    assert (tmp_path / 'cache' / plan_store.FILENAME).exists()
    _, second = _trainer(tmp_path / 'two', budget)
    second.one_step(_BATCH, cases.RNGS[0])
  assert accounted == [first.planned(_BATCH).plan]
  assert (tmp_path / 'two' / plan_store.FILENAME).exists()
