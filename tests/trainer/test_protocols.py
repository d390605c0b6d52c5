"""trax_revplus.trainer._step.protocols: the concrete units, sinks and
observers of a real trainer satisfy the contracts they are taken as.

Two checks each: the instance check of `typing.runtime_checkable` (every
member present, data attributes included), and the methods' signatures
(same parameters, in order, of the same kinds, the same ones defaulted),
which the instance check does not look at.
"""

import inspect

import pytest

from trax_revplus.trainer._accounting import host_types
from trax_revplus.trainer._accounting import on_types
from trax_revplus.trainer._step import commit
from trax_revplus.trainer._step import observers
from trax_revplus.trainer._step import protocols
from trax_revplus.trainer._step import step_context
from trax_revplus.trainer._step import unit_kinds
import trainer_cases as cases


def _methods(protocol):
  """The methods a protocol declares, its bases' included: name -> fn."""
  found = {}
  for klass in reversed(protocol.__mro__):
    if klass.__module__ in ('typing', 'builtins'):
      continue
    found.update(
      {
        name: fn
        for name, fn in vars(klass).items()
        if inspect.isfunction(fn) and not name.startswith('_')
      }
    )
  return found


def _shape(fn):
  """(kind, has default) of each parameter after self."""
  params = list(inspect.signature(fn).parameters.values())[1:]
  return [(p.kind, p.default is not inspect.Parameter.empty) for p in params]


def _assert_signatures(klass, protocol):
  methods = _methods(protocol)
  assert methods or protocol is protocols.Unit
  for name, fn in methods.items():
    assert callable(getattr(klass, name, None)), (klass, name)
    assert _shape(getattr(klass, name)) == _shape(fn), (klass, name)


@pytest.fixture(scope='module')
def real_step():
  """A real trainer's planned step (micro-batches, so that every unit
  kind's accumulate_fn is set), its StepContext and an AheadOfTime walk."""
  batch = cases.lm_batch()
  _, trainer = cases.lm_trainer(
    batch, device_memory_budget_bytes=None, micro_batches=2
  )
  planned = trainer.planned(batch)
  # pylint: disable=protected-access
  ctx = step_context.StepContext.for_step(
    planned, 1, cases.RNGS[0], batch, trainer._parts
  )
  planner = trainer._planner
  walk = on_types.AheadOfTime(
    planned.plan,
    planner.step_types(batch),
    trainer._placement,
    planner._store.layers,
    planner._store.optimizers,
    planner._programs,
  )
  return planned, ctx, walk, trainer._parts


def test_units_satisfy_the_unit_protocols(real_step):
  planned = real_step[0]
  plan_units = planned.units
  pass_units = plan_units.forward_units + plan_units.backward_units
  assert {type(u) for u in pass_units} >= {
    unit_kinds.StandardUnit,
    unit_kinds.ReversibleSegment,
  }
  for unit in pass_units + [plan_units.loss_unit]:
    assert isinstance(unit, protocols.Unit), unit
  for unit in pass_units:
    assert isinstance(unit, protocols.PassUnit), unit
  assert isinstance(plan_units.loss_unit, unit_kinds.LossUnit)
  assert isinstance(plan_units.loss_unit, protocols.LossProgram)
  for klass in (
    unit_kinds.StandardUnit,
    unit_kinds.ReversibleSegment,
    unit_kinds.SelectSegment,
  ):
    _assert_signatures(klass, protocols.PassUnit)
  _assert_signatures(unit_kinds.LossUnit, protocols.LossProgram)


def test_select_segment_satisfies_the_pass_unit_protocol():
  # pylint: disable=g-import-not-at-top
  from trax import layers as tl

  unit = unit_kinds.SelectSegment([3], [tl.ReversibleSwap()])
  assert isinstance(unit, protocols.PassUnit)


def test_the_step_satisfies_the_step_protocol(real_step):
  ctx = real_step[1]
  assert isinstance(ctx, protocols.Step)
  _assert_signatures(step_context.StepContext, protocols.Step)


def test_sinks_satisfy_the_update_sink_protocol(real_step):
  _, ctx, walk, parts = real_step
  for sink in (parts.commits, walk.sink):
    assert isinstance(sink, protocols.UpdateSink), sink
  assert ctx.sink is parts.commits
  for klass in (commit.CommitQueue, host_types.HostTypes):
    _assert_signatures(klass, protocols.UpdateSink)


def test_observers_satisfy_the_step_observer_protocol(real_step):
  ctx = real_step[1]
  # pylint: disable=protected-access
  assert ctx._observers
  for observer in ctx._observers + [observers.ReleaseHostMemory()]:
    assert isinstance(observer, protocols.StepObserver), observer
  for klass in (observers.ReleaseHostMemory, observers.PhaseRecorder):
    _assert_signatures(klass, protocols.StepObserver)


def test_a_unit_missing_a_member_fails_the_check():
  unit = unit_kinds.LossUnit([0], 1, fn=None)
  assert isinstance(unit, protocols.LossProgram)
  del unit.accumulate_fn
  assert not isinstance(unit, protocols.Unit)

  class Sink:
    def readable(self, stats):
      return stats

    def start(self, layers, weights, slots, states, stats):  # not a record
      pass

    def commit(self, token):
      pass

    def end_step(self):
      pass

    def held_on_host(self):
      return []

  assert isinstance(Sink(), protocols.UpdateSink)  # names only
  with pytest.raises(AssertionError):
    _assert_signatures(Sink, protocols.UpdateSink)
