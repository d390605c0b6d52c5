"""Weights two of the trainer's layers share (`trainer._step.ties`).

Reference: stock trax's `ReversibleSerialTrainer` on the same model, inputs
and RNGs. It updates the shared weights by each holder in turn, last to
first, each with its own optimizer slots; the default `Trainer` would sum
the holders' gradients into one update, so it is no reference here.

The model shares a `tl.Dense` between the standard layers of its two
blocks: its backward depends on the shared weights' values (an input
cotangent of `ct @ W.T`), so every plan must run the earlier holder's
backward at the weights the later holder's update left, as stock does.
"""

import dataclasses
import functools

import jax
import numpy as np
import pytest
from trax import fastmath
from trax import layers as tl
from trax import optimizers
from trax.optimizers import trainer as stock_trainer

import trainer_cases as cases
from trax_revplus import trainer as rev_trainer
from trax_revplus.trainer._step import ties as ties_lib

pytestmark = pytest.mark.usefixtures('stock_trax')

_STEPS = 2


def _shared_dense_model():
  """Blocks sharing one Dense (layers 0 and 3), the loss, and the whole
  model as one Serial (initialized as trax initializes a shared layer)."""
  shared = tl.Dense(4)
  std0 = [tl.Embedding(9, 4), shared, tl.Dup()]
  revs0 = [tl.ReversibleHalfResidual(tl.Dense(4)), tl.ReversibleSwap()]
  std1 = [tl.Add(), shared, tl.Dup()]
  revs1 = [tl.ReversibleHalfResidual(tl.Dense(4)), tl.ReversibleSwap()]
  loss = tl.Serial(
    tl.Concatenate(), tl.Dense(9), tl.LogSoftmax(), tl.CrossEntropyLoss()
  )
  whole = tl.Serial(std0 + revs0 + std1 + revs1 + [loss])
  whole.init(cases.lm_batch(), rng=fastmath.random.get_prng(12))
  return [(std0, revs0), (std1, revs1)], loss


def _train(make_trainer):
  """Host leaves of every layer's weights after `_STEPS` steps of the
  trainer `make_trainer(blocks, loss)` builds, and its losses."""
  blocks, loss = _shared_dense_model()
  trainer = make_trainer(blocks, loss)
  losses = cases.train(trainer, cases.lm_batch(), _STEPS)
  weights = [layer.weights for std, revs in blocks for layer in std + revs]
  return (
    [
      np.asarray(x) for x in jax.tree_util.tree_leaves(weights + [loss.weights])
    ],
    [float(x) for x in losses],
  )


@functools.lru_cache(maxsize=1)
def _stock():
  return _train(
    lambda blocks, loss: stock_trainer.ReversibleSerialTrainer(
      blocks, loss, optimizers.Adam
    )
  )


def _ours(fused=False, **kwargs):
  def make(blocks, loss):
    trainer = rev_trainer.ReversibleSerialTrainer(
      blocks, loss, optimizers.Adam, **kwargs
    )
    if fused:
      batch = cases.lm_batch()
      cases.set_plan(trainer, batch, cases.fused_plan(trainer, batch))
    return trainer

  return make


@pytest.mark.parametrize(
  'fused,kwargs',
  [
    (False, {}),  # the planner's choice ('auto' budget)
    (
      False,
      {
        'device_memory_budget_bytes': None,
        'segment_max_layers': 1,
        'backward_segment_max_layers': 1,
      },
    ),
    (
      False,
      {
        'device_memory_budget_bytes': None,
        'segment_max_layers': 2,
        'batch_slices': 2,
      },
    ),
    (True, {}),
  ],
  ids=['planned', 'one-layer-per-call', 'segments-of-2-sliced', 'fused'],
)
def test_shared_weights_train_as_stock(fused, kwargs):
  expected_weights, expected_losses = _stock()
  weights, losses = _train(_ours(fused, **kwargs))
  np.testing.assert_allclose(losses, expected_losses, rtol=0, atol=2e-6)
  assert len(weights) == len(expected_weights)
  for got, expected in zip(weights, expected_weights):
    np.testing.assert_allclose(got, expected, rtol=0, atol=2e-6)


def test_ties_find_the_shared_leaves_in_forward_order():
  blocks, loss = _shared_dense_model()
  trainer = rev_trainer.ReversibleSerialTrainer(blocks, loss, optimizers.Adam)
  ties = trainer._store.ties  # pylint: disable=protected-access
  # Layer 0 (Embedding, Dense, Dup) reads the Dense's kernel and bias, its
  # leaves 1 and 2, from layer 3 (Add, Dense, Dup): leaves 0 and 1.
  assert ties.ties == (ties_lib.Tie(0, 1, 3, 0), ties_lib.Tie(0, 2, 3, 1))
  assert ties.across([0]) == list(ties.ties)
  assert ties.in_call([0, 1, 2, 3]) == ((0, 1, 3, 0), (0, 2, 3, 1))
  assert ties.in_call([1, 2, 3]) == ()


def test_a_model_without_shared_weights_has_no_ties():
  _, trainer, _ = cases.train_basic(n_steps=0)
  assert not trainer._store.ties  # pylint: disable=protected-access


def test_shared_weights_are_fused_unsliced_only():
  blocks, loss = _shared_dense_model()
  trainer = rev_trainer.ReversibleSerialTrainer(blocks, loss, optimizers.Adam)
  p = trainer.planner
  candidates = p.candidates(p.step_types(cases.lm_batch()))
  groups = list(candidates.groups())
  fused = [g.leanest for g in groups if g.fused_reversible_layers]
  assert [plan.batch_slices for plan in fused] == [1]
  assert {g.leanest.batch_slices for g in groups} == {1, 2, 4}
  # A sliced fused plan kept by an earlier run is not run.
  assert candidates.may_run(fused[0])
  assert not candidates.may_run(dataclasses.replace(fused[0], batch_slices=2))
