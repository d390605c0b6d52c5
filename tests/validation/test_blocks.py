"""Bad blocks, loss layers and sequence lengths: clear errors before any work.

Each case feeds one mistake and checks the exception type, that the message
names the problem and the fix, and that nothing was initialized before the
error.
"""

import jax
import numpy as np
import pytest

from trax import fastmath
from trax import layers as tl
from trax import optimizers
from trax import shapes
from trax.fastmath import numpy as jnp

from conftest import dense_batch
from conftest import initialized
from conftest import split_blocks
from trax_revplus import trainer as rev_trainer
from trax_revplus import validation


pytestmark = pytest.mark.usefixtures('stock_trax')


# Block structure.


def test_block_not_a_pair():
  blocks, loss = initialized(split_blocks(), tl.L2Loss(), dense_batch())
  bad = [blocks[0], (blocks[1][0],)]
  with pytest.raises(
    validation.BlockStructureError,
    match=r'block 1 is a tuple of length 1, not a '
    r'\(standard_layers, reversible_layers\) pair; '
    r'build them with .*extract_reversible_blocks',
  ):
    rev_trainer.ReversibleSerialTrainer(bad, loss, optimizers.Adam)


def test_non_reversible_layer_in_reversible_list():
  dense = tl.Dense(4)
  blocks = [
    ([tl.Dense(4), tl.Dup()], [tl.ReversibleSwap(), dense]),
    ([tl.Concatenate()], []),
  ]
  with pytest.raises(validation.BlockStructureError) as info:
    rev_trainer.init_reversible_blocks(
      blocks,
      tl.L2Loss(),
      shapes.signature(dense_batch()),
      fastmath.random.get_prng(0),
    )
  message = str(info.value)
  assert 'block 0: reversible layer 1 (Dense_4, Dense)' in message
  assert 'is not a tl.ReversibleLayer' in message
  assert 'move it to the standard layers' in message
  # Raised before any initialization.
  assert not jax.tree_util.tree_leaves(dense.weights)
  assert isinstance(info.value, ValueError)


def test_standard_layers_as_a_layer_or_nested_list_as_trax_takes_them():
  # trax's trainer runs a block's standard part as tl.Serial(standard).
  for standard in (
    tl.Serial(tl.Dense(4), tl.Dup()),
    tl.Dense(4),
    [tl.Dense(4), [tl.Dup()]],
    [],
  ):
    validation.check_blocks([(standard, [tl.ReversibleSwap()])])
    tl.Serial(standard)


def test_standard_or_reversible_layers_not_layers():
  with pytest.raises(
    validation.BlockStructureError,
    match=r'block 0: the standard layers must be a layer or '
    r'a list of layers, got str',
  ):
    validation.check_blocks([('Dense', [])])
  with pytest.raises(
    validation.BlockStructureError,
    match=r'block 0: standard layer 1 is a int, not a trax '
    r'Layer',
  ):
    validation.check_blocks([([tl.Dense(4), [3]], [])])
  with pytest.raises(
    validation.BlockStructureError,
    match=r'block 0: the reversible layers must be a list '
    r'of layers, got ReversibleHalfResidual; wrap a '
    r'single layer in a list',
  ):
    validation.check_blocks([([], tl.ReversibleHalfResidual(tl.Dense(4)))])


# Loss layer.


def test_loss_layer_without_scalar_output():
  not_a_loss = tl.Fn(
    'PerExampleLoss', lambda x, y, w: jnp.sum((x - y) ** 2 * w, axis=-1)
  )
  with pytest.raises(
    validation.LossLayerError,
    match=r'loss layer PerExampleLoss outputs shape \(2,\), '
    r'not a scalar; .*average over the batch',
  ):
    initialized(split_blocks(), not_a_loss, dense_batch())


# Sequence length.


def _lm_blocks(max_len):
  return [
    (
      [tl.Embedding(16, 4), tl.PositionalEncoding(max_len=max_len), tl.Dup()],
      [tl.ReversibleHalfResidual(tl.Dense(4)), tl.ReversibleSwap()],
    ),
    ([tl.Concatenate(), tl.Dense(16), tl.LogSoftmax()], []),
  ]


def test_sequence_longer_than_max_len():
  blocks = _lm_blocks(max_len=6)
  sig = (shapes.ShapeDtype((2, 8), np.int32),) * 2 + (
    shapes.ShapeDtype((2, 8), np.float32),
  )
  with pytest.raises(
    validation.SequenceLengthError,
    match=r'sequence length 8 \(axis 1 of input shape '
    r'\(2, 8\)\) exceeds max_len=6 of '
    r'PositionalEncoding.* in block 0; set the '
    r"model's max_len >= 8",
  ):
    rev_trainer.init_reversible_blocks(
      blocks, tl.CrossEntropyLoss(), sig, fastmath.random.get_prng(0)
    )
  # Nothing was initialized.
  for std, rev in blocks:
    for layer in std + rev:
      assert not jax.tree_util.tree_leaves(layer.weights)


def test_sequence_within_max_len_passes():
  blocks = _lm_blocks(max_len=8)
  sig = (shapes.ShapeDtype((2, 8), np.int32),) * 2 + (
    shapes.ShapeDtype((2, 8), np.float32),
  )
  rev_trainer.init_reversible_blocks(
    blocks, tl.CrossEntropyLoss(), sig, fastmath.random.get_prng(0)
  )
