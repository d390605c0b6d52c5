"""A set loads into the structure it was saved from, also where one layer
object stands at two places (trax's encoder-decoder `Reformer` embeds
inputs and targets with the same layers): trax's own load puts every
array after the second place one layer late; and a scalar state saved as
a numpy scalar (as earlier revisions saved it on N > 1 devices) loads as
the 0-d array the layer holds, which a step under a device memory budget
plans with. The reference is the Loop that saved the set, or one that was
never interrupted."""

import gzip
import pickle

import gin
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


_BUDGET = 'trax_revplus.ReversibleSerialTrainer.device_memory_budget_bytes'


def _numpy_scalars(tree):
  """`tree` with each 0-d array a numpy scalar, as earlier revisions left
  a scalar state on N > 1 devices (device 0's copy indexed out of its
  per-device array) and saved it."""
  return fastmath.nested_map(
    lambda x: x[()] if isinstance(x, np.ndarray) and x.ndim == 0 else x, tree
  )


def test_a_scalar_state_saved_as_a_numpy_scalar_loads_as_an_array_and_plans(
  tmp_path,
):
  # A budget plans every step from the types of its arguments, which are
  # known ahead only for arrays.
  gin.bind_parameter(_BUDGET, 20 * 2**20)
  uninterrupted = cases.make_loop(tmp_path / 'uninterrupted')
  uninterrupted.run(3)
  saved = cases.make_loop(tmp_path / 'run')
  saved.run(2)
  saved.model.state = _numpy_scalars(saved.model.state)
  saved.save_checkpoint('model')
  with gzip.open(tmp_path / 'run' / 'model.pkl.gz') as f:
    flat_state = pickle.load(f)['flat_state']
  assert any(isinstance(x, np.generic) for x in flat_state)  # the dropouts'

  loaded = cases.make_loop(tmp_path / 'run')
  assert loaded.step == 2
  leaves = fastmath.tree_flatten(loaded.model.state)
  assert leaves and all(isinstance(x, np.ndarray) for x in leaves), [
    type(x) for x in leaves
  ]
  cases.assert_equal(_state_of(saved.model), _state_of(loaded.model))
  # Its next step plans under the budget and is the uninterrupted run's.
  loaded.run(1)
  cases.assert_equal(cases.weights_of(uninterrupted), cases.weights_of(loaded))
  cases.assert_equal(cases.slots_of(uninterrupted), cases.slots_of(loaded))
