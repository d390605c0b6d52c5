"""Tests for trax_revplus.data: byte-level inputs from local files."""

import os

import gin
import numpy as np
import pytest
from trax.data import inputs as trax_inputs

from trax_revplus import data


def _write(path, content):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'wb') as f:
    f.write(content)
  return path


@pytest.fixture(name='text_dir')
def fixture_text_dir(tmp_path):
  """Six small files of distinct printable text, no NUL bytes."""
  rng = np.random.default_rng(1)
  contents = {}
  for i in range(6):
    letters = rng.integers(ord('a'), ord('z') + 1, size=700 + 37 * i)
    content = bytes(letters.astype(np.uint8)) + b'\n'
    contents[_write(str(tmp_path / 'text' / f'f{i}.txt'), content)] = content
  return tmp_path / 'text', contents


def test_batches_have_trax_lm_shapes_dtypes_and_come_from_the_files(text_dir):
  directory, contents = text_dir
  inputs = data.local_text_inputs(
    paths=str(directory), sequence_length=32, batch_size=4, eval_batch_size=6
  )
  train = next(inputs.train_stream(1))
  evaluation = next(inputs.eval_stream(2))
  for batch, rows in ((train, 4), (evaluation, 6)):
    assert len(batch) == 3
    x, y, w = batch
    assert x.shape == y.shape == w.shape == (rows, 32)
    assert (x.dtype, y.dtype, w.dtype) == (np.int32, np.int32, np.float32)
    np.testing.assert_array_equal(x, y)
    assert x.min() >= 0 and x.max() < data.VOCAB_SIZE
  # Every training window is a run of bytes of the concatenated train files.
  corpus = data.load_corpus(
    paths=str(directory), sequence_length=32, batch_size=4
  )
  train_text = b''.join(contents[f] for f in corpus.train_files)
  eval_text = b''.join(contents[f] for f in corpus.eval_files)
  for row in train[0]:
    assert bytes(row.astype(np.uint8)) in train_text
  np.testing.assert_array_equal(train[2], np.ones((4, 32), np.float32))
  assert bytes(evaluation[0][0].astype(np.uint8)) == eval_text[:32]
  assert inputs.example_shape_dtype[0][0] == (4, 32)


def test_streams_are_deterministic_and_seed_dependent(text_dir):
  directory, _ = text_dir

  def first_batches(seed, stream):
    inputs = data.local_text_inputs(
      paths=str(directory), sequence_length=16, batch_size=2, seed=seed
    )
    it = getattr(inputs, stream)(1)
    return [next(it)[0] for _ in range(3)]

  for stream in ('train_stream', 'eval_stream'):
    np.testing.assert_array_equal(
      first_batches(0, stream), first_batches(0, stream)
    )
  assert not np.array_equal(
    first_batches(0, 'train_stream'), first_batches(1, 'train_stream')
  )


def test_default_corpus_is_the_stdlib_split_by_file(tmp_path):
  del tmp_path
  corpus = data.load_corpus(sequence_length=64, batch_size=2)
  files = data.default_corpus_files()
  root = data.default_corpus_root()
  assert files and all(f.endswith('.py') and f.startswith(root) for f in files)
  assert not any(
    part in data.DEFAULT_EXCLUDED_DIRS
    for f in files
    for part in os.path.relpath(f, root).split(os.sep)[:-1]
  )
  assert not set(corpus.train_files) & set(corpus.eval_files)
  assert sorted(corpus.train_files + corpus.eval_files) == files
  assert 0.03 < len(corpus.eval_files) / len(files) < 0.2
  expected_train = sum(os.path.getsize(f) for f in corpus.train_files)
  assert corpus.train_bytes.shape == (expected_train,)
  assert corpus.train_bytes.dtype == np.uint8
  with open(corpus.train_files[0], 'rb') as f:
    head = f.read(100)
  assert bytes(corpus.train_bytes[: len(head)]) == head


def test_file_split_of_a_file_does_not_depend_on_the_others(text_dir):
  directory, contents = text_dir
  files = sorted(contents)
  extra = [
    _write(str(directory / 'more' / f'g{i}.txt'), b'x' * 50) for i in range(30)
  ]
  train_a, eval_a = data.split_files(files + extra, 0.3, seed=0)
  train_b, eval_b = data.split_files(files + extra[:10], 0.3, seed=0)
  common = set(files + extra[:10])
  assert set(eval_a) & common == set(eval_b) & common
  assert set(train_a) & common == set(train_b) & common
  _, eval_other_seed = data.split_files(files + extra, 0.3, seed=7)
  assert eval_other_seed != eval_a


def test_eval_walks_the_whole_split_and_pads_with_zero_weight(tmp_path):
  train = _write(str(tmp_path / 'train.txt'), b'abcdefgh' * 40)
  eval_text = b'0123456789' * 7  # 70 bytes: 2 full windows of 32, 1 of 6.
  evaluation = _write(str(tmp_path / 'eval.txt'), eval_text)
  inputs = data.local_text_inputs(
    paths=train,
    eval_paths=evaluation,
    sequence_length=32,
    batch_size=1,
    eval_batch_size=3,
  )
  x, y, w = next(inputs.eval_stream(1))
  flat = x.reshape(-1)
  assert bytes(flat[:70].astype(np.uint8)) == eval_text
  assert (flat[70:] == data.PAD_ID).all()
  assert w.reshape(-1)[:70].tolist() == [1.0] * 70
  assert w.reshape(-1)[70:].tolist() == [0.0] * (96 - 70)
  np.testing.assert_array_equal(x, y)
  # The stream wraps around to the start of the eval split.
  x2, _, _ = next(inputs.eval_stream(1))
  np.testing.assert_array_equal(x2, x)


def test_eval_cycle_batches_repeat_windows_spread_over_the_split(tmp_path):
  train = _write(str(tmp_path / 'train.txt'), b'abcdefgh' * 40)
  eval_text = bytes(range(1, 201)) * 5  # 1000 bytes.
  evaluation = _write(str(tmp_path / 'eval.txt'), eval_text)
  inputs = data.local_text_inputs(
    paths=train,
    eval_paths=evaluation,
    sequence_length=10,
    batch_size=1,
    eval_batch_size=2,
    eval_cycle_batches=2,
  )
  stream = inputs.eval_stream(1)
  batches = [next(stream)[0] for _ in range(4)]
  np.testing.assert_array_equal(batches[0], batches[2])
  np.testing.assert_array_equal(batches[1], batches[3])
  starts = [bytes(row[:10].astype(np.uint8)) for b in batches[:2] for row in b]
  assert starts[0] == eval_text[:10]
  assert starts[-1] == eval_text[-10:]


def test_nul_bytes_get_zero_weight(tmp_path):
  path = _write(str(tmp_path / 'nul.txt'), (b'ab\x00cd' * 20))
  inputs = data.local_text_inputs(
    paths=path,
    sequence_length=8,
    batch_size=4,
    split_by='bytes',
    eval_fraction=0.2,
  )
  x, _, w = next(inputs.train_stream(1))
  np.testing.assert_array_equal(w, (x != 0).astype(np.float32))
  assert (w == 0).any()


def test_bytes_split_holds_out_the_tail(tmp_path):
  content = bytes((np.arange(1000) % 250 + 1).astype(np.uint8))
  path = _write(str(tmp_path / 'one.txt'), content)
  corpus = data.load_corpus(
    paths=path,
    sequence_length=16,
    batch_size=2,
    split_by='bytes',
    eval_fraction=0.25,
  )
  assert bytes(corpus.train_bytes) == content[:750]
  assert bytes(corpus.eval_bytes) == content[750:]


@pytest.mark.parametrize(
  'kwargs,message',
  [
    ({'paths': ['{tmp}/nothing/*.txt']}, 'nothing/*.txt'),
    ({'paths': ['{tmp}/empty']}, 'only empty files'),
    ({'paths': ['{tmp}/one.txt']}, 'split_by'),
    (
      {
        'paths': ['{tmp}/one.txt'],
        'split_by': 'bytes',
        'sequence_length': 5000,
      },
      'sequence_length',
    ),
    ({'paths': ['{tmp}/one.txt'], 'split_by': 'lines'}, 'split_by'),
    ({'paths': ['{tmp}/one.txt'], 'batch_size': 0}, 'batch_size'),
    ({'paths': ['{tmp}/one.txt'], 'eval_fraction': 1.5}, 'eval_fraction'),
  ],
)
def test_bad_settings_raise_a_value_error_naming_the_problem(
  tmp_path, kwargs, message
):
  _write(str(tmp_path / 'one.txt'), b'hello world\n' * 100)
  _write(str(tmp_path / 'empty' / 'a.txt'), b'')
  kwargs = {
    k: ([p.format(tmp=tmp_path) for p in v] if k == 'paths' else v)
    for k, v in kwargs.items()
  }
  with pytest.raises(data.CorpusError) as info:
    data.local_text_inputs(**kwargs)
  assert isinstance(info.value, ValueError)
  assert message in str(info.value)


def test_batch_size_must_divide_over_devices(text_dir):
  directory, _ = text_dir
  inputs = data.local_text_inputs(
    paths=str(directory), sequence_length=16, batch_size=8, eval_batch_size=6
  )
  next(inputs.train_stream(4))
  with pytest.raises(ValueError, match='batch_size = 8 is not divisible'):
    inputs.train_stream(3)
  with pytest.raises(ValueError, match='eval_batch_size = 6 is not'):
    inputs.eval_stream(4)


def test_registered_with_gin(text_dir):
  directory, _ = text_dir
  gin.clear_config()
  try:
    gin.parse_config(
      [
        f"trax_revplus.data.local_text_inputs.paths = '{directory}'",
        'local_text_inputs.sequence_length = 24',
        'local_text_inputs.batch_size = 2',
      ]
    )
    inputs = data.local_text_inputs()
    assert next(inputs.train_stream(1))[0].shape == (2, 24)
  finally:
    gin.clear_config()


# ------------------------------------------------- one slice per process --


def _global_and_process_batches(directory, batch_size, process_count, steps):
  """The single-process batches and each process's, for `steps` steps."""
  corpus = data.load_corpus(
    paths=str(directory), sequence_length=16, batch_size=batch_size
  )
  single = corpus.train_stream(1, process_index=0, process_count=1)
  whole = [next(single) for _ in range(steps)]
  per_process = []
  for i in range(process_count):
    stream = corpus.train_stream(
      1, process_index=i, process_count=process_count
    )
    per_process.append([next(stream) for _ in range(steps)])
  return whole, per_process


@pytest.mark.parametrize('process_count', [2, 4])
def test_each_process_reads_its_rows_of_the_global_batch(
  text_dir, process_count
):
  directory, _ = text_dir
  batch_size = 8
  rows = batch_size // process_count
  whole, per_process = _global_and_process_batches(
    directory, batch_size, process_count, steps=3
  )
  for step in range(3):
    assert not np.array_equal(whole[step][0], whole[(step + 1) % 3][0])
    for i in range(process_count):
      for mine, everyone in zip(per_process[i][step], whole[step]):
        assert mine.shape == (rows, 16)
        np.testing.assert_array_equal(mine, everyone[i * rows : (i + 1) * rows])


def test_two_processes_of_one_device_see_what_two_devices_of_one_see(text_dir):
  directory, _ = text_dir
  corpus = data.load_corpus(
    paths=str(directory), sequence_length=16, batch_size=6
  )
  # One stream at a time: streams of one process share trax's data counter.
  two_devices = corpus.train_stream(2, process_index=0, process_count=1)
  # How trax splits a batch over the devices of one process
  # (`tl.reshape_by_device`): device d takes rows [d * B/2, (d + 1) * B/2).
  by_device = [
    [x.reshape((2, 3) + x.shape[1:]) for x in next(two_devices)]
    for _ in range(2)
  ]
  for i in range(2):
    stream = corpus.train_stream(1, process_index=i, process_count=2)
    for step in range(2):
      for mine, devices in zip(next(stream), by_device[step]):
        np.testing.assert_array_equal(mine, devices[i])


def test_global_batch_must_divide_over_every_device_of_every_process(text_dir):
  directory, _ = text_dir
  corpus = data.load_corpus(
    paths=str(directory), sequence_length=16, batch_size=8
  )
  corpus.train_stream(2, process_index=1, process_count=2)
  corpus.train_stream(1, process_index=3, process_count=8)
  with pytest.raises(data.CorpusError) as info:
    corpus.train_stream(2, process_index=0, process_count=3)
  assert isinstance(info.value, ValueError)
  assert str(info.value) == (
    'local_text_inputs.batch_size = 8 (the global batch) is not divisible '
    'by the 6 devices of the run (3 processes x 2 local devices); choose a '
    'multiple of 6.'
  )
  with pytest.raises(data.CorpusError, match='16 devices'):
    corpus.train_stream(4, process_index=0, process_count=4)
  with pytest.raises(data.CorpusError, match='process_index = 2 is not below'):
    corpus.train_stream(1, process_index=2, process_count=2)
  with pytest.raises(data.CorpusError, match='process_count must be an int'):
    corpus.train_stream(1, process_index=0, process_count=0)


def test_a_process_stream_resumes_at_the_data_counter(text_dir):
  directory, _ = text_dir
  corpus = data.load_corpus(
    paths=str(directory), sequence_length=16, batch_size=4
  )
  whole = corpus.train_stream(1, process_index=0, process_count=1)
  expected = [next(whole) for _ in range(5)][4]
  stream = corpus.train_stream(1, process_index=1, process_count=2)
  next(stream)
  # trax's Loop restoring a checkpoint of step 4 raises the counter.
  trax_inputs.data_counters[data.TRAIN_COUNTER] = 4
  for mine, everyone in zip(next(stream), expected):
    np.testing.assert_array_equal(mine, everyone[2:])
  assert trax_inputs.data_counters[data.TRAIN_COUNTER] == 5


def test_the_process_index_and_count_come_from_jax(text_dir, monkeypatch):
  import jax  # pylint: disable=g-import-not-at-top

  directory, _ = text_dir
  corpus = data.load_corpus(
    paths=str(directory), sequence_length=16, batch_size=4
  )
  whole = next(corpus.train_stream(1, process_index=0, process_count=1))
  # As in process 1 of a 2-process run (`jax.distributed`).
  monkeypatch.setattr(jax, 'process_index', lambda: 1)
  monkeypatch.setattr(jax, 'process_count', lambda: 2)
  for mine, everyone in zip(next(corpus.train_stream(2)), whole):
    np.testing.assert_array_equal(mine, everyone[2:])
  with pytest.raises(data.CorpusError, match='2 processes x 4 local'):
    corpus.train_stream(4)


def test_settings_out_of_range_are_setting_errors(text_dir, tmp_path):
  """`trax-revplus train` reports these with exit status 2, files with 1."""
  directory, _ = text_dir
  for kwargs in (
    {'batch_size': 0},
    {'batch_size': 'abc'},
    {'split_by': 'lines'},
    {'eval_fraction': 1.5},
    {'seed': -1},
    {'paths': []},
  ):
    with pytest.raises(data.CorpusSettingError):
      data.local_text_inputs(**{'paths': str(directory), **kwargs})
  inputs = data.local_text_inputs(
    paths=str(directory), sequence_length=16, batch_size=8
  )
  with pytest.raises(data.CorpusSettingError, match='not divisible'):
    inputs.train_stream(3)
  with pytest.raises(data.CorpusError) as info:
    data.local_text_inputs(paths=str(tmp_path / 'nothing' / '*.txt'))
  assert not isinstance(info.value, data.CorpusSettingError)
