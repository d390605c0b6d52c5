"""An optimizer instance, or a bad factory, where a factory is needed."""

import functools

import pytest

from trax import layers as tl
from trax import optimizers

from conftest import dense_batch
from conftest import initialized
from conftest import split_blocks
from trax_revplus import trainer as rev_trainer
from trax_revplus import validation


pytestmark = pytest.mark.usefixtures('stock_trax')


def test_optimizer_instance_instead_of_factory():
  blocks, loss = initialized(split_blocks(), tl.L2Loss(), dense_batch())
  with pytest.raises(
    validation.OptimizerFactoryError,
    match=r'pass the class, e\.g\. trax\.optimizers\.Adam, '
    r'not trax\.optimizers\.Adam\(\)',
  ) as info:
    rev_trainer.ReversibleSerialTrainer(blocks, loss, optimizers.Adam())
  assert isinstance(info.value, TypeError)


def test_factory_not_returning_an_optimizer():
  blocks, loss = initialized(split_blocks(), tl.L2Loss(), dense_batch())
  with pytest.raises(
    validation.OptimizerFactoryError,
    match=r'optimizer_fn \(for layer 0\) returned a float, '
    r'not a trax\.optimizers\.Optimizer',
  ):
    rev_trainer.ReversibleSerialTrainer(blocks, loss, lambda: 0.01)


def test_factory_needing_arguments():
  blocks, loss = initialized(split_blocks(), tl.L2Loss(), dense_batch())

  def needs_rate(rate):
    return optimizers.Adam(rate)

  with pytest.raises(
    validation.OptimizerFactoryError,
    match=r'must be callable with no arguments.*'
    r'functools\.partial',
  ):
    rev_trainer.ReversibleSerialTrainer(blocks, loss, needs_rate)
  rev_trainer.ReversibleSerialTrainer(
    blocks, loss, functools.partial(needs_rate, 0.01)
  )
