"""Freeing device buffers and host memory around the step (`step_context`,
`observers`)."""

import jax
import numpy as np
import pytest

from trax import fastmath

import trainer_cases as cases

pytestmark = pytest.mark.usefixtures('stock_trax')


def test_free_accelerators_identical_and_weights_readable():
  caller_held = jax.numpy.arange(1000.0)
  caller_view = np.asarray(jax.numpy.arange(1000.0) * 3)
  model0, trainer0, losses0 = cases.train_basic(free_accelerators_on_step=False)
  model1, trainer1, losses1 = cases.train_basic(
    free_accelerators_on_step=True, memory_log_every_n_steps=1
  )
  cases.assert_all_close(model0.weights, model1.weights, tol=0)
  cases.assert_all_close(trainer0.slots, trainer1.slots, tol=0)
  cases.assert_all_close(losses0, losses1, tol=0)
  for x in fastmath.tree_flatten(model1.weights):
    assert isinstance(x, np.ndarray) and np.all(np.isfinite(x))
  # The returned losses, and arrays the caller held, are still readable.
  assert all(np.isfinite(float(l)) for l in losses1)
  np.testing.assert_array_equal(np.asarray(caller_held), np.arange(1000.0))
  np.testing.assert_array_equal(caller_view, np.arange(1000.0) * 3)
