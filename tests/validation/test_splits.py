"""Bad device counts and batch sizes: clear errors before any work.

(NaN/Inf losses and gradients: tests/trainer/test_commit.py; the trainer's
settings: tests/trainer/test_options.py.)
"""

import jax
import numpy as np
import pytest

from trax import fastmath
from trax import layers as tl
from trax import optimizers

from conftest import assert_same
from conftest import dense_batch
from conftest import host_weights_and_state
from conftest import initialized
from conftest import split_blocks
from conftest import split_blocks_trainer
from trax_revplus import trainer as rev_trainer
from trax_revplus import validation


pytestmark = pytest.mark.usefixtures('stock_trax')


def test_more_devices_than_present():
  n = jax.local_device_count() + 1
  blocks, loss = initialized(split_blocks(), tl.L2Loss(), dense_batch())
  with pytest.raises(
    validation.DeviceCountError,
    match=rf'n_devices={n} but this process has {n - 1} '
    rf'local cpu device\(s\); pass n_devices between '
    rf'1 and {n - 1}',
  ):
    rev_trainer.ReversibleSerialTrainer(
      blocks, loss, optimizers.Adam, n_devices=n
    )


def test_batch_not_divisible_by_devices():
  x = np.zeros((6, 3))
  with pytest.raises(
    validation.BatchSizeError,
    match=r'batch element 0 has batch size 6 \(shape '
    r'\(6, 3\)\), not divisible by the 4 devices; use '
    r'a batch size that is a multiple of 4',
  ):
    validation.check_batch((x, x), 4)
  validation.check_batch((x, x), 3)


def test_one_step_checks_the_batch_before_any_work():
  trainer = split_blocks_trainer()
  before = host_weights_and_state(trainer)
  x, y, w = dense_batch()
  with pytest.raises(
    validation.BatchSizeError, match='batch element 2 is a scalar'
  ):
    trainer.one_step((x, y, np.float32(1)), fastmath.random.get_prng(0), step=1)
  assert_same(before, host_weights_and_state(trainer))
