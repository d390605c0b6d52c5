"""Damaged sets are found by size and CRC-32, and the previous set loads.

A set with a truncated weights file, a flipped byte in any of its files
(the manifest included), or an older `.pkl.gz` beside newer weights, is
detected and the previous set (step 3 of the uninterrupted run) loads
instead, bit-exactly, with one warning naming the file.
"""

import json
import shutil

import pytest

import checkpoint_cases as cases
from checkpoint_cases import continuous  # noqa: F401  # pylint: disable=unused-import
from checkpoint_cases import fixture_loader  # noqa: F401  # pylint: disable=unused-import
from checkpoint_cases import warnings_logged  # noqa: F401  # pylint: disable=unused-import
import trax_revplus
from trax_revplus import checkpoints


pytestmark = pytest.mark.usefixtures('stock_trax_and_empty_gin')


def test_truncated_weights_fall_back_to_previous_set(
  continuous, tmp_path, warnings_logged
):
  _, (weights3, slots3), _, _ = continuous
  path = cases.damaged_copy(
    continuous, tmp_path, lambda p: cases.truncate(p / 'model.weights.npy.gz')
  )
  loop = cases.make_loop(path)
  assert loop.step == 3
  cases.assert_equal(weights3, cases.weights_of(loop))
  cases.assert_equal(slots3, cases.slots_of(loop))
  assert len(warnings_logged) == 1
  assert 'model.weights.npy.gz has' in warnings_logged[0]
  assert 'loading the previous set model.prev (step 3)' in warnings_logged[0]


def test_mixed_set_falls_back_to_previous_set(
  continuous, tmp_path, warnings_logged
):
  _, (weights3, _), _, _ = continuous
  # Newer weights beside an older .pkl.gz: what a crash between trax's
  # separate file writes leaves.
  path = cases.damaged_copy(
    continuous,
    tmp_path,
    lambda p: shutil.copy(p / 'model.prev.pkl.gz', p / 'model.pkl.gz'),
  )
  loop = cases.make_loop(path)
  assert loop.step == 3
  cases.assert_equal(weights3, cases.weights_of(loop))
  assert 'model.pkl.gz' in warnings_logged[0]


def test_flipped_byte_in_each_file_falls_back_to_previous_set(
  continuous, loader, tmp_path, warnings_logged
):
  _, (weights3, slots3), (weights6, _), _ = continuous
  manifest = json.loads((continuous[0] / 'model.manifest.json').read_text())
  names = ['model' + suffix for suffix in manifest['files']]
  names.append('model.manifest.json')
  assert len(names) == 4
  for name in names:
    path = cases.damaged_copy(
      continuous,
      tmp_path / name,
      lambda p, n=name: cases.flip_middle_byte(p / n),
    )
    del warnings_logged[:]
    trax_revplus.activate()
    checkpoints.load_checkpoint(loader, str(path))
    assert loader.step == 3, name
    cases.assert_equal(weights3, cases.weights_of(loader))
    cases.assert_equal(slots3, cases.slots_of(loader))
    assert len(warnings_logged) == 1, warnings_logged
    assert name in warnings_logged[0]
    assert (
      'loading the previous set model.prev (step 3)' in (warnings_logged[0])
    )
  # The undamaged set itself loads as written.
  checkpoints.load_checkpoint(loader, str(continuous[0]))
  assert loader.step == 6
  cases.assert_equal(weights6, cases.weights_of(loader))
