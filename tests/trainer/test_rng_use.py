"""Whether a layer's results depend on its RNG, read from its jaxpr.

Reference: the layer run on two different RNGs (`pure_fn`, trax's own
forward); a layer whose results differ uses its RNG, and one whose results
are equal on every RNG tried does not.
"""

import jax
from jax import numpy as jnp
import numpy as np
import pytest
from trax import layers as tl
from trax import models
from trax import shapes

from trax_revplus.trainer._search import rng_use

pytestmark = pytest.mark.usefixtures('stock_trax')


def _jaxpr(fn, *args):
  return jax.make_jaxpr(fn)(*args, rng_use.RNG_TYPE)


def _x():
  return jax.ShapeDtypeStruct((2, 3), jnp.float32)


def _reformer(dropout):
  model = models.ReformerLM(
    32,
    d_model=8,
    d_ff=16,
    n_layers=1,
    n_heads=2,
    max_len=16,
    dropout=dropout,
    mode='train',
    attention_type=tl.SelfAttention,
  )
  model.init(shapes.signature(np.zeros((2, 16), np.int32)))
  return model


def _differs_on_two_rngs(layer, x):
  """Trax's own forward on two RNGs: whether any result differs."""
  results = [
    layer.pure_fn(x, layer.weights, layer.state, jax.random.PRNGKey(seed))
    for seed in (1, 2)
  ]
  return any(
    not np.array_equal(a, b)
    for a, b in zip(
      jax.tree_util.tree_leaves(results[0]),
      jax.tree_util.tree_leaves(results[1]),
    )
  )


@pytest.mark.parametrize('dropout', [0.0, 0.1])
def test_a_reformer_uses_its_rng_exactly_where_its_results_depend_on_it(
  dropout,
):
  model = _reformer(dropout)
  x = np.arange(32, dtype=np.int32).reshape((2, 16)) % 32
  uses = rng_use.forward_types(model, jax.ShapeDtypeStruct(x.shape, x.dtype))[1]
  assert uses == _differs_on_two_rngs(model, x) == (dropout > 0)


def test_outputs_and_their_types_are_trax_s_own():
  model = _reformer(0.0)
  x = jax.ShapeDtypeStruct((2, 16), np.int32)
  outputs, _ = rng_use.forward_types(model, x)
  expected, _ = jax.eval_shape(
    model.pure_fn, x, model.weights, model.state, rng_use.RNG_TYPE
  )
  assert outputs == expected


def test_a_draw_counts_and_an_unread_rng_does_not():
  assert rng_use.depends_on_last_input(
    _jaxpr(lambda x, rng: x + jax.random.uniform(rng, x.shape), _x())
  )
  assert not rng_use.depends_on_last_input(_jaxpr(lambda x, rng: 2 * x, _x()))
  assert rng_use.depends_on_last_input(_jaxpr(lambda x, rng: rng, _x()))


def test_calls_are_followed_inside():
  @jax.jit
  def ignores(x, rng):
    del rng
    return x + 1

  @jax.custom_vjp
  def custom(x, rng):
    del rng
    return x

  custom.defvjp(lambda x, rng: (x, None), lambda _, g: (g, None))

  @jax.checkpoint
  def remat(x, rng):
    return x * jax.random.uniform(rng, x.shape)

  assert not rng_use.depends_on_last_input(_jaxpr(ignores, _x()))
  assert not rng_use.depends_on_last_input(_jaxpr(custom, _x()))
  assert rng_use.depends_on_last_input(_jaxpr(remat, _x()))
  # A split whose keys are dropped is not a use.
  assert not rng_use.depends_on_last_input(
    _jaxpr(lambda x, rng: (jax.random.split(rng), x)[1], _x())
  )


def test_a_loop_over_the_rng_counts_as_a_use():
  def loop(x, rng):
    def body(carry, _):
      y, key = carry
      return (2 * y, jax.random.split(key)[0]), None

    (y, _), _ = jax.lax.scan(body, (x, rng), None, length=2)
    return y

  # The carry's x never reads the RNG, but a loop counts whole: a draw may
  # be reported where there is none, never the reverse.
  assert rng_use.depends_on_last_input(_jaxpr(loop, _x()))
