"""The non-finite guard and the commit queue, through the trainer.

NaN/Inf losses and gradient norms stop a step before its update is
committed (on_non_finite='raise'), or undo the whole step ('skip'); the
weights, slots and state compared are copies taken before the step.
"""

import jax
import numpy as np
import pytest

from trax import fastmath
from trax import layers as tl
from trax import optimizers
from trax import shapes
from trax.fastmath import numpy as jnp

from conftest import assert_same
from conftest import dense_batch
from conftest import host_weights_and_state
from conftest import split_blocks_trainer
from trax_revplus import trainer as rev_trainer
from trax_revplus import validation

pytestmark = pytest.mark.usefixtures('stock_trax')


def test_nan_loss_stops_before_any_update():
  trainer = split_blocks_trainer()
  trainer.one_step(dense_batch(), fastmath.random.get_prng(1), step=1)
  before = host_weights_and_state(trainer)
  slots_before = jax.tree_util.tree_map(np.array, trainer.slots)
  with pytest.raises(
    validation.NonFiniteError,
    match=r'loss is nan at step 2 \(phase loss, layer 4 '
    r'L2Loss.*\); no weight was updated in this step; '
    r'no checkpoint directory is set; lower the '
    r'learning rate',
  ) as info:
    trainer.one_step(dense_batch(np.nan), fastmath.random.get_prng(2), step=2)
  assert (info.value.step, info.value.phase) == (2, 'loss')
  assert_same(before, host_weights_and_state(trainer))
  assert_same(slots_before, trainer.slots)


def _sqrt_trainer(on_non_finite):
  # sqrt'(0) is inf: finite loss, non-finite gradient of the Dense below.
  sqrt = tl.Fn('Sqrt', lambda x: jnp.sqrt(jnp.abs(x)))
  blocks = [([tl.Dense(4, use_bias=False), sqrt], [])]
  loss = tl.Serial(tl.Dense(4), tl.L2Loss())
  x, y, w = dense_batch()
  rev_trainer.init_reversible_blocks(
    blocks, loss, shapes.signature((x, y, w)), fastmath.random.get_prng(0)
  )
  return rev_trainer.ReversibleSerialTrainer(
    blocks, loss, optimizers.Adam, on_non_finite=on_non_finite
  )


def test_non_finite_gradient_names_step_and_phase():
  trainer = _sqrt_trainer('raise')
  x, y, w = dense_batch()
  with pytest.raises(
    validation.NonFiniteError,
    match=r'gradients_l2 is nan at step 5 \(phase backward, '
    r'layer 0 Serial\)',
  ) as info:
    trainer.one_step(
      (np.zeros_like(x), y, w), fastmath.random.get_prng(0), step=5
    )
  assert (info.value.layer, info.value.what) == (0, 'gradients_l2')


def test_skip_mode_undoes_the_whole_step():
  trainer = _sqrt_trainer('skip')
  x, y, w = dense_batch()
  trainer.one_step((x, y, w), fastmath.random.get_prng(0), step=1)
  before = host_weights_and_state(trainer)
  slots_before = jax.tree_util.tree_map(np.array, trainer.slots)
  # The loss layer's update is finite and committed first; the Dense
  # below gets a NaN gradient, so the loss layer's update is undone too.
  loss, _ = trainer.one_step(
    (np.zeros_like(x), y, w), fastmath.random.get_prng(1), step=2
  )
  assert np.isfinite(np.asarray(loss))
  assert_same(before, host_weights_and_state(trainer))
  assert_same(slots_before, trainer.slots)
  # And training goes on.
  trainer.one_step((x, y, w), fastmath.random.get_prng(2), step=3)
  after = host_weights_and_state(trainer)
  assert not np.array_equal(
    jax.tree_util.tree_leaves(after)[0], jax.tree_util.tree_leaves(before)[0]
  )
