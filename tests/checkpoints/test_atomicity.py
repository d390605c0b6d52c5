"""A set is committed as a unit; a killed first save is cleaned up.

A run of 6 steps with a set every 3 leaves the set of step 6, its manifest,
and the previous set (step 3), and nothing staged; a first save killed
while installing is removed at the next start, which trains from step 0.
"""

import json
import os

import pytest

from trax.supervised import training

import checkpoint_cases as cases
from checkpoint_cases import continuous  # noqa: F401  # pylint: disable=unused-import
from checkpoint_cases import warnings_logged  # noqa: F401  # pylint: disable=unused-import
from trax_revplus import checkpoints


pytestmark = pytest.mark.usefixtures('stock_trax_and_empty_gin')


def test_writes_sets_with_manifest_and_previous_set(continuous):
  path, *_ = continuous
  manifest = json.loads((path / 'model.manifest.json').read_text())
  assert manifest['step'] == 6 and manifest['state'] == 'complete'
  assert sorted(manifest['files']) == [
    '.opt_slots0.npy.gz',
    '.pkl.gz',
    '.weights.npy.gz',
  ]
  previous = json.loads((path / 'model.prev.manifest.json').read_text())
  assert previous['step'] == 3
  for suffix, entry in manifest['files'].items():
    assert os.path.getsize(path / f'model{suffix}') == entry['bytes']
  assert not [n for n in os.listdir(path) if '.tmp' in n or '_tmp_' in n]
  assert (
    training.unpickle_from_file(str(path / 'model.pkl.gz'), gzip=True)['step']
    == 6
  )


def test_interrupted_first_save_is_removed_and_training_starts_over(
  continuous, tmp_path, warnings_logged
):
  def first_save_killed_while_installing(p):
    for name in os.listdir(p):
      if name.startswith('model.prev.'):
        os.remove(p / name)
    os.remove(p / 'model.pkl.gz')  # Not installed yet; the others are.
    (p / 'model.manifest.json').write_text(
      json.dumps(dict(format=checkpoints.FORMAT, state='installing', step=1))
    )
    (p / 'model.tmp').mkdir()
    (p / 'model.tmp' / 'model.pkl.gz._tmp_').write_bytes(b'\x1f\x8b')

  path = cases.damaged_copy(
    continuous, tmp_path, first_save_killed_while_installing
  )
  loop = cases.make_loop(path)
  assert loop.step == 0
  assert not [n for n in os.listdir(path) if n.startswith('model.')]
  assert 'the first save of checkpoint model' in warnings_logged[0]
  assert 'was interrupted before it was complete' in warnings_logged[0]
