"""A restarted run reaches the weights of a run without restart.

With dropout, 3 steps + restart + 3 steps must give the weights and slots of
6 uninterrupted steps, which needs the Loop's RNG (and the data position)
resumed from the set loaded: stock trax restarts the RNG from the seed. At
an eval step, the keys the evals take after the save are accounted for.
"""

import numpy as np
import pytest

import checkpoint_cases as cases
from checkpoint_cases import continuous  # noqa: F401  # pylint: disable=unused-import


pytestmark = pytest.mark.usefixtures('stock_trax_and_empty_gin')


def test_restart_with_dropout_reaches_the_same_weights(continuous, tmp_path):
  _, _, (weights6, slots6), _ = continuous
  cases.make_loop(tmp_path).run(3)
  resumed = cases.make_loop(tmp_path)
  assert resumed.step == 3
  resumed.run(3)
  for got, want in zip(
    cases.weights_of(resumed) + cases.slots_of(resumed), weights6 + slots6
  ):
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


@pytest.mark.slow
def test_restart_at_an_eval_step_reaches_the_same_weights(tmp_path):
  reference = cases.make_loop(tmp_path / 'reference', evals=True)
  reference.run(6)
  want = cases.weights_of(reference) + cases.slots_of(reference)
  cases.make_loop(tmp_path / 'run', evals=True).run(3)
  resumed = cases.make_loop(tmp_path / 'run', evals=True)
  assert resumed.step == 3
  resumed.run(3)
  got = cases.weights_of(resumed) + cases.slots_of(resumed)
  assert len(got) == len(want)
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


def test_the_reference_run_is_that_of_a_fresh_process(
  continuous, tmp_path_factory
):
  # Gin left bound by an earlier test (the main config binds Adam.b2 and
  # eps) must not reach the reference: it is made as in a fresh process.
  import gin  # pylint: disable=g-import-not-at-top

  gin.parse_config('Adam.b2 = 0.98\nAdam.eps = 1e-9')
  try:
    _, _, (weights6, slots6), _ = cases._continuous(tmp_path_factory)  # pylint: disable=protected-access
  finally:
    gin.clear_config()
  _, _, (want_weights, want_slots), _ = continuous
  cases.assert_equal(weights6 + slots6, want_weights + want_slots)
