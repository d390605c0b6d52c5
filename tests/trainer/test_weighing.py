"""The plans weighed on one batch's shapes: one entry per distinct plan,
fits against the budget (unknown without one), the chosen one marked, and
the lines and JSON `estimate` shows.

References: peaks, plans and the calls each accounting counted, set by the
test.
"""

import types

import pytest

from trax_revplus.trainer._plan import plan as plan_lib
from trax_revplus.trainer._search import weighed_plans as weighed_plans_lib

pytestmark = pytest.mark.usefixtures('stock_trax')


def _plan(segment_max_layers, batch_slices=1):
  return plan_lib.make_plan(
    [4],
    {i: 1 for i in range(6)},
    [0],
    segment_max_layers=segment_max_layers,
    segment_max_bytes=100,
    backward_segment_max_layers=1,
    batch_slices=batch_slices,
  )


def _memory(peak_bytes, n_calls=1, host_bytes=0):
  return types.SimpleNamespace(
    peak_device_bytes=peak_bytes,
    peak_host_bytes=host_bytes,
    calls=(None,) * n_calls,
  )


def test_each_plan_once_fits_within_the_budget_the_chosen_marked():
  weighing = weighed_plans_lib.Weighing(budget_bytes=100)
  long_, short = _plan(4), _plan(1, batch_slices=2)
  weighing.add(long_, _memory(101, n_calls=3))
  weighing.add(short, _memory(100, n_calls=5, host_bytes=2048))
  weighing.add(_plan(4), _memory(7))  # the same plan: kept as first seen
  weighing.chosen = short
  assert [w.plan for w in weighing.weighed] == [long_, short]
  assert weighing.memory_of(_plan(4)).peak_device_bytes == 101
  assert weighing.memory_of(_plan(2)) is None
  assert [w.fits for w in weighing.weighed] == [False, True]
  # The calls each accounting counted (a unit that only reorders the stack
  # makes none), not the plan's own layout.
  assert [w.calls_per_step for w in weighing.weighed] == [3, 5]
  out = weighing.to_json()
  assert [x['chosen'] for x in out] == [False, True]
  assert out[1] == {
    'describe': short.describe(5),
    'settings': short.settings(),
    'peak_device_bytes': 100,
    'peak_host_bytes': 2048,
    'fits': True,
    'calls_per_step': 5,
    'step_seconds': None,
    'chosen': True,
  }
  assert out[1]['describe'].endswith(', 5 calls per step')
  header, *rows = weighing.lines()
  assert header.split() == [
    'peak',
    'device/step',
    'peak',
    'host/step',
    'fits',
    'calls/step',
    'step',
    'time',
    'plan',
  ]
  assert rows[0].startswith(' ') and rows[1].startswith('*')
  assert rows[1].split()[1:10] == [
    '100',
    'B',
    '(0.0',
    'MiB)',
    '2.0',
    'KiB',
    'yes',
    '5',
    '-',
  ]
  assert rows[0].split()[6] == 'no'
  assert rows[1].endswith(
    'batch_slices=2, fused_layers=0, '
    'n_async_layers=8, prefetch=True, '
    'saved_on_host=False, sequence_chunks=1, '
    'micro_batches=1, grads_on_host=False, '
    'parallel_heads=None, params_on_device=False'
  )


def test_without_a_budget_fits_is_unknown():
  weighing = weighed_plans_lib.Weighing(budget_bytes=None)
  weighing.add(_plan(4), _memory(10))
  assert weighing.weighed[0].fits is None
  assert weighing.to_json()[0]['fits'] is None
  assert weighing.to_json()[0]['chosen'] is False
  assert weighing.lines()[1].split()[6] == '-'


def test_a_host_budget_and_a_refused_plan():
  """With a host budget a plan fits where both peaks are within theirs; a
  plan the backend refused to compile for memory fits none, and reads
  'refused' with the bytes it needs at least."""
  from trax_revplus import device_memory  # pylint: disable=g-import-not-at-top

  weighing = weighed_plans_lib.Weighing(budget_bytes=100, host_budget_bytes=50)
  weighing.add(_plan(4), _memory(100, host_bytes=51))
  weighing.add(_plan(2), _memory(100, host_bytes=50))
  refused = device_memory.ProgramOutOfMemoryError(
    'JaxRuntimeError: RESOURCE_EXHAUSTED: ...', 'loss layer 5', 2048
  )
  weighing.refuse(_plan(1), refused)
  assert [w.fits for w in weighing.weighed] == [False, True, False]
  assert weighing.memory_of(_plan(1)) is None
  assert weighing.refusal_of(_plan(1)) is refused
  assert weighing.refusal_of(_plan(2)) is None
  out = weighing.to_json()[2]
  assert out['refused'] == str(refused) and out['least_device_bytes'] == 2048
  assert out['peak_device_bytes'] is None and out['calls_per_step'] is None
  assert weighing.lines()[3].split()[:6] == [
    'refused,',
    '>=',
    '2.0',
    'KiB',
    '-',
    'no',
  ]
  # Without a device budget, the host budget alone.
  weighing = weighed_plans_lib.Weighing(budget_bytes=None, host_budget_bytes=50)
  weighing.add(_plan(4), _memory(10**9, host_bytes=51))
  assert weighing.weighed[0].fits is False
