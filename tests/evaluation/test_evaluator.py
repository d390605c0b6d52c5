"""Evals of a memory-efficient `training.Loop` on the trainer's device.

Reference: stock trax's eval as its memory-efficient `Loop` runs it (the
eval model's `model_with_metrics`, jitted on the host's CPU device by
`_accelerate_model_with_metrics(..., 0)`), on the same weights, state,
batch and RNG (`eval_cases.stock`), on a tiny LSH ReformerLM (per-row layer
state) and a batch whose loss weights differ between rows. On 2 devices:
tests/evaluation/eval_worker.py.
"""

import logging
import os

import jax
import numpy as np
import pytest
from trax.layers import acceleration

import eval_cases as cases
from conftest import run_multidevice_worker
import trax_revplus
from trax_revplus import evaluation
from trax_revplus.evaluation import evaluator as evaluator_lib
from trax_revplus.evaluation import planning

pytestmark = pytest.mark.usefixtures('stock_trax_and_empty_gin')

EVAL_WORKER = os.path.join(os.path.dirname(__file__), 'eval_worker.py')


def _assert_close(ours, stock):
  np.testing.assert_allclose(ours, stock, rtol=1e-5, atol=1e-7)


def _plan(loop):
  return cases.evaluator(loop).metrics_fn.planned(*cases.arguments(loop)).plan


def test_one_part_gives_stock_cpu_evals_metrics(tmp_path):
  loop = cases.loop(str(tmp_path))
  trainer = loop._trainer_per_task[0]  # pylint: disable=protected-access
  metrics_fn = cases.evaluator(loop).metrics_fn
  assert isinstance(metrics_fn, evaluation.DeviceEvaluator)
  # The trainer's budget ('auto': on the CPU what the host can give) and
  # its first device.
  assert metrics_fn.budget_bytes == trainer.planner.budget_bytes
  assert metrics_fn.budget_bytes is not None
  assert metrics_fn.device == trainer.placement.devices[0]
  ours = cases.ours(loop)
  assert _plan(loop).parts == 1
  _assert_close(ours, cases.stock(loop))


def test_parts_under_a_small_budget_give_stock_cpu_evals_metrics(tmp_path):
  whole = _plan(cases.loop(str(tmp_path / 'whole')))
  loop = cases.loop(str(tmp_path / 'parts'),
                    budget_bytes=whole.peak_device_bytes - 1)
  ours = cases.ours(loop)
  plan = _plan(loop)
  assert plan.parts > 1
  assert plan.peak_device_bytes < whole.peak_device_bytes
  _assert_close(ours, cases.stock(loop))
  # Averaging the parts' metrics would not: the rows' loss weights differ.
  assert np.abs(cases.mean_of_parts(loop, plan.parts) -
                cases.mean_of_parts(loop, 1)).max() > 1e-3


def test_a_budget_not_even_one_row_fits_is_one_line(tmp_path):
  loop = cases.loop(str(tmp_path), budget_bytes=1000)
  with pytest.raises(evaluation.EvalMemoryBudgetError) as raised:
    cases.ours(loop)
  message = str(raised.value)
  assert '\n' not in message
  least = int(message.split('device_memory_budget_bytes >= ')[1].split(',')[0])
  assert least > 1000
  assert ('the eval of a batch of 8 rows does not fit '
          'device_memory_budget_bytes=1000 bytes') in message
  # The least it names fits.
  loop = cases.loop(str(tmp_path / 'least'), budget_bytes=least)
  _assert_close(cases.ours(loop), cases.stock(loop))
  assert _plan(loop).peak_device_bytes <= least


def test_eval_runs_on_the_trainers_device_not_through_the_cpu_jit(
    tmp_path, monkeypatch):
  """trax's memory-efficient Loop compiles its evals with
  `_accelerate(f, 0)` (jit on the host's CPU device); ours places the
  eval's arguments on the trainer's first device, committed."""
  trax_revplus.activate()
  accelerated = []
  accelerate = acceleration._accelerate  # pylint: disable=protected-access

  def counting(f, n_devices):
    accelerated.append(n_devices)
    return accelerate(f, n_devices)
  monkeypatch.setattr(acceleration, '_accelerate', counting)
  arguments = []
  planned = evaluator_lib.DeviceEvaluator.planned

  def watching(self, *args):
    found = planned(self, *args)

    def fn(*placed):
      arguments.extend((x.committed, x.sharding)
                       for x in jax.tree_util.tree_leaves(placed))
      return found.fn(*placed)
    return found._replace(fn=fn)
  monkeypatch.setattr(evaluator_lib.DeviceEvaluator, 'planned', watching)
  loop = cases.loop(str(tmp_path))
  loop.run_evals()
  assert 0 not in accelerated
  device = loop._trainer_per_task[0].placement.devices[0]  # pylint: disable=protected-access
  assert arguments
  assert all(committed and sharding == jax.sharding.SingleDeviceSharding(
      device) for committed, sharding in arguments)
  assert loop.history.get('eval', 'metrics/WeightedCategoryCrossEntropy')


def test_an_eval_is_planned_and_compiled_once_per_batch_shape(
    tmp_path, monkeypatch, caplog):
  events = []

  def listener(name, *unused_args, **unused_kwargs):
    if name in ('/jax/core/compile/jaxpr_trace_duration',
                '/jax/core/compile/backend_compile_duration'):
      events.append(name)
  jax.monitoring.register_event_duration_secs_listener(listener)
  plans = []
  plan_parts = planning.plan_parts

  def counting(rows, weigh, budget_bytes):
    plans.append(rows)
    return plan_parts(rows, weigh, budget_bytes)
  monkeypatch.setattr(planning, 'plan_parts', counting)
  loop = cases.loop(str(tmp_path))
  caplog.set_level(logging.INFO)
  try:
    first = cases.ours(loop)
    start = len(events)
    second = cases.ours(loop)
    assert events[start:] == []
    np.testing.assert_array_equal(first, second)
    cases.ours(loop, batch=cases.eval_batch(rows=4))
    cases.ours(loop, batch=cases.eval_batch(rows=4))
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  assert plans == [8, 4]
  lines = [r.getMessage() for r in caplog.records
           if 'eval device memory plan' in r.getMessage()]
  assert len(lines) == 2, lines
  assert 'the model on all 8 rows, then the metrics; peak' in lines[0]


def test_two_devices_evaluate_on_the_first_as_stock_on_the_cpu():
  result = run_multidevice_worker(2, script=EVAL_WORKER)
  assert result['local_devices'] == 2
  assert result['trainer_devices'] == 2
  assert result['eval_device'] == result['first_trainer_device']
  assert result['parts'] == [1, result['parts'][1]]
  assert result['parts'][1] > 1
  for diff in result['max_relative_diffs']:
    assert diff <= 1e-5


def test_stock_trax_evaluates_as_before(tmp_path):
  stock_loop = cases.loop(str(tmp_path / 'stock'), ours_=False)
  assert not isinstance(cases.evaluator(stock_loop).metrics_fn,
                        evaluation.DeviceEvaluator)
  loop = cases.loop(str(tmp_path / 'ours'))
  assert isinstance(cases.evaluator(loop).metrics_fn,
                    evaluation.DeviceEvaluator)
