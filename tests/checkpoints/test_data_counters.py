"""trax's data position resumes from the set; its file cannot stop a run.

A counted stream (train and eval) resumes from the counters a load sets; a
set saved at an eval step keeps the eval position past the evals trax runs
after the save; an empty or garbage `data_counters0.pkl`, which stops
trax's own reader, is skipped with a warning (or set aside for a stock
Loop).
"""

import json
import pickle

import pytest

from trax.data import inputs as trax_inputs

import checkpoint_cases as cases
from checkpoint_cases import warnings_logged  # noqa: F401  # pylint: disable=unused-import
from trax_revplus import checkpoints
from trax_revplus import data


pytestmark = pytest.mark.usefixtures('stock_trax_and_empty_gin')


def test_train_stream_resumes_from_data_counters(tmp_path, monkeypatch):
  (tmp_path / 'a.txt').write_bytes(bytes(range(32, 127)) * 20)
  monkeypatch.setattr(trax_inputs, 'data_counters', {})
  corpus = data.load_corpus(
    paths=str(tmp_path / 'a.txt'),
    split_by='bytes',
    sequence_length=8,
    batch_size=2,
  )
  stream = corpus.train_stream(1)
  first = [next(stream) for _ in range(5)]
  assert trax_inputs.data_counters[data.TRAIN_COUNTER] == 5
  resumed = corpus.train_stream(1)
  cases.assert_equal(first[0], next(resumed))
  # What Loop.load_checkpoint does: replace the counters dict.
  trax_inputs.data_counters = {data.TRAIN_COUNTER: 3}
  cases.assert_equal(first[3], next(resumed))
  cases.assert_equal(first[4], next(resumed))


def test_eval_stream_resumes_from_data_counters(tmp_path, monkeypatch):
  (tmp_path / 'a.txt').write_bytes(bytes(range(32, 127)) * 20)
  monkeypatch.setattr(trax_inputs, 'data_counters', {})
  corpus = data.load_corpus(
    paths=str(tmp_path / 'a.txt'),
    split_by='bytes',
    sequence_length=8,
    batch_size=2,
    eval_cycle_batches=5,
  )
  stream = corpus.eval_stream(1)
  first = [next(stream) for _ in range(7)]
  assert trax_inputs.data_counters[data.EVAL_COUNTER] == 7
  cases.assert_equal(first[5], first[0])  # 5 batches a cycle.
  assert any((a != b).any() for a, b in zip(first[0], first[1]))
  resumed = corpus.eval_stream(1)
  cases.assert_equal(first[0], next(resumed))
  trax_inputs.data_counters = {data.EVAL_COUNTER: 3}
  cases.assert_equal(first[3], next(resumed))
  cases.assert_equal(first[4], next(resumed))


def test_a_set_saved_before_its_steps_evals_keeps_their_position(tmp_path):
  name = 'test_checkpoints/eval'
  loop = cases.make_loop(
    tmp_path, evals=True, eval_stream=data.CountedStream(name, cases.batch)
  )
  # The sample batch (1), the evals of step 1 (2 batches), then the set of
  # step 3 before its evals; the position it keeps is the one after them.
  loop.run(3)
  assert trax_inputs.data_counters[name] == 1 + 2 + 2
  manifest = json.loads((tmp_path / 'model.manifest.json').read_text())
  assert manifest['step'] == 3
  assert manifest['data_counters'][name] == 5
  with open(tmp_path / 'data_counters0.pkl', 'rb') as f:
    assert pickle.load(f) == manifest['data_counters']
  resumed = cases.make_loop(
    tmp_path, evals=True, eval_stream=data.CountedStream(name, cases.batch)
  )
  assert resumed.step == 3
  assert trax_inputs.data_counters[name] == 5
  eval_task = resumed._eval_tasks[0]  # pylint: disable=protected-access
  cases.assert_equal(eval_task.next_batch(), cases.batch(5))


def test_unreadable_data_counters_file_is_ignored(
  tmp_path, monkeypatch, warnings_logged
):
  monkeypatch.setattr(trax_inputs, 'data_counters', {'stream': 4})
  for content in (b'', b'\x80\x04not a pickle'):
    (tmp_path / 'data_counters0.pkl').write_bytes(content)
    with pytest.raises(Exception):  # noqa: B017 (as trax's own loader fails)
      checkpoints.stock_load_data_counters(str(tmp_path))
    checkpoints.load_data_counters(str(tmp_path))
    assert trax_inputs.data_counters == {'stream': 4}
    assert 'data_counters0.pkl is unreadable' in warnings_logged[-1]
    checkpoints.set_aside_unreadable_data_counters(str(tmp_path))
    assert not (tmp_path / 'data_counters0.pkl').exists()
    assert (tmp_path / 'data_counters0.pkl.unreadable').read_bytes() == (
      content
    )
