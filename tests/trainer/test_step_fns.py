"""Each kind of step function: its arguments' layouts and donations agree
with the arguments the builders' functions take."""

import inspect

import pytest

from trax import layers as tl
from trax import optimizers
from trax.optimizers import trainer as stock_trainer

from trax_revplus.placement import Layout
from trax_revplus.trainer._step import chains
from trax_revplus.trainer._step import fused_fns
from trax_revplus.trainer._step import step_fns
from trax_revplus.trainer._step.fn_kinds import Kind

# Arguments every device holds whole; the rest differ per device.
_REPLICATED = frozenset(['weights', 'slots', 'opt_params', 'step'])


def _functions():
  dense, swap = tl.Dense(4), tl.ReversibleSwap()
  half = tl.ReversibleHalfResidual(tl.Dense(4))
  adam = optimizers.Adam
  return {
    Kind.FORWARD: step_fns.forward_fn(dense),
    Kind.FORWARD_BACKWARD_UPDATE: step_fns.fbo_fn(dense, adam(), 1, False),
    Kind.LOSS: step_fns.fbo_fn(dense, adam(), 1, False, 'loss'),
    Kind.SEGMENT_FORWARD: chains.segment_forward_fn([half, swap]),
    Kind.SEGMENT_REVERSE_UPDATE: step_fns.segment_reverse_fn(
      [half, swap], [adam(), adam()], 1, False
    ),
    Kind.FUSED_LOSS: fused_fns.fused_loss_fn(
      [half, swap, dense], [adam(), adam(), adam()], 1, False
    ),
  }


# Results of each kind (see `Kind`'s docstring).
_N_RESULTS = {Kind.FORWARD: 2, Kind.SEGMENT_FORWARD: 2}


@pytest.mark.parametrize('kind', list(Kind))
def test_layouts_and_donations_name_the_right_arguments(kind):
  names = list(inspect.signature(_functions()[kind]).parameters)
  assert len(kind.in_layouts) == len(names)
  for layout, name in zip(kind.in_layouts, names):
    assert (layout is Layout.REPLICATED) == (name in _REPLICATED), name
  donated = [names[i] for i in kind.donated]
  if kind is Kind.SEGMENT_REVERSE_UPDATE:
    # The outputs and their cotangents too, as trax's reverse_and_fbo.
    assert donated == ['outputs', 'weights', 'grads', 'slots']
  else:
    assert donated == (['weights', 'slots'] if kind.updates else [])
  assert kind.updates == (kind not in (Kind.FORWARD, Kind.SEGMENT_FORWARD))
  assert len(kind.out_layouts) == _N_RESULTS.get(kind, 5)


@pytest.mark.parametrize('tree', [(), ((), [(), ()]), ((), 0), 0, [[]], {}])
def test_is_empty_tuple_as_trax(tree):
  assert step_fns.is_empty_tuple(tree) == stock_trainer._is_empty_tuple(tree)  # pylint: disable=protected-access
