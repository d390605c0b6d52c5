"""The settings a budget's plan replaces (`overrides.replaced`): one line per
explicitly given setting the plan does not run as given, none for one it
runs or one left to the planner."""

import pytest

from trax_revplus.trainer import TrainerOptions
from trax_revplus.trainer._plan import plan as plan_lib
from trax_revplus.trainer._search import overrides

PREFIX = 'trax_revplus.ReversibleSerialTrainer.'


def _plan(**settings):
  settings.setdefault('segment_max_layers', 1)
  settings.setdefault('segment_max_bytes', 2**30)
  settings.setdefault('backward_segment_max_layers', 1)
  return plan_lib.make_plan([4], {i: 10 for i in range(6)}, [100], **settings)


@pytest.mark.parametrize(
  'name,value,used,plan',
  [
    ('batch_slices', 3, 2, _plan(batch_slices=2)),
    ('n_async_layers', 8, 0, _plan(n_async_layers=0)),
    (
      'backward_segment_max_layers',
      1,
      4,
      _plan(segment_max_layers=4, backward_segment_max_layers=4, fused_from=0),
    ),
  ],
)
def test_an_explicit_setting_the_plan_replaces_is_named(
  name, value, used, plan
):
  options = TrainerOptions(**{name: value})
  lines = overrides.replaced(plan, options, {name}, 12345)
  assert len(lines) == 1, lines
  assert lines[0].startswith(
    f'{PREFIX}{name} = {value} was replaced by {used} under the device '
    f'memory budget: '
  ), lines
  assert lines[0].endswith(
    f'set {PREFIX}device_memory_budget_bytes = None to run the settings '
    f'as given'
  )


def test_settings_run_as_given_or_not_given_are_not_named():
  plan = _plan(batch_slices=2, n_async_layers=0)
  # Given and run as given.
  options = TrainerOptions(batch_slices=2, n_async_layers=0)
  assert (
    overrides.replaced(plan, options, {'batch_slices', 'n_async_layers'}, 1)
    == []
  )
  # Not given: the planner's to choose.
  options = TrainerOptions()
  assert overrides.replaced(plan, options, set(), 1) == []
  # A backward length the unfused plan runs.
  options = TrainerOptions(backward_segment_max_layers=1)
  assert (
    overrides.replaced(plan, options, {'backward_segment_max_layers'}, 1) == []
  )
