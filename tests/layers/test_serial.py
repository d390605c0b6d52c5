"""`ReversibleSerial`: a reversible `tl.Serial`, flattened like stock's.

Also the errors both classes raise where stock returns wrong results.
"""

import pytest
from trax import layers as tl
from trax.layers import reversible as stock
from trax.optimizers import trainer as stock_trainer

import layer_cases
from layer_pairs import RUN_RNG
from layer_pairs import build_pair
import trax_revplus
from trax_revplus import layers as ours


def test_classes_are_reversible_layers():
  layer, _ = layer_cases.nested_serial(
    ours.ReversibleHalfResidual, ours.ReversibleSerial
  )
  assert isinstance(layer, tl.ReversibleLayer)
  assert isinstance(layer, tl.Serial)
  assert isinstance(layer.sublayers[0].sublayers[0], tl.ReversibleLayer)
  assert trax_revplus.ReversibleHalfResidual is ours.ReversibleHalfResidual
  assert trax_revplus.ReversibleSerial is ours.ReversibleSerial


def test_extract_reversible_blocks_flattens_ours_like_stock():
  def model(hr, rs):
    layer, _ = layer_cases.nested_serial(hr, rs)
    return tl.Serial(
      tl.Dense(layer_cases.D),
      tl.Dup(),
      layer,
      tl.Concatenate(),
      tl.Dense(3),
      tl.Relu(),
    )

  blocks_stock, loss_stock = stock_trainer.extract_reversible_blocks(
    model(stock.ReversibleHalfResidual, stock.ReversibleSerial)
  )
  blocks_ours, loss_ours = stock_trainer.extract_reversible_blocks(
    model(ours.ReversibleHalfResidual, ours.ReversibleSerial)
  )

  def names(blocks):
    return [
      ([l.name for l in std], [l.name for l in rev]) for std, rev in blocks
    ]

  assert names(blocks_ours) == names(blocks_stock)
  assert len(blocks_ours[0][1]) == 6  # three half-residuals, three swaps
  assert all(
    isinstance(l, ours.ReversibleHalfResidual) for l in blocks_ours[0][1][::2]
  )
  assert loss_ours.name == loss_stock.name


def test_errors():
  with pytest.raises(ValueError, match='not reversible'):
    ours.ReversibleSerial(ours.ReversibleHalfResidual(tl.Dense(2)), tl.Dense(2))
  _, layer, x = build_pair('dense')
  y, ns = layer.pure_fn(x, layer.weights, layer.state, RUN_RNG)
  # Stock zips silently over a short tuple and returns wrong inputs.
  with pytest.raises(ValueError, match='one entry per sublayer'):
    layer.reverse(y, layer.weights[:2], layer.state, ns, RUN_RNG)
  with pytest.raises(ValueError, match='one entry per sublayer'):
    layer.sublayers[0].reverse_and_grad(y, y, (), (), (), RUN_RNG)
