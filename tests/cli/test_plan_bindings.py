"""The plan `estimate` prints, as gin bindings a config takes.

The bindings are checked by gin itself (each parses and binds a setting
the trainer accepts); that they keep the plan, by `estimate` on the
bindings it printed: tests/cli/test_estimate.py::
test_plan_bindings_give_the_same_plan.
"""

import dataclasses

import gin
import pytest

from trax_revplus.cli import plan_bindings
from trax_revplus.trainer import TrainerOptions
from trax_revplus.trainer._plan import plan as plan_lib

pytestmark = pytest.mark.usefixtures('stock_trax')

# Two blocks of two reversible layers, as `make_plan` lays them out.
_UNFUSED = plan_lib.make_plan(
  [2, 2],
  {i: 1 for i in range(8)},
  [0, 0],
  segment_max_layers=2,
  segment_max_bytes=100,
  backward_segment_max_layers=1,
)


def _bindings(printed):
  """The printed lines gin takes: {setting: value}, each line parsed by
  gin and checked by the trainer's options."""
  found = {}
  for line in printed[1:]:
    if not line.startswith(f'{plan_bindings.TRAINER}.'):
      continue
    gin.clear_config()
    gin.parse_config(line)
    [(name, value)] = gin.get_bindings(plan_bindings.TRAINER).items()
    found[name] = value
  gin.clear_config()
  TrainerOptions.of(found)
  return found


def test_an_unfused_plan_is_its_settings_and_what_the_planner_adds():
  step_plan = dataclasses.replace(
    _UNFUSED, batch_slices=2, n_async_layers=0, prefetch=False, parallel_heads=1
  )
  settings = dict(step_plan.settings(), n_calls=9)
  printed = plan_bindings.lines(settings, f'{step_plan.describe(9)} (fits)')
  assert printed[0] == 'revplus plan: 9 calls per step (fits); as gin bindings:'
  assert _bindings(printed) == {
    'segment_max_layers': 2,
    'backward_segment_max_layers': 1,
    'batch_slices': 2,
    'n_async_layers': 0,
    'sequence_chunks': 1,
    'micro_batches': 1,
    'parallel_heads': 1,
    'params_on_device': False,
  }
  assert printed[-1] == (
    'revplus plan, left to the planner (no binding pins it): '
    'fused_layers=0, prefetch=False, saved_on_host=False, '
    'grads_on_host=False'
  )


def test_a_fused_plan_leaves_its_segments_and_unset_heads_to_the_planner():
  # The whole model in the loss program: a pinned segment length would
  # exclude it; parallel_heads None (the layers as configured) is no int.
  step_plan = dataclasses.replace(_UNFUSED, fused_from=0)
  settings = dict(step_plan.settings(), n_calls=1)
  no_fit = '(no plan fits 1.0 KiB; the least needs 2048 bytes)'
  printed = plan_bindings.lines(settings, f'{step_plan.describe(1)} {no_fit}')
  assert printed[0] == (
    f'revplus plan: 1 call per step {no_fit}; as gin bindings:'
  )
  assert _bindings(printed) == {
    'batch_slices': 1,
    'n_async_layers': 8,
    'sequence_chunks': 1,
    'micro_batches': 1,
    'params_on_device': False,
  }
  assert printed[-1] == (
    'revplus plan, left to the planner (no binding pins it): '
    'segment_max_layers=2, backward_segment_max_layers=1, fused_layers=6, '
    'prefetch=True, saved_on_host=False, grads_on_host=False, '
    'parallel_heads=None'
  )
