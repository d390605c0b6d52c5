"""A layer whose state trax returns in another shape than it initialized it
(trax's `ConcatWithPadding` layers in every `ConfigurableTerraformer`: an
int32 scalar, shape (1,) from the first call on) keeps its initial shape
through trax_revplus's steps, so nothing compiles again at step 2 and a
checkpoint fits a fresh model; a checkpoint written with the returned shape
(by trax's default `Trainer`) loads reshaped, with one warning; a state
that does not fit at all is one warning naming its layer, the weights
loaded. References: the Loop that saved the set, trax's own layers."""

import logging

import numpy as np
import pytest
from trax import fastmath
from trax import layers as tl
from trax.fastmath import numpy as jnp

import checkpoint_cases as cases
from trax_revplus.progress.compiles import CompileCounter

pytestmark = pytest.mark.usefixtures('stock_trax_and_empty_gin')


class _CountsItsCalls(tl.Layer):
  """As trax's `ConcatWithPadding`: an int32 scalar state that its forward
  returns with shape (1,); here it also counts the calls."""

  def init_weights_and_state(self, input_signature):
    del input_signature
    self.state = jnp.array(0, dtype=jnp.int32)

  def forward(self, inputs):
    self.state = self.state.reshape((1,)) + 1
    return inputs


class _HoldsRows(tl.Layer):
  """A float state of `n` entries (e.g. per-row values)."""

  def __init__(self, n):
    super().__init__()
    self._n = n

  def init_weights_and_state(self, input_signature):
    del input_signature
    self.state = jnp.zeros((self._n,), dtype=jnp.float32)

  def forward(self, inputs):
    self.state = self.state + 1.0
    return inputs


def _model(extra=None):
  def model_fn():
    return tl.Serial(
      tl.Embedding(9, 4),
      _CountsItsCalls(),
      *([extra] if extra is not None else []),
      tl.Dup(),
      tl.ReversibleHalfResidual(tl.Dense(4)),
      tl.ReversibleSwap(),
      tl.Concatenate(),
      tl.Dense(9),
      tl.LogSoftmax(),
    )

  return model_fn


def _state(loop):
  return [np.asarray(s) for s in fastmath.tree_flatten(loop.model.state)]


def _absl_warnings(caplog):
  return [r for r in caplog.records if r.levelno == logging.WARNING]


def test_the_state_keeps_its_shape_and_step_2_compiles_nothing(tmp_path):
  CompileCounter.snapshot()  # Listens from now on.
  loop = cases.make_loop(tmp_path, model_fn=_model())
  initial = [x.shape for x in _state(loop)]
  loop.run(1)
  compiled = CompileCounter.snapshot()[0]
  loop.run(1)  # Step 2 (trax saves at step 3).
  assert CompileCounter.names_since(compiled) == []
  state = _state(loop)
  assert [x.shape for x in state] == initial == [()]
  assert state[0] == 2  # Every step's call counted.


def test_a_resume_loads_the_state_whole(tmp_path, caplog):
  saved = cases.make_loop(tmp_path, model_fn=_model())
  saved.run(2)
  saved.save_checkpoint('model')
  loaded = cases.make_loop(tmp_path, model_fn=_model())
  cases.assert_equal(_state(saved), _state(loaded))
  assert not _absl_warnings(caplog)


def test_a_state_written_in_the_shape_trax_returns_loads_reshaped(
  tmp_path, caplog
):
  # trax's default Trainer hands the state on as the layer returns it.
  saved = cases.make_loop(tmp_path, model_fn=_model(), memory_efficient=False)
  saved.run(2)
  saved.save_checkpoint('model')
  assert [x.shape for x in _state(saved)] == [(1,)]
  loaded = cases.make_loop(tmp_path, model_fn=_model())
  assert [x.shape for x in _state(loaded)] == [()]
  assert _state(loaded)[0] == _state(saved)[0][0] == 2
  cases.assert_equal(cases.weights_of(saved), cases.weights_of(loaded))
  (warning,) = _absl_warnings(caplog)
  message = warning.getMessage()
  assert 'int32[1] there and int32[] in this model' in message, message
  assert '_CountsItsCalls at [1]' in message, message
  assert 'loaded reshaped' in message, message


def test_a_state_that_does_not_fit_names_its_layer_and_loads_the_weights(
  tmp_path, caplog
):
  saved = cases.make_loop(tmp_path, model_fn=_model(_HoldsRows(2)))
  saved.run(2)
  saved.save_checkpoint('model')
  loaded = cases.make_loop(tmp_path, model_fn=_model(_HoldsRows(3)))
  assert loaded.step == 2
  cases.assert_equal(cases.weights_of(saved), cases.weights_of(loaded))
  np.testing.assert_array_equal(_state(loaded)[1], np.zeros(3))
  (warning,) = _absl_warnings(caplog)
  message = warning.getMessage()
  assert '_HoldsRows at [2] is float32[2] there and float32[3]' in message
  assert "the layers' state starts afresh" in message
