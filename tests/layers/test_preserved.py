"""`layers.preserved`: a trace that fails inside a trax layer leaves the
layer tree exactly as it was found.

Reference: trax's own `Layer.pure_fn`, which leaves the trace's tracers in
the layers when its forward raises (the first test shows it does, so the
second can fail).
"""

import jax
import numpy as np
import pytest
from trax import layers as tl
from trax import shapes

from trax_revplus import layers as layers_lib

pytestmark = pytest.mark.usefixtures('stock_trax')


def _model():
  """Dense and LayerNorm, then a layer whose forward raises once the model
  is initialized."""
  initialized = []

  def fails(x):
    if initialized:
      raise ValueError('this layer fails on purpose')
    return x

  model = tl.Serial(tl.Dense(4), tl.LayerNorm(), tl.Fn('Fails', fails))
  model.init(shapes.ShapeDtype((2, 4), np.float32))
  initialized.append(True)
  return model


def _leaked(model):
  """Paths of layer attributes that hold a tracer."""
  out = []
  todo = [('model', model)]
  while todo:
    path, layer = todo.pop()
    for name, value in vars(layer).items():
      if name == '_sublayers':
        continue
      if any(
        isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(value)
      ):
        out.append(f'{path}.{name}')
    todo.extend((f'{path}/{i}', s) for i, s in enumerate(layer.sublayers))
  return out


def _eval_shape(model):
  x = jax.ShapeDtypeStruct((2, 4), np.float32)
  rng = jax.ShapeDtypeStruct((2,), np.uint32)
  with pytest.raises(Exception, match='fails on purpose'):
    jax.eval_shape(model.pure_fn, x, model.weights, model.state, rng)


def test_trax_leaves_tracers_in_a_layer_whose_trace_fails():
  model = _model()
  before = set(_leaked(model))  # trax's init leaves stale `_rng` tracers
  _eval_shape(model)
  leaked = set(_leaked(model)) - before
  assert {'model/0._weights', 'model/1._weights'} <= leaked


@pytest.mark.parametrize('raise_through', [False, True])
def test_preserved_leaves_the_tree_as_found(raise_through):
  model = _model()
  layers = [model] + list(model.sublayers)
  before = [dict(vars(layer)) for layer in layers]
  leaked = _leaked(model)
  x = jax.ShapeDtypeStruct((2, 4), np.float32)
  rng = jax.ShapeDtypeStruct((2,), np.uint32)
  if raise_through:  # the exception leaves the `with` (the planner's case)
    with pytest.raises(Exception, match='fails on purpose'):
      with layers_lib.preserved(model):
        jax.eval_shape(model.pure_fn, x, model.weights, model.state, rng)
  else:
    with layers_lib.preserved(model):
      _eval_shape(model)
  assert _leaked(model) == leaked
  after = [dict(vars(layer)) for layer in layers]
  for b, a in zip(before, after):
    assert b.keys() == a.keys()
    for name in b:
      assert a[name] is b[name], name


def test_preserved_visits_a_shared_sublayer_once():
  shared = tl.Dense(4)
  model = tl.Serial(shared, tl.Relu(), shared)
  model.init(shapes.ShapeDtype((2, 4), np.float32))
  weights = shared.weights
  with layers_lib.preserved(model):
    shared.weights = (np.zeros((4, 4), np.float32), np.zeros(4, np.float32))
  assert shared.weights is weights
