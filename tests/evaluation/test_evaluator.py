"""Evals of a memory-efficient `training.Loop` on the trainer's device.

Reference: stock trax's eval as its memory-efficient `Loop` runs it (the
eval model's `model_with_metrics`, jitted on the host's CPU device by
`_accelerate_model_with_metrics(..., 0)`), on the same weights, state,
batch and RNG (`eval_cases.stock`), on a tiny LSH ReformerLM (per-row layer
state) and a batch whose loss weights differ between rows. On 2 devices:
tests/evaluation/eval_worker.py.
"""

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
from trax_revplus import placement as placement_lib
from trax_revplus import validation
from trax_revplus.evaluation import planning
from trax_revplus.evaluation import segments

pytestmark = pytest.mark.usefixtures('stock_trax_and_empty_gin')

EVAL_WORKER = os.path.join(os.path.dirname(__file__), 'eval_worker.py')
# Sizes at which the model's weights (two feed-forward blocks of 256 KiB)
# outweigh its activations on `eval_cases.eval_batch()`.
_WIDE = {'d_model': 64, 'd_ff': 512, 'n_layers': 2}


def _assert_close(ours, stock):
  np.testing.assert_allclose(ours, stock, rtol=1e-5, atol=1e-7)


def _plan(loop):
  return cases.evaluator(loop).metrics_fn.planned(*cases.arguments(loop)).plan


def _loop_and_stock(directory, **sizes):
  loop = cases.loop(str(directory), **sizes)
  return loop, cases.stock(loop, **sizes)


@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
  """(Loop with the default budget, stock's CPU eval metrics on it)."""
  return _loop_and_stock(tmp_path_factory.mktemp('tiny'))


@pytest.fixture(scope='module')
def wide(tmp_path_factory):
  """As `tiny`, on a model whose weights outweigh its activations."""
  return _loop_and_stock(tmp_path_factory.mktemp('wide'), **_WIDE)


def test_one_part_gives_stock_cpu_evals_metrics(tiny):
  loop, stock = tiny
  trainer = loop._trainer_per_task[0]  # pylint: disable=protected-access
  metrics_fn = cases.evaluator(loop).metrics_fn
  assert isinstance(metrics_fn, evaluation.DeviceEvaluator)
  # The trainer's budget ('auto': on the CPU what the host can give) and
  # its first device.
  assert metrics_fn.budget_bytes == trainer.planner.budget_bytes
  assert metrics_fn.budget_bytes is not None
  assert metrics_fn.device == trainer.placement.devices[0]
  _assert_close(cases.ours(loop), stock)
  assert _plan(loop).parts == 1


def test_parts_under_a_small_budget_give_stock_cpu_evals_metrics(tiny):
  loop, stock = tiny
  whole = _plan(loop)
  ours, plan = cases.evaluate(loop, whole.peak_device_bytes - 1)
  assert isinstance(plan, planning.EvalPlan)
  assert plan.parts > 1
  assert plan.peak_device_bytes < whole.peak_device_bytes
  _assert_close(ours, stock)
  # Averaging the parts' metrics would not: the rows' loss weights differ.
  whole_mean, parts_mean = cases.means_of_parts(loop, [1, plan.parts])
  _assert_close(whole_mean, stock)
  assert np.abs(parts_mean - whole_mean).max() > 1e-3


def test_a_budget_not_even_one_row_fits_is_one_line(tiny):
  with pytest.raises(evaluation.EvalMemoryBudgetError) as raised:
    cases.evaluate(tiny[0], 1000)
  # A ConfigurationError: `train` prints its line, no traceback (exit 2).
  assert isinstance(raised.value, validation.ConfigurationError)
  message = str(raised.value)
  assert '\n' not in message
  assert message.startswith(
    'the eval of a batch of 8 rows does not fit '
    'device_memory_budget_bytes=1000 bytes'
  ), message
  least = raised.value.least_bytes
  assert least > 1000
  assert f'device_memory_budget_bytes >= {least}, or use' in message
  # The least it names fits.
  ours, plan = cases.evaluate(tiny[0], least)
  _assert_close(ours, tiny[1])
  assert plan.peak_device_bytes <= least


def test_layers_one_at_a_time_where_the_weights_exceed_the_budget(wide):
  loop, stock = wide
  weights_bytes = sum(
    np.asarray(x).nbytes for x in jax.tree_util.tree_leaves(loop.model.weights)
  )
  ours, plan = cases.evaluate(loop, weights_bytes)
  assert isinstance(plan, segments.SegmentedPlan)
  assert plan.peak_device_bytes <= weights_bytes
  assert plan.parts > 1  # The feed-forward blocks need parts too.
  _assert_close(ours, stock)


def test_a_budget_no_layer_fits_is_one_line_naming_the_least(wide):
  loop, stock = wide
  with pytest.raises(segments.SegmentsError) as raised:
    cases.evaluate(loop, 200 * 1024)
  message = str(raised.value)
  assert '\n' not in message
  assert message.startswith(
    'the eval of a batch of 8 rows does not fit device_memory_budget_bytes'
    '=204800 bytes (0.2 MiB) even one layer and one row at a time: the '
    'least needs '
  ), message
  assert ', at layer ReversibleHalfResidualDecoderFF with the rest' in message
  least = raised.value.least_bytes
  assert f'device_memory_budget_bytes >= {least}, or use' in message
  # The least fits, one layer at a time.
  ours, plan = cases.evaluate(loop, least)
  _assert_close(ours, stock)
  assert isinstance(plan, segments.SegmentedPlan)
  assert plan.peak_device_bytes == least


def test_eval_runs_on_the_trainers_device_not_through_the_cpu_jit(
  tmp_path, monkeypatch
):
  """trax's memory-efficient Loop compiles its evals with
  `_accelerate(f, 0)` (jit on the host's CPU device); ours places every
  argument of the eval's programs on the trainer's first device,
  committed, so they run there."""
  trax_revplus.activate()
  accelerated = []
  accelerate = acceleration._accelerate  # pylint: disable=protected-access

  def counting(f, n_devices):
    accelerated.append(n_devices)
    return accelerate(f, n_devices)

  monkeypatch.setattr(acceleration, '_accelerate', counting)
  arguments = []
  put = placement_lib.OneDevice.put

  def watching(self, tree):
    placed, copies = put(self, tree)
    arguments.extend(
      (x.committed, x.sharding) for x in jax.tree_util.tree_leaves(placed)
    )
    return placed, copies

  monkeypatch.setattr(placement_lib.OneDevice, 'put', watching)
  loop = cases.loop(str(tmp_path))
  loop.run_evals()
  assert 0 not in accelerated
  device = loop._trainer_per_task[0].placement.devices[0]  # pylint: disable=protected-access
  assert arguments
  assert all(
    committed and sharding == jax.sharding.SingleDeviceSharding(device)
    for committed, sharding in arguments
  )
  assert loop.history.get('eval', 'metrics/WeightedCategoryCrossEntropy')


@pytest.mark.parametrize('how', ['whole', 'layers'])
def test_an_eval_is_planned_and_compiled_once_per_batch_shape(
  how, tiny, wide, monkeypatch
):
  """Planning compiles the programs the eval runs: no call compiles or
  traces anything, the whole model's or one layer at a time."""
  loop = tiny[0] if how == 'whole' else wide[0]
  budget = (
    None
    if how == 'whole'
    else sum(
      np.asarray(x).nbytes
      for x in jax.tree_util.tree_leaves(loop.model.weights)
    )
  )
  events = []

  def listener(name, *unused_args, **unused_kwargs):
    if name in (
      '/jax/core/compile/jaxpr_trace_duration',
      '/jax/core/compile/backend_compile_duration',
    ):
      events.append(name)

  metrics_fn = evaluation.DeviceEvaluator(
    cases.evaluator(loop).metrics_fn.model_with_metrics,
    loop._trainer_per_task[0].placement,
    budget,
  )  # pylint: disable=protected-access
  logged = []
  # The module's absl logging, read directly: whether absl's records reach
  # pytest's handlers depends on what earlier tests in the process did.
  monkeypatch.setattr(
    evaluator_lib.logging,
    'info',
    lambda message, *args: logged.append((message, args)),
  )
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    values = []
    # A second shape plans again (once), the whole model's.
    for rows in (8, 8, 4, 4) if how == 'whole' else (8, 8):
      arguments = cases.arguments(loop, cases.eval_batch(rows=rows))
      metrics_fn.planned(*arguments)
      start = len(events)
      values.append(metrics_fn(*arguments)[0])
      assert events[start:] == [], rows
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  np.testing.assert_array_equal(values[0], values[1])
  # Planned (and logged) once per batch shape.
  lines = [
    message % args
    for message, args in logged
    if 'eval device memory plan' in message
  ]
  assert len(lines) == (2 if how == 'whole' else 1), lines
  assert (
    'the model on all 8 rows, then the metrics; peak '
    if how == 'whole'
    else 'the model one layer at a time ('
  ) in lines[0]


def test_two_devices_evaluate_on_the_first_as_stock_on_the_cpu():
  result = run_multidevice_worker(2, script=EVAL_WORKER)
  assert result['local_devices'] == 2
  assert result['trainer_devices'] == 2
  assert result['eval_device'] == result['first_trainer_device']
  assert result['parts'][0] == 1 and result['parts'][1] > 1
  for diff in result['max_relative_diffs']:
    assert diff <= 1e-5


def test_stock_trax_evaluates_as_before(tiny, tmp_path):
  stock_loop = cases.loop(str(tmp_path), ours_=False)
  assert not isinstance(
    cases.evaluator(stock_loop).metrics_fn, evaluation.DeviceEvaluator
  )
  assert isinstance(
    cases.evaluator(tiny[0]).metrics_fn, evaluation.DeviceEvaluator
  )
