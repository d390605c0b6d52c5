"""The trainer's settings beyond trax's: checked at once, with clear errors."""

import pytest

from trax import layers as tl
from trax import optimizers

import trainer_cases as cases
from conftest import split_blocks_trainer
from trax_revplus import host_memory
from trax_revplus import trainer as rev_trainer

pytestmark = pytest.mark.usefixtures('stock_trax')


def test_bad_arguments_raise_clear_errors():
  first, revs, loss = cases.basic_model()
  with pytest.raises(ValueError, match='n_async_layers'):
    rev_trainer.ReversibleSerialTrainer(
        [(first.sublayers, revs)], loss, optimizers.Adam, n_async_layers=-1)
  with pytest.raises(ValueError, match='n_devices'):
    rev_trainer.ReversibleSerialTrainer(
        [(first.sublayers, revs)], loss, optimizers.Adam, n_devices=64)
  with pytest.raises(ValueError, match='compile_ahead'):
    rev_trainer.ReversibleSerialTrainer(
        [(first.sublayers, revs)], loss, optimizers.Adam, compile_ahead='yes')
  with pytest.raises(ValueError, match='backward_segment_max_layers'):
    rev_trainer.ReversibleSerialTrainer(
        [(first.sublayers, revs)], loss, optimizers.Adam,
        backward_segment_max_layers=0)
  with pytest.raises(ValueError, match=r'host_mmap_threshold: .*\[0, '):
    rev_trainer.ReversibleSerialTrainer(
        [(first.sublayers, revs)], loss, optimizers.Adam,
        host_mmap_threshold=64 * 2**20)


def test_host_mmap_threshold_goes_to_glibc_unless_none(monkeypatch):
  thresholds = []
  monkeypatch.setattr(host_memory, 'set_mmap_threshold',
                      thresholds.append)
  batch = cases.batch()
  first, revs, loss = cases.basic_model()
  tl.Serial([first] + revs + [loss]).init(batch)
  for kwargs in (dict(host_mmap_threshold=2**20),
                 dict(host_mmap_threshold=None),
                 dict(host_mmap_threshold=0),
                 {}):
    rev_trainer.ReversibleSerialTrainer(
        [(first.sublayers, revs)], loss, optimizers.Adam,
        clear_compilation_caches=False, **kwargs)
  # The default, None, leaves glibc's own threshold.
  assert thresholds == [2**20, 0]


def test_bad_on_non_finite_value():
  with pytest.raises(ValueError, match=r"on_non_finite must be one of "
                                       r"\('raise', 'skip', 'ignore'\)"):
    split_blocks_trainer(on_non_finite='warn')
