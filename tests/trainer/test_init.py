"""`init_reversible_blocks` against trax's own."""

import numpy as np
import pytest

from trax import fastmath
from trax import shapes
from trax.optimizers import trainer as stock_trainer

import trainer_cases as cases
from trax_revplus import trainer as rev_trainer

pytestmark = pytest.mark.usefixtures('stock_trax')


def test_init_reversible_blocks_keeps_loaded_weights():
  """Stock re-initializes every layer; ours keeps layers holding weights."""
  batch = cases.batch()
  sig = shapes.signature(batch)
  rng = fastmath.random.get_prng(5)

  def blocks_and_loss():
    first, revs, loss = cases.basic_model()
    return [(first.sublayers, revs)], loss

  stock_blocks, stock_loss = blocks_and_loss()
  stock_trainer.init_reversible_blocks(stock_blocks, stock_loss, sig, rng)
  ours_blocks, ours_loss = blocks_and_loss()
  rev_trainer.init_reversible_blocks(ours_blocks, ours_loss, sig, rng)
  # Fresh layers: exactly stock's initialization (same RNG use).
  cases.assert_all_close(
    [l.weights for l in stock_blocks[0][1]] + [stock_loss.weights],
    [l.weights for l in ours_blocks[0][1]] + [ours_loss.weights],
    tol=0,
  )
  # A layer that already holds weights keeps them; the others still get
  # stock's values.
  loaded_blocks, loaded_loss = blocks_and_loss()
  loaded = loaded_blocks[0][1][0]
  loaded.init(
    (shapes.ShapeDtype((2, 4, 4)),) * 2, rng=fastmath.random.get_prng(99)
  )
  loaded.weights = fastmath.nested_map(
    lambda w: np.full_like(w, 0.25), loaded.weights
  )
  rev_trainer.init_reversible_blocks(loaded_blocks, loaded_loss, sig, rng)
  for w in fastmath.tree_flatten(loaded.weights):
    np.testing.assert_array_equal(w, np.full_like(w, 0.25))
  cases.assert_all_close(stock_loss.weights, loaded_loss.weights, tol=0)
  cases.assert_all_close(
    stock_blocks[0][1][2].weights, loaded_blocks[0][1][2].weights, tol=0
  )
  cases.host_leaves_only(loaded_loss.weights)
