"""A step that runs out of device memory ends in one line that says where,
how much, and what to change."""

import types

import jax
import pytest
from trax import fastmath
from trax import layers as tl
from trax import optimizers

from trax_revplus import trainer as rev_trainer
from trax_revplus.trainer import oom_report
from trax_revplus.trainer._search import weighed_plans
from trax_revplus.trainer._step import step_context

import trainer_cases

# Sizes in the tiny model's range: 4 KiB short.
_ERROR = (
  'RESOURCE_EXHAUSTED: Error allocating device buffer: Attempting to '
  'allocate 6.00K. That was not possible. There are 2.00K free.'
)


def fail_in_phase(monkeypatch, phase, from_step=1):
  """Makes every call of `phase` from `from_step` on raise a backend's
  out-of-memory error, as a device short of memory does."""
  call = step_context.StepContext.call

  def short_of_memory(*args):
    del args
    raise jax.errors.JaxRuntimeError(_ERROR)

  def failing(self, fn, args):
    if self.phase == phase and self.step >= from_step:
      return call(self, short_of_memory, args)
    return call(self, fn, args)

  monkeypatch.setattr(step_context.StepContext, 'call', failing)


def test_out_of_memory_names_the_call_the_bytes_and_the_setting(monkeypatch):
  batch = trainer_cases.batch()
  first, revs, loss = trainer_cases.basic_model()
  tl.Serial([first] + revs + [loss]).init(
    batch, rng=fastmath.random.get_prng(12)
  )
  trainer = rev_trainer.ReversibleSerialTrainer(
    [(first.sublayers, revs)],
    loss,
    optimizers.Adam,
    device_memory_budget_bytes=2**30,
    segment_max_layers=1,
  )
  planned_peak = trainer.device_memory_of(batch).peak_device_bytes
  fail_in_phase(monkeypatch, 'backward')
  with pytest.raises(rev_trainer.DeviceOutOfMemoryError) as e:
    trainer.one_step(batch, fastmath.random.get_prng(0), step=7)
  message = str(e.value)
  assert '\n' not in message
  assert e.value.call.startswith('backward layer')
  assert message.startswith(
    f'out of device memory in {e.value.call} at step 7: it asked for 6.0 '
    f'KiB, 2.0 KiB were there; its plan was accounted at '
  )
  assert 'under a budget of 1.0 GiB' in message
  assert 'the leanest plan accounted needs' in message
  # The accounted peak less what the call lacked and 1% of the peak.
  assert e.value.suggested_budget_bytes == (
    planned_peak - 4096 - planned_peak // 100
  )
  assert (
    f'device_memory_budget_bytes = {e.value.suggested_budget_bytes} ' in message
  )


def test_other_runtime_errors_pass_unchanged(monkeypatch):
  call = step_context.StepContext.call

  def failing(self, fn, args):
    del fn
    return call(self, _raise_internal, args)

  monkeypatch.setattr(step_context.StepContext, 'call', failing)
  with pytest.raises(jax.errors.JaxRuntimeError, match='INTERNAL'):
    trainer_cases.train_basic(n_steps=1)


def test_the_leanest_plan_named_leaves_out_plans_the_backend_refused():
  """A plan the backend refused to compile for memory has no peak: the
  leanest plan the line names is the least of those accounted."""
  accounted = weighed_plans.Weighed(
    'a plan', types.SimpleNamespace(peak_device_bytes=5 * 2**20), True
  )
  refused = weighed_plans.Weighed(
    'another plan', None, False, refused=RuntimeError('refused')
  )
  planner = types.SimpleNamespace(
    budget_bytes=2**30,
    weighing=lambda batch: types.SimpleNamespace(weighed=[refused, accounted]),
  )
  ctx = types.SimpleNamespace(
    calling='backward layer 1', step=3, planned_peak_bytes=None
  )
  with pytest.raises(rev_trainer.DeviceOutOfMemoryError) as e:
    oom_report.raise_if_out_of_memory(
      jax.errors.JaxRuntimeError(_ERROR), ctx, planner, None
    )
  assert 'the leanest plan accounted needs 5.0 MiB' in str(e.value)


def _raise_internal(*args):
  del args
  raise jax.errors.JaxRuntimeError('INTERNAL: something else')
