"""`reconstruction_error` locates drift, initialises, and rejects bad input."""

import numpy as np
import pytest
from trax import layers as tl
from trax import shapes

import layer_cases
from layer_pairs import INIT_RNG
from layer_pairs import leaves
import trax_revplus
from trax_revplus import layers as ours


class _LossyReverse(tl.ReversibleLayer):
  """Identity whose reverse is off by a known amount."""

  def __init__(self, offset):
    super().__init__(n_in=2, n_out=2)
    self._offset = offset

  def forward(self, xs):
    return xs

  def reverse(self, output, weights=(), state=(), new_state=(), rng=None):
    return (output[0] + self._offset, output[1])


def test_reconstruction_error_locates_drift():
  x1, x2 = layer_cases._pair()  # pylint: disable=protected-access
  d = layer_cases.D
  model = tl.Serial(
    tl.Dense(d),  # non-reversible: runs forward only
    ours.ReversibleSerial(
      ours.ReversibleHalfResidual(tl.Dense(d)),
      tl.ReversibleSwap(),
      _LossyReverse(0.25),
      ours.ReversibleHalfResidual(tl.Dense(d)),
      tl.ReversibleSwap(),
    ),
    tl.Concatenate(),
    tl.Relu(),
    tl.Dup(),
    ours.ReversibleSerial(ours.ReversibleHalfResidual(tl.LayerNorm())),
  )
  model.init(shapes.signature((x1, x2)), rng=INIT_RNG)
  records, summary = trax_revplus.reconstruction_error(model, (x1, x2))
  assert [r.name for r in records] == [
    'ReversibleHalfResidual',
    'ReversibleSwap',
    '_LossyReverse',
    'ReversibleHalfResidual',
    'ReversibleSwap',
    'ReversibleHalfResidual',
  ]
  assert [r.block for r in records] == [0, 0, 0, 0, 0, 1]
  assert records[2].path == (1, 2)
  lossy = records[2]
  assert lossy.local_max_abs_error == pytest.approx(0.25, rel=1e-5)
  assert lossy.max_abs_error == pytest.approx(0.25, rel=1e-5)
  # Layers after the lossy one are exact; drift shows in those before it.
  for r in records[3:]:
    assert r.max_abs_error < 1e-5 and r.local_max_abs_error < 1e-5
  for r in records[:2]:
    assert r.max_abs_error >= 0.2 and r.local_max_abs_error < 1e-5
  assert 'worst max_rel_error' in summary
  assert records[0].as_dict()['name'] == 'ReversibleHalfResidual'


def test_reconstruction_error_initialises_and_rejects():
  layer, x = layer_cases.dense(
    ours.ReversibleHalfResidual, ours.ReversibleSerial
  )
  records, _ = trax_revplus.reconstruction_error(layer, x)
  assert len(records) == 4
  assert leaves(layer.weights)  # initialised on the way
  assert all(r.max_rel_error < 1e-5 for r in records)
  with pytest.raises(ValueError, match='no reversible layer'):
    trax_revplus.reconstruction_error(
      tl.Serial(tl.Dense(2)), np.ones((1, 2), np.float32)
    )
  with pytest.raises(ValueError, match='one entry per sublayer'):
    trax_revplus.reconstruction_error(layer, x, layer.weights[:1], layer.state)
