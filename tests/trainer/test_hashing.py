"""Layers that hash their activations, and the plan that keeps stock's
summation order for them.

References: functions whose discrete choices are known by construction;
trax's layers (its LSH attention layers hash: `hash_vecs` takes an argmax
over random rotations of the activations; its other attention layers do
not); and stock trax's `ReversibleSerialTrainer` on the same LSH
ReformerLMs, inputs and RNGs, against which the plan chosen with no
settings must give the same weights.
"""

import functools

import jax
from jax import lax
from jax import numpy as jnp
import numpy as np
import pytest
import trax
from trax import layers as tl
from trax import shapes

import trainer_cases as cases
from trax_revplus import trainer as rev_trainer
from trax_revplus.trainer._search import hashing
from trax_revplus.trainer._search import rng_use

pytestmark = pytest.mark.usefixtures('stock_trax')


_X = jax.ShapeDtypeStruct((4, 3), jnp.float32)


def _hashes(fn, x=_X):
  return hashing.hashes_activations(jax.make_jaxpr(fn)(x, rng_use.RNG_TYPE))


def test_a_choice_on_floats_computed_from_the_inputs_hashes():
  assert _hashes(lambda x, rng: jnp.argmax(x @ jnp.ones((3, 5)), axis=-1))
  assert _hashes(lambda x, rng: jnp.argmin(x, axis=0))
  assert _hashes(lambda x, rng: jnp.sort(x, axis=-1))
  assert _hashes(lambda x, rng: jnp.argsort(x[:, 0]))
  assert _hashes(lambda x, rng: lax.top_k(x, 2)[1])


def test_no_choice_or_a_choice_on_other_values_does_not():
  assert not _hashes(lambda x, rng: jax.nn.softmax(x) * jnp.max(x))
  assert not _hashes(lambda x, rng: jnp.argmax(x.astype(jnp.int32), axis=0))
  # Drawn from the RNG alone: the same in any summation order.
  assert not _hashes(
    lambda x, rng: x + jnp.argmax(jax.random.uniform(rng, (3,)))
  )
  # Sorted by int keys: the floats only travel with them.
  assert not _hashes(
    lambda x, rng: lax.sort((jnp.arange(4)[::-1], x[:, 0]), num_keys=1)[1]
  )


def test_calls_and_loops_are_followed_inside():
  @jax.jit
  def jitted(x, rng):
    del rng
    return jnp.argmax(x, axis=-1)

  @jax.custom_vjp
  def custom(x, rng):
    del rng
    return jnp.sort(x)

  custom.defvjp(lambda x, rng: (custom(x, rng), None), lambda _, g: (g, None))

  def looped(x, rng):
    del rng

    def body(carry, row):
      return carry + jnp.argmax(row), None

    return lax.scan(body, 0, x)[0]

  assert _hashes(jitted)
  assert _hashes(custom)
  assert _hashes(looped)


def _trainer(model, batch):
  """Ours with no settings on `model` (initialized for `batch`)."""
  blocks, loss = rev_trainer.extract_reversible_blocks(
    [model, tl.WeightedCategoryCrossEntropy()]
  )
  rev_trainer.init_reversible_blocks(
    blocks, loss, shapes.signature(batch), trax.fastmath.random.get_prng(3)
  )
  return rev_trainer.ReversibleSerialTrainer(blocks, loss, trax.optimizers.Adam)


def _pure_lsh_lm():
  """A ReformerLM with `PureLSHSelfAttention` as trax's
  terraformer_purelsh_copy.gin wraps it (factored buckets)."""
  return trax.models.ReformerLM(
    16,
    d_model=16,
    d_ff=32,
    d_attention_key=8,
    d_attention_value=8,
    n_layers=1,
    n_heads=2,
    max_len=32,
    dropout=0.0,
    mode='train',
    attention_type=functools.partial(
      tl.PureLSHSelfAttentionWrapper,
      pure_lsh_implementation=tl.PureLSHSelfAttention,
      chunk_len=4,
      n_buckets=[2, 2],
      n_hashes=2,
    ),
  )


@pytest.mark.parametrize(
  'model,hashes',
  [
    (cases.lsh_model, True),
    (_pure_lsh_lm, True),
    (functools.partial(cases.self_attention_lm, 0.1), False),
    (
      functools.partial(
        trax.models.TransformerLM,
        16,
        d_model=16,
        d_ff=32,
        n_layers=1,
        n_heads=2,
        mode='train',
      ),
      False,
    ),
  ],
  ids=[
    'LSHSelfAttention',
    'PureLSHSelfAttention',
    'SelfAttention',
    'Attention',
  ],
)
def test_trax_s_lsh_layers_hash_and_its_other_attention_does_not(model, hashes):
  batch = cases.self_attention_lm_batch()
  planner = _trainer(model(), batch).planner
  trace, _ = planner._facts.trace(planner.step_types(batch))  # pylint: disable=protected-access
  assert trace.hashes_activations == hashes


def _ours(made, **kwargs):
  """Builds ours with `kwargs` and appends it to the list `made`."""

  def make(blocks, loss):
    made.append(
      rev_trainer.ReversibleSerialTrainer(
        blocks, loss, trax.optimizers.Adam, **kwargs
      )
    )
    return made[-1]

  return make


_STEPS = 10


@functools.lru_cache(maxsize=1)
def _stock_tiny_lsh_lm():
  return cases.train_lm(
    cases.stock_trainer,
    cases.lsh_model(n_parallel_heads=None),
    cases.self_attention_lm_batch(),
    _STEPS,
  )


@pytest.mark.parametrize(
  'kwargs',
  [{}, {'segment_max_layers': 2}],
  ids=['no-settings', 'segments-of-2'],
)
def test_an_lsh_lm_trains_as_stock(kwargs):
  """10 steps of a tiny LSH ReformerLM, its LSH layers computing all
  (example, head) pairs at once: with memory to spare the plan keeps
  stock's summation order on every backend, the CPU's included (no slices,
  chunks or micro-batches, the attention layers as configured), and gives
  stock's weights within 1e-6; with the fused program (no settings) and
  with segments."""
  made = []
  batch = cases.self_attention_lm_batch()
  weights, losses = cases.train_lm(
    _ours(made, **kwargs), cases.lsh_model(n_parallel_heads=None), batch, _STEPS
  )
  plan = made[0].planned(batch).plan
  assert (
    plan.batch_slices,
    plan.sequence_chunks,
    plan.micro_batches,
    plan.parallel_heads,
  ) == (1, 1, 1, None)
  assert (plan.fused_from == 0) == (not kwargs)
  expected_weights, expected_losses = _stock_tiny_lsh_lm()
  np.testing.assert_allclose(losses, expected_losses, rtol=0, atol=1e-6)
  cases.assert_all_close(expected_weights, weights, tol=1e-6)


def _enwik8_lsh_lm():
  """trax's enwik8 ReformerLM's LSH attention as its config sets it
  (chunk_len 256, n_buckets 512, n_hashes 2, one chunk before, none after)
  in 4 layers of d_model 32 over length 512, without dropout."""
  return trax.models.ReformerLM(
    256,
    d_model=32,
    d_ff=64,
    d_attention_key=16,
    d_attention_value=16,
    n_layers=4,
    n_heads=2,
    max_len=512,
    dropout=0.0,
    ff_activation=tl.Relu,
    mode='train',
    attention_type=functools.partial(
      tl.LSHSelfAttention,
      chunk_len=256,
      n_buckets=512,
      n_chunks_before=1,
      n_chunks_after=0,
      n_hashes=2,
    ),
  )


@pytest.mark.slow
def test_trax_s_enwik8_lsh_attention_trains_as_stock():
  """There, on the CPU, 2 slices moved positions to other buckets within
  10 steps: the weights ended 0.16 away from stock's."""
  rs = np.random.RandomState(2)
  tokens = rs.randint(1, 256, size=(4, 512)).astype(np.int32)
  batch = (tokens, tokens, np.ones_like(tokens, dtype=np.float32))
  expected_weights, expected_losses = cases.train_lm(
    cases.stock_trainer, _enwik8_lsh_lm(), batch, _STEPS
  )
  weights, losses = cases.train_lm(_ours([]), _enwik8_lsh_lm(), batch, _STEPS)
  np.testing.assert_allclose(losses, expected_losses, rtol=0, atol=1e-6)
  cases.assert_all_close(expected_weights, weights, tol=1e-6)


@pytest.mark.parametrize('lsh', [False, True], ids=['self-attention', 'lsh'])
def test_without_a_budget_models_train_bit_for_bit(lsh):
  """The one setting that runs stock's summation order where the default
  would not (on the CPU, 2 slices and one attention pair at a time without
  hashing; the fused program): the settings as given, unplanned
  (`device_memory_budget_bytes = None`)."""
  made = []
  ours = _ours(made, device_memory_budget_bytes=None)
  batch = cases.self_attention_lm_batch()
  if lsh:
    weights, losses = cases.train_lm(
      ours, cases.lsh_model(n_parallel_heads=None), batch, _STEPS
    )
    expected_weights, expected_losses = _stock_tiny_lsh_lm()
  else:
    weights, losses = cases.train_self_attention_lm(ours, 0.1)
    expected_weights, expected_losses = cases.stock_self_attention_lm(0.1)
  plan = made[0].planned(batch).plan
  assert (
    plan.batch_slices,
    plan.sequence_chunks,
    plan.micro_batches,
    plan.parallel_heads,
    plan.fused_from,
  ) == (1, 1, 1, None, plan.loss)
  assert losses == expected_losses
  cases.assert_all_close(expected_weights, weights, tol=0)
