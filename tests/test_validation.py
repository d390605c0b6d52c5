"""Bad input to the memory-efficient trainer: clear errors before any work.

Each case feeds one mistake and checks the exception type, that the message
names the problem and the fix, and that no weight changed before the error.
(NaN/Inf losses and gradients: tests/trainer/test_commit.py; the trainer's
settings: tests/trainer/test_options.py.)
"""

import functools
import os

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
from conftest import initialized
from conftest import split_blocks
from conftest import split_blocks_trainer
from trax_revplus import trainer as rev_trainer
from trax_revplus import validation


pytestmark = pytest.mark.usefixtures('stock_trax')


# Block structure.


def test_block_not_a_pair():
  blocks, loss = initialized(split_blocks(), tl.L2Loss(), dense_batch())
  bad = [blocks[0], (blocks[1][0],)]
  with pytest.raises(validation.BlockStructureError,
                     match=r'block 1 is a tuple of length 1, not a '
                           r'\(standard_layers, reversible_layers\) pair; '
                           r'build them with .*extract_reversible_blocks'):
    rev_trainer.ReversibleSerialTrainer(bad, loss, optimizers.Adam)


def test_non_reversible_layer_in_reversible_list():
  dense = tl.Dense(4)
  blocks = [([tl.Dense(4), tl.Dup()],
             [tl.ReversibleSwap(), dense]), ([tl.Concatenate()], [])]
  with pytest.raises(validation.BlockStructureError) as info:
    rev_trainer.init_reversible_blocks(
        blocks, tl.L2Loss(), shapes.signature(dense_batch()),
        fastmath.random.get_prng(0))
  message = str(info.value)
  assert 'block 0: reversible layer 1 (Dense_4, Dense)' in message
  assert 'is not a tl.ReversibleLayer' in message
  assert 'move it to the standard layers' in message
  # Raised before any initialization.
  assert not jax.tree_util.tree_leaves(dense.weights)
  assert isinstance(info.value, ValueError)


def test_standard_layers_as_a_layer_or_nested_list_as_trax_takes_them():
  # trax's trainer runs a block's standard part as tl.Serial(standard).
  for standard in (tl.Serial(tl.Dense(4), tl.Dup()), tl.Dense(4),
                   [tl.Dense(4), [tl.Dup()]], []):
    validation.check_blocks([(standard, [tl.ReversibleSwap()])])
    tl.Serial(standard)


def test_standard_or_reversible_layers_not_layers():
  with pytest.raises(validation.BlockStructureError,
                     match=r'block 0: the standard layers must be a layer or '
                           r'a list of layers, got str'):
    validation.check_blocks([('Dense', [])])
  with pytest.raises(validation.BlockStructureError,
                     match=r'block 0: standard layer 1 is a int, not a trax '
                           r'Layer'):
    validation.check_blocks([([tl.Dense(4), [3]], [])])
  with pytest.raises(validation.BlockStructureError,
                     match=r'block 0: the reversible layers must be a list '
                           r'of layers, got ReversibleHalfResidual; wrap a '
                           r'single layer in a list'):
    validation.check_blocks([([], tl.ReversibleHalfResidual(tl.Dense(4)))])


# Loss layer.


def test_loss_layer_without_scalar_output():
  not_a_loss = tl.Fn('PerExampleLoss',
                     lambda x, y, w: jnp.sum((x - y) ** 2 * w, axis=-1))
  with pytest.raises(validation.LossLayerError,
                     match=r"loss layer PerExampleLoss outputs shape \(2,\), "
                           r'not a scalar; .*average over the batch'):
    initialized(split_blocks(), not_a_loss, dense_batch())


# Devices and batch.


def test_more_devices_than_present():
  n = jax.local_device_count() + 1
  blocks, loss = initialized(split_blocks(), tl.L2Loss(), dense_batch())
  with pytest.raises(validation.DeviceCountError,
                     match=rf'n_devices={n} but this process has {n - 1} '
                           rf'local cpu device\(s\); pass n_devices between '
                           rf'1 and {n - 1}'):
    rev_trainer.ReversibleSerialTrainer(blocks, loss, optimizers.Adam,
                                        n_devices=n)


def test_batch_not_divisible_by_devices():
  x = np.zeros((6, 3))
  with pytest.raises(validation.BatchSizeError,
                     match=r'batch element 0 has batch size 6 \(shape '
                           r'\(6, 3\)\), not divisible by the 4 devices; use '
                           r'a batch size that is a multiple of 4'):
    validation.check_batch((x, x), 4)
  validation.check_batch((x, x), 3)


def test_one_step_checks_the_batch_before_any_work():
  trainer = split_blocks_trainer()
  before = host_weights_and_state(trainer)
  x, y, w = dense_batch()
  with pytest.raises(validation.BatchSizeError, match='batch element 2 is a '
                                                      'scalar'):
    trainer.one_step((x, y, np.float32(1)), fastmath.random.get_prng(0),
                     step=1)
  assert_same(before, host_weights_and_state(trainer))


# Sequence length.


def _lm_blocks(max_len):
  return [([tl.Embedding(16, 4), tl.PositionalEncoding(max_len=max_len),
            tl.Dup()],
           [tl.ReversibleHalfResidual(tl.Dense(4)), tl.ReversibleSwap()]),
          ([tl.Concatenate(), tl.Dense(16), tl.LogSoftmax()], [])]


def test_sequence_longer_than_max_len():
  blocks = _lm_blocks(max_len=6)
  sig = (shapes.ShapeDtype((2, 8), np.int32),) * 2 + (
      shapes.ShapeDtype((2, 8), np.float32),)
  with pytest.raises(validation.SequenceLengthError,
                     match=r'sequence length 8 \(axis 1 of input shape '
                           r'\(2, 8\)\) exceeds max_len=6 of '
                           r'PositionalEncoding.* in block 0; set the '
                           r"model's max_len >= 8"):
    rev_trainer.init_reversible_blocks(blocks, tl.CrossEntropyLoss(), sig,
                                       fastmath.random.get_prng(0))
  # Nothing was initialized.
  for std, rev in blocks:
    for layer in std + rev:
      assert not jax.tree_util.tree_leaves(layer.weights)


def test_sequence_within_max_len_passes():
  blocks = _lm_blocks(max_len=8)
  sig = (shapes.ShapeDtype((2, 8), np.int32),) * 2 + (
      shapes.ShapeDtype((2, 8), np.float32),)
  rev_trainer.init_reversible_blocks(blocks, tl.CrossEntropyLoss(), sig,
                                     fastmath.random.get_prng(0))


# Optimizer factory.


def test_optimizer_instance_instead_of_factory():
  blocks, loss = initialized(split_blocks(), tl.L2Loss(), dense_batch())
  with pytest.raises(validation.OptimizerFactoryError,
                     match=r'pass the class, e\.g\. trax\.optimizers\.Adam, '
                           r'not trax\.optimizers\.Adam\(\)') as info:
    rev_trainer.ReversibleSerialTrainer(blocks, loss, optimizers.Adam())
  assert isinstance(info.value, TypeError)


def test_factory_not_returning_an_optimizer():
  blocks, loss = initialized(split_blocks(), tl.L2Loss(), dense_batch())
  with pytest.raises(validation.OptimizerFactoryError,
                     match=r'optimizer_fn \(for layer 0\) returned a float, '
                           r'not a trax\.optimizers\.Optimizer'):
    rev_trainer.ReversibleSerialTrainer(blocks, loss, lambda: 0.01)


def test_factory_needing_arguments():
  blocks, loss = initialized(split_blocks(), tl.L2Loss(), dense_batch())
  def needs_rate(rate):
    return optimizers.Adam(rate)
  with pytest.raises(validation.OptimizerFactoryError,
                     match=r'must be callable with no arguments.*'
                           r'functools\.partial'):
    rev_trainer.ReversibleSerialTrainer(blocks, loss, needs_rate)
  rev_trainer.ReversibleSerialTrainer(
      blocks, loss, functools.partial(needs_rate, 0.01))


# Unknown gin knobs of ours.


def test_unknown_knob_hint_lists_our_knobs():
  import gin  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError) as info:
    gin.parse_config('trax_revplus.ReversibleSerialTrainer.no_such_knob = 1')
  gin.clear_config()
  hint = validation.unknown_knob_hint(str(info.value))
  assert hint.startswith("trax_revplus.ReversibleSerialTrainer has no knob "
                         "'no_such_knob'; its knobs: blocks, loss_layer, ")
  assert 'on_non_finite' in hint and 'n_async_layers' in hint
  assert validation.unknown_knob_hint(
      "Configurable 'ReformerLM' doesn't have a parameter named 'x'") is None


def test_cli_unknown_knob_of_ours_is_one_line(tmp_path, capsys):
  import gin  # pylint: disable=g-import-not-at-top
  from trax_revplus import cli  # pylint: disable=g-import-not-at-top
  config = os.path.join(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))), 'gin_configs', 'reformer_char_lm.gin')
  try:
    code = cli.main(['trax-revplus', 'train', f'--config_file={config}',
                     f'--output_dir={tmp_path}',
                     '--config=trax_revplus.ReversibleSerialTrainer.'
                     'no_such_knob = 1'])
  finally:
    gin.clear_config()
  err = capsys.readouterr().err.strip().splitlines()
  assert code == 2
  assert len(err) == 1
  assert err[0].startswith(
      "trax-revplus train: error: cannot apply --config='trax_revplus."
      "ReversibleSerialTrainer.no_such_knob = 1': Configurable 'trax_revplus."
      "ReversibleSerialTrainer' doesn't have a parameter named "
      "'no_such_knob'")
  assert ("; trax_revplus.ReversibleSerialTrainer has no knob 'no_such_knob';"
          " its knobs: blocks, loss_layer, optimizer_fn, n_devices") in err[0]
  assert not os.listdir(tmp_path)
