"""Host memory as a planned resource: each plan's accounted host bytes, the
host budget, and a pinned plan over it.

References: the host arrays a real step holds at each of its calls (its
layers' weights, state and slots, the batch, the saved entries waiting on
the host, the gradients its commit queue adds up, the updates it copies
back), counted from the real objects; byte counts of the model's weights
and slots; trax's default `Trainer` for the weights trained under a host
budget.
"""

import dataclasses

import jax
import numpy as np
import pytest

import trainer_cases as cases
from trax_revplus import memory
from trax_revplus.trainer._accounting import on_types
from trax_revplus.trainer._search import budget
from trax_revplus.trainer._step import step_context

pytestmark = pytest.mark.usefixtures('stock_trax')

_BATCH = cases.lm_batch()


def _trainer(**kwargs):
  return cases.lm_trainer(_BATCH, **kwargs)


def _nbytes(leaves):
  """Bytes of the distinct arrays among `leaves`."""
  return sum(
    {
      id(x): np.asarray(x).nbytes for x in leaves if hasattr(x, 'nbytes')
    }.values()
  )


def _parts_plan(trainer, **changes):
  """The leanest plan in 2 micro-batches (saved inputs and states and the
  accumulated gradients on the host), with `changes`."""
  p = trainer.planner
  group = next(
    g
    for g in p.candidates(p.step_types(_BATCH)).groups()
    if g.leanest.micro_batches == 2 and g.leanest.sequence_chunks == 1
  )
  return dataclasses.replace(group.leanest, **changes)


@pytest.mark.parametrize('devices_are_host', [True, False])
def test_accounted_host_bytes_are_what_the_real_step_holds(
  devices_are_host, monkeypatch
):
  """At each call the accounted host parts are the host arrays the real
  step holds then; on an accelerator (simulated) the updates being copied
  back count too."""
  monkeypatch.setattr(
    on_types, 'devices_are_host', lambda placement: devices_are_host
  )
  model, trainer = _trainer(device_memory_budget_bytes=None)
  plan = _parts_plan(trainer, n_async_layers=2)
  accounted = cases.set_plan(trainer, _BATCH, plan)
  store = trainer._store  # pylint: disable=protected-access
  commits = trainer._commits  # pylint: disable=protected-access
  held = []
  call = step_context.StepContext.call

  def counting(ctx, fn, args):
    leaves = jax.tree_util.tree_leaves(
      (
        [l.weights for l in trainer.all_layers],
        [l.state for l in trainer.all_layers],
        [o.slots for o in store.optimizers],
        _BATCH,
        [w.arrays() for w in ctx.on_host.values()],
        commits._gradients,
      )
    )  # pylint: disable=protected-access
    if not devices_are_host:
      leaves += jax.tree_util.tree_leaves(ctx.copy_back.on_device())
    held.append(_nbytes(leaves))
    return call(ctx, fn, args)

  monkeypatch.setattr(step_context.StepContext, 'call', counting)
  trainer.one_step(_BATCH, cases.RNGS[0])
  assert held == [
    sum(h.size_bytes for h in c.host_held) for c in accounted.calls
  ]
  # What waits on the host shows: saved entries from the forward passes,
  # the first part's gradients until the last part's backward.
  parts = [{h.name for h in c.host_held} for c in accounted.calls]
  assert any(
    'saved block inputs and states waiting on the host' in p for p in parts
  )
  assert any('accumulated gradients on the host' in p for p in parts)
  assert any('updates being copied back' in p for p in parts) == (
    not devices_are_host
  )
  # Weights, slots and state: every layer's, as the model and the
  # optimizers hold them.
  weights_and_slots = _nbytes(
    jax.tree_util.tree_leaves(
      (model.weights, model.state, [o.slots for o in store.optimizers])
    )
  )
  peak = accounted.peak_host_call
  assert peak.host_parts()['weights, slots and state'] == weights_and_slots
  assert (
    accounted.peak_host_bytes
    == peak.host_bytes
    == sum(peak.host_parts().values())
  )
  if devices_are_host:  # the devices' buffers are host memory
    assert peak.host_parts()['device buffers (host memory here)'] == (
      peak.device_bytes
    )


def _host_peak(**settings):
  """The accounted peak host bytes of the plan `settings` name."""
  _, trainer = _trainer(
    device_memory_budget_bytes=None, host_memory_budget_bytes=None, **settings
  )
  return trainer.device_memory_of(_BATCH).peak_host_bytes


@pytest.mark.parametrize('setting', ['int', 'auto'])
def test_a_pinned_plan_over_the_host_budget_is_one_line(setting, monkeypatch):
  need = _host_peak(segment_max_layers=1)
  if setting == 'auto':  # what the host can give, less 10%, is too little
    monkeypatch.setattr(memory, 'host_available_bytes', lambda: 1000)
    settings = {}
  else:
    settings = {'host_memory_budget_bytes': need - 1}
  model, trainer = _trainer(
    device_memory_budget_bytes=None, segment_max_layers=1, **settings
  )
  available = trainer.planner.host_budget_bytes
  assert available < need
  before = jax.tree_util.tree_map(np.array, model.weights)
  with pytest.raises(budget.HostMemoryBudgetError) as e:
    trainer.one_step(_BATCH, cases.RNGS[0])
  message = str(e.value)
  assert '\n' not in message
  assert message.startswith('the plan the settings name (')
  assert f'needs {need} bytes' in message
  assert f'host_memory_budget_bytes={available} ' in message
  assert (
    "device_memory_budget_bytes = 'auto', set segment_max_layers to "
    "'auto' so that the planner chooses a plan that fits both" in message
  )
  assert ("'auto': what the host could give" in message) == (setting == 'auto')
  cases.assert_all_close(before, model.weights, tol=0)


def test_auto_plans_under_the_host_budget():
  """Below the fastest plan's host bytes the budget 'auto' runs a plan
  within them, which trains as trax's default Trainer."""
  ref_weights, ref_slots, _ = cases.lm_reference_3_steps()
  _, trainer = _trainer(host_memory_budget_bytes=None)
  fastest = trainer.planned(_BATCH)
  host_budget = fastest.memory.peak_host_bytes - 1
  model, trainer = _trainer(host_memory_budget_bytes=host_budget)
  cases.train(trainer, _BATCH, 3)
  planned = trainer.planned(_BATCH)
  assert planned.plan != fastest.plan
  assert planned.memory.peak_host_bytes <= host_budget
  weighing = trainer.planner.weighing(_BATCH)
  assert weighing.weighed[0].plan == fastest.plan
  assert weighing.weighed[0].fits is False
  cases.assert_all_close(ref_weights, model.weights)
  cases.assert_all_close(ref_slots, trainer.slots)


def test_on_an_accelerator_a_small_host_budget_saves_on_the_device(monkeypatch):
  """Where the devices are not host memory (simulated), a device budget
  whose fastest fitting plan keeps its saved inputs and states on the
  host, and a host budget 'auto' below that plan's host bytes: the plan
  run keeps them on the device."""
  monkeypatch.setattr(on_types, 'devices_are_host', lambda placement: False)
  ref_weights, ref_slots, _ = cases.lm_reference_3_steps()
  _, trainer = _trainer(device_memory_budget_bytes=None)
  p = trainer.planner
  leanest = p.candidates(p.step_types(_BATCH)).leanest(4)
  device_budget = p.weigh(leanest, p.step_types(_BATCH)).peak_device_bytes
  _, trainer = _trainer(
    device_memory_budget_bytes=device_budget, host_memory_budget_bytes=None
  )
  on_host = trainer.planned(_BATCH)
  assert on_host.plan.saved_on_host
  host_budget = on_host.memory.peak_host_bytes - 1
  held = trainer._store.host_bytes()  # pylint: disable=protected-access
  # What the host can give, less the reserve, is the budget less what the
  # trainer holds already.
  available = max(
    a
    for a in range(host_budget)
    if held + a - int(a * budget.RESERVE_FRACTION) <= host_budget
  )
  monkeypatch.setattr(memory, 'host_available_bytes', lambda: available)
  model, trainer = _trainer(device_memory_budget_bytes=device_budget)
  assert trainer.planner.host_budget_bytes == host_budget
  cases.train(trainer, _BATCH, 3)
  planned = trainer.planned(_BATCH)
  assert not planned.plan.saved_on_host
  assert planned.memory.peak_device_bytes <= device_budget
  assert planned.memory.peak_host_bytes <= host_budget
  cases.assert_all_close(ref_weights, model.weights)
  cases.assert_all_close(ref_slots, trainer.slots)


def test_the_memory_log_records_the_accounted_host_peak(tmp_path):
  _, trainer = _trainer(
    memory_log_every_n_steps=1,
    output_dir=str(tmp_path),
    memory_log_tensorboard=False,
  )
  expected = trainer.device_memory_of(_BATCH)
  trainer.one_step(_BATCH, cases.RNGS[0], step=1)
  trainer.memory_log.close()
  records = memory.read_memory_log(tmp_path / memory.MEMORY_LOG_FILENAME)
  # The phases the accounting names (the fused program's: 'loss' alone)
  # carry both figures.
  phases = [r for r in records if 'peak_device_bytes' in r]
  assert {r['phase'] for r in phases} == set(expected.phase_peaks())
  assert phases and all(
    r['peak_host_bytes'] == expected.peak_host_bytes for r in phases
  )
  assert [r['phase_peak_host_bytes'] for r in phases] == [
    expected.phase_host_peaks()[r['phase']] for r in phases
  ]
  [step] = [r for r in records if r['phase'] == 'step']
  assert step['peak_host_bytes'] == expected.peak_host_bytes
  # The process's RSS when the trainer was made: the baseline a measured
  # host peak is read against.
  assert isinstance(step['host_rss_backend_open_bytes'], int)
  assert step['host_rss_backend_open_bytes'] > 0
