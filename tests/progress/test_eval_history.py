"""Eval losses kept across resumes: merged with the Loop's history, dropped
past the Loop's step, a damaged file ignored with one warning line."""

import json
import os

from absl import logging

from trax_revplus.progress import eval_history


def _kept(path):
  with open(os.path.join(path, eval_history.FILENAME)) as f:
    return json.load(f)['losses']


def test_kept_evals_fill_in_what_the_history_lacks(tmp_path):
  d = str(tmp_path)
  assert eval_history.merged(d, [(1, 3.0), (2, 2.5)], 2, write=True) == [
    (1, 3.0),
    (2, 2.5),
  ]
  # A resumed run's history lacks step 2; its own evals are added.
  assert eval_history.merged(d, [(1, 3.0)], 3, write=True) == [
    (1, 3.0),
    (2, 2.5),
  ]
  assert eval_history.merged(d, [(1, 3.0), (4, 2.0)], 4, write=True) == [
    (1, 3.0),
    (2, 2.5),
    (4, 2.0),
  ]
  assert _kept(d) == [[1, 3.0], [2, 2.5], [4, 2.0]]
  # The history wins where both hold a step; evals past the Loop's step
  # belong to checkpoints that are gone.
  assert eval_history.merged(d, [(1, 9.0)], 1, write=False) == [(1, 9.0)]
  assert _kept(d) == [[1, 3.0], [2, 2.5], [4, 2.0]]  # not written


def test_without_an_output_directory_the_history_alone(tmp_path):
  assert eval_history.merged(None, [(2, 1.5)], 2, write=True) == [(2, 1.5)]
  assert not os.listdir(tmp_path)


def test_a_damaged_or_foreign_file_is_ignored_with_one_warning(
  tmp_path, monkeypatch
):
  warnings = []
  monkeypatch.setattr(
    logging, 'warning', lambda msg, *args: warnings.append(msg % args)
  )
  path = os.path.join(tmp_path, eval_history.FILENAME)
  for content in (
    b'\x91garbage',
    b'',
    b'{"format": "other", "losses": []}',
    b'{"format": "%s", "losses": [[1]]}' % eval_history.FORMAT.encode(),
  ):
    with open(path, 'wb') as f:
      f.write(content)
    warnings.clear()
    assert eval_history.merged(str(tmp_path), [(3, 1.0)], 3, write=True) == [
      (3, 1.0)
    ]
    assert len(warnings) == 1 and 'ignored' in warnings[0], warnings
    assert _kept(tmp_path) == [[3, 1.0]]  # written afresh
