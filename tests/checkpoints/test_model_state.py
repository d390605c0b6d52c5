"""A set loads into the structure it was saved from, also where one layer
object stands at two places (trax's encoder-decoder `Reformer` embeds
inputs and targets with the same layers): trax's own load puts every
array after the second place one layer late. The reference is the Loop
that saved the set."""

import numpy as np
import pytest
from trax import fastmath
from trax import layers as tl

import checkpoint_cases as cases

pytestmark = pytest.mark.usefixtures('stock_trax_and_empty_gin')


def _model_with_a_layer_at_two_places():
  shared = tl.Dense(4)
  return tl.Serial(
    tl.Embedding(9, 4),
    shared,
    tl.Dup(),
    tl.ReversibleHalfResidual(tl.Dense(4)),
    tl.ReversibleSwap(),
    tl.ReversibleHalfResidual(tl.Dense(4), tl.Relu()),
    tl.ReversibleSwap(),
    tl.Add(),
    shared,
    tl.Dense(9),
    tl.LogSoftmax(),
  )


def _state_of(model):
  return [np.array(s) for s in fastmath.tree_flatten(model.state)]


def test_a_layer_at_two_places_loads_into_its_places(tmp_path):
  def make_loop(path):
    return cases.make_loop(
      path, evals=True, model_fn=_model_with_a_layer_at_two_places
    )

  uninterrupted = make_loop(tmp_path / 'uninterrupted')
  uninterrupted.run(3)
  saved = make_loop(tmp_path / 'run')
  saved.run(2)
  saved.save_checkpoint('model')
  loaded = make_loop(tmp_path / 'run')
  assert loaded.step == 2
  cases.assert_equal(cases.weights_of(saved), cases.weights_of(loaded))
  cases.assert_equal(_state_of(saved.model), _state_of(loaded.model))
  cases.assert_equal(_state_of(saved.eval_model), _state_of(loaded.eval_model))
  cases.assert_equal(cases.slots_of(saved), cases.slots_of(loaded))
  # Its next step (and the eval after it, which runs the eval model) is
  # the uninterrupted run's.
  loaded.run(1)
  cases.assert_equal(cases.weights_of(uninterrupted), cases.weights_of(loaded))
