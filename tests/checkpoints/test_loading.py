"""Which set `load_checkpoint` loads, and what it refuses.

A consistent set loads bit-exactly (weights, slots and the Loop's RNG of
the uninterrupted run); a set marked "installing" falls back to the
previous set, and with that damaged too nothing loads (`CheckpointError`);
a set without a manifest (written by stock trax) loads as stock trax loads
it, with a warning.
"""

import json
import os

import numpy as np
import pytest

import checkpoint_cases as cases
from checkpoint_cases import continuous  # noqa: F401  # pylint: disable=unused-import
from checkpoint_cases import fixture_loader  # noqa: F401  # pylint: disable=unused-import
from checkpoint_cases import warnings_logged  # noqa: F401  # pylint: disable=unused-import
import trax_revplus
from trax_revplus import checkpoints


pytestmark = pytest.mark.usefixtures('stock_trax_and_empty_gin')


def test_consistent_set_loads_bit_exactly(continuous):
  path, _, (weights6, slots6), rng = continuous
  loop = cases.make_loop(path)
  assert loop.step == 6
  cases.assert_equal(weights6, cases.weights_of(loop))
  cases.assert_equal(slots6, cases.slots_of(loop))
  np.testing.assert_array_equal(rng, np.asarray(loop._rng))  # pylint: disable=protected-access


def test_interrupted_install_falls_back_and_no_good_set_raises(
  continuous, tmp_path, warnings_logged
):
  def mark_installing(p):
    (p / 'model.manifest.json').write_text(
      json.dumps(dict(format=checkpoints.FORMAT, state='installing', step=9))
    )

  path = cases.damaged_copy(continuous, tmp_path, mark_installing)
  assert cases.make_loop(path).step == 3
  assert 'writing the set of step 9 was interrupted' in warnings_logged[0]
  cases.truncate(path / 'model.prev.opt_slots0.npy.gz')
  with pytest.raises(
    checkpoints.CheckpointError,
    match=r'checkpoint set model in .* is inconsistent .* no '
    r'good previous set \(model\.prev\.opt_slots0\.'
    r'npy\.gz has .*\); nothing was loaded',
  ):
    cases.make_loop(path)


def test_set_without_manifest_loads_as_stock_with_a_warning(
  continuous, loader, tmp_path, warnings_logged
):
  _, _, (weights6, _), _ = continuous

  def strip_manifests(p):
    for name in os.listdir(p):
      if name.endswith('.manifest.json'):
        os.remove(p / name)

  path = cases.damaged_copy(continuous, tmp_path, strip_manifests)
  trax_revplus.activate()
  checkpoints.load_checkpoint(loader, str(path))
  assert loader.step == 6
  cases.assert_equal(weights6, cases.weights_of(loader))
  assert len(warnings_logged) == 1
  assert (
    'has no model.manifest.json (written by stock trax, or the manifest '
    'was moved)' in (warnings_logged[0])
  )
  assert 'cannot be verified' in warnings_logged[0]
