"""Byte-level language-model inputs read from local text files.

`local_text_inputs` builds a `trax.data.Inputs` from files on this machine, so
a training run needs neither a download nor a TFDS data directory. By default
it reads the `.py` sources of the running Python's standard library (about
700 files, 10-15 MB, found via `sysconfig`), which is real text on every
machine; any files, directories or globs can be named instead, e.g. a local
copy of enwik8. Use it in gin as::

    train.inputs = @trax_revplus.data.local_text_inputs
    local_text_inputs.sequence_length = 256
    local_text_inputs.batch_size = 8

Tokens are bytes: vocab size 256, token id = byte value. Id 0 doubles as the
padding id (trax's `ShiftRight` also feeds 0 as the start token), so every
position whose target is 0 gets loss weight 0: padding at the end of the eval
split and the NUL bytes that a text file practically never contains.

The corpus of each split is one contiguous `uint8` buffer in host memory (one
byte per token); batches are gathered from it, never re-read from disk.
The train stream resumes: batch n is a function of `seed` and n only, and the
stream keeps n in trax's data counters (`trax.data.inputs.data_counters`,
name `TRAIN_COUNTER`), which trax's `Loop` saves with each checkpoint and
loads before training; a restarted run continues with the batch after the
checkpoint's step instead of the first. In a multi-process run
(`jax.distributed`) each process reads its own rows of the same global
batch. Nothing here touches the network. TFDS datasets remain usable through trax's
own `trax.data.batcher` / `data_streams` configs.
"""

import fnmatch
import glob
import hashlib
import os
import sysconfig

from absl import logging
import gin
import numpy as np
from trax.data import inputs as trax_inputs

VOCAB_SIZE = 256
PAD_ID = 0

# Directory names skipped in the default corpus: third-party code installed
# next to the standard library, and the stdlib's own test suites (they hold
# deliberately malformed and binary-ish sources).
DEFAULT_EXCLUDED_DIRS = ('site-packages', 'dist-packages', '__pycache__',
                         'test', 'tests', 'idle_test')

_SPLITS = ('file', 'bytes')

# Key of the train stream's position in trax's data counters.
TRAIN_COUNTER = 'trax_revplus.data.local_text_inputs/train'


class CorpusError(ValueError):
  """A corpus or batching setting that cannot work; the message says why.

  Raised as is when the files named do not make a corpus (no match, empty,
  too short); as `CorpusSettingError` when a setting is out of range.
  """


class CorpusSettingError(CorpusError):
  """A `local_text_inputs` setting out of range, whatever the files hold.

  E.g. a batch size that is not a positive int or does not divide over the
  devices, or an unknown `split_by`.
  """


def default_corpus_root():
  """Returns the directory of the running Python's standard library (str)."""
  return sysconfig.get_paths()['stdlib']


def default_corpus_files(root=None, exclude_dirs=DEFAULT_EXCLUDED_DIRS):
  """Lists the `*.py` files of the standard library, sorted.

  Args:
    root: Directory to search (str); the stdlib of the running Python if None.
    exclude_dirs: Directory names (not paths) whose subtrees are skipped.

  Returns:
    Sorted list of absolute file paths (str).

  Raises:
    CorpusError: If no `.py` file is found under `root`.
  """
  root = os.path.abspath(root or default_corpus_root())
  excluded = set(exclude_dirs or ())
  files = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = [d for d in dirnames if d not in excluded]
    files.extend(os.path.join(dirpath, f)
                 for f in fnmatch.filter(filenames, '*.py'))
  if not files:
    raise CorpusError(f'No *.py files found under the standard library '
                      f'directory {root!r}; name files with '
                      f'local_text_inputs.paths.')
  return sorted(files)


def resolve_paths(paths):
  """Expands files, directories and globs into a sorted list of files.

  Args:
    paths: A str or a sequence of str. Each entry is a file, a directory (all
      regular files below it, recursively) or a glob pattern (`**` matches
      any number of directories). `~` is expanded.

  Returns:
    Sorted list of unique absolute file paths (str).

  Raises:
    CorpusError: If `paths` is empty or an entry matches no regular file or
      only empty files.
  """
  if isinstance(paths, (str, os.PathLike)):
    paths = [paths]
  paths = list(paths or ())
  if not paths:
    raise CorpusSettingError('local_text_inputs.paths is empty; give at least one '
                      'file, directory or glob, or None for the default '
                      'corpus.')
  files = set()
  for entry in paths:
    pattern = os.path.expanduser(os.fspath(entry))
    if os.path.isdir(pattern):
      matched = [os.path.join(d, f)
                 for d, _, names in os.walk(pattern) for f in names]
    else:
      matched = glob.glob(pattern, recursive=True)
    matched = [os.path.abspath(m) for m in matched if os.path.isfile(m)]
    if not matched:
      raise CorpusError(f'Path or glob {entry!r} matches no file; check the '
                        f'spelling or the working directory '
                        f'({os.getcwd()!r}).')
    if not any(os.path.getsize(m) for m in matched):
      raise CorpusError(f'Path or glob {entry!r} matches only empty files.')
    files.update(matched)
  return sorted(files)


def read_bytes(files):
  """Reads and concatenates files into one byte buffer.

  Args:
    files: Sequence of file paths (str), read in the given order.

  Returns:
    1-D `np.uint8` array of length sum of the file sizes (bytes).
  """
  sizes = [os.path.getsize(f) for f in files]
  buffer = np.empty(sum(sizes), dtype=np.uint8)
  view = memoryview(buffer)
  position = 0
  for path, size in zip(files, sizes):
    with open(path, 'rb') as f:
      # A file may shrink between getsize and read; keep what was read.
      position += f.readinto(view[position:position + size])
  return buffer[:position]


def _split_score(relative_path, seed):
  """A deterministic pseudo-random number in [0, 1) for one file."""
  digest = hashlib.sha256(f'{seed}:{relative_path}'.encode('utf-8')).digest()
  return int.from_bytes(digest[:8], 'big') / 2.0**64


def split_files(files, eval_fraction, seed=0):
  """Assigns whole files to train or eval, deterministically.

  The assignment of a file depends only on its path relative to the files'
  common directory and on `seed`, so it is the same on every machine and does
  not change when other files are added or removed. Each split gets at least
  one file.

  Args:
    files: Sequence of at least 2 file paths (str).
    eval_fraction: Expected fraction of files in eval, in (0, 1).
    seed: int; changes the assignment.

  Returns:
    (train_files, eval_files): two disjoint sorted lists of paths.

  Raises:
    CorpusError: If fewer than 2 files are given.
  """
  files = sorted(files)
  if len(files) < 2:
    raise CorpusError(
        f'{len(files)} file(s) matched, but a per-file train/eval split needs '
        f'at least 2. Set local_text_inputs.split_by = "bytes" (eval is the '
        f'last eval_fraction of the bytes) or name eval files with '
        f'local_text_inputs.eval_paths.')
  root = os.path.commonpath(files)
  scored = sorted(
      (_split_score(os.path.relpath(f, root).replace(os.sep, '/'), seed), f)
      for f in files)
  n_eval = sum(1 for score, _ in scored if score < eval_fraction)
  n_eval = min(max(n_eval, 1), len(files) - 1)
  eval_files = sorted(f for _, f in scored[:n_eval])
  train_files = sorted(f for _, f in scored[n_eval:])
  return train_files, eval_files


def _check_positive_int(name, value):
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
    raise CorpusSettingError(f'local_text_inputs.{name} must be an int, got '
                      f'{value!r}.')
  if value < 1:
    raise CorpusSettingError(
        f'local_text_inputs.{name} must be >= 1, got {value}.')


def _check_divisible(name, batch_size, n_devices):
  if batch_size % n_devices:
    raise CorpusSettingError(
        f'local_text_inputs.{name} = {batch_size} is not divisible by the '
        f'{n_devices} devices; choose a multiple of {n_devices}.')


def _this_process():
  """(index, count) of this process in a multi-process JAX run."""
  import jax  # pylint: disable=g-import-not-at-top
  return jax.process_index(), jax.process_count()


def _check_process_split(batch_size, n_devices, process_index,
                         process_count):
  """Checks that the global batch splits over processes, then devices."""
  for name, value, low in (('process_count', process_count, 1),
                           ('process_index', process_index, 0)):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or (
        value < low):
      raise CorpusSettingError(f'{name} must be an int >= {low}, got {value!r}.')
  if process_index >= process_count:
    raise CorpusSettingError(f'process_index = {process_index} is not below '
                      f'process_count = {process_count}.')
  total = n_devices * process_count
  if batch_size % total:
    raise CorpusSettingError(
        f'local_text_inputs.batch_size = {batch_size} (the global batch) is '
        f'not divisible by the {total} devices of the run ({process_count} '
        f'processes x {n_devices} local devices); choose a multiple of '
        f'{total}.')


def _batch(buffer, offsets, sequence_length):
  """Gathers windows of `buffer` at `offsets`; zero-pads past its end.

  Returns:
    (inputs, targets, weights): int32, int32 and float32 arrays of shape
    (len(offsets), sequence_length); inputs and targets are the same array
    values (trax LMs shift right internally).
  """
  index = np.asarray(offsets)[:, None] + np.arange(sequence_length)[None, :]
  padded = index >= buffer.shape[0]
  tokens = buffer[np.minimum(index, buffer.shape[0] - 1)].astype(np.int32)
  tokens[padded] = PAD_ID
  weights = (tokens != PAD_ID).astype(np.float32)
  return tokens, tokens.copy(), weights


class LocalTextCorpus:
  """Train and eval byte buffers with their batch streams.

  Attributes:
    train_bytes: 1-D np.uint8 array, the train split.
    eval_bytes: 1-D np.uint8 array, the eval split.
    train_files: Sorted list of the files read for train (str).
    eval_files: Sorted list of the files read for eval (str); with
      split_by="bytes" the same as train_files.
  """

  def __init__(self, train_bytes, eval_bytes, train_files, eval_files,
               sequence_length, batch_size, eval_batch_size,
               eval_cycle_batches, seed):
    self.train_bytes = train_bytes
    self.eval_bytes = eval_bytes
    self.train_files = train_files
    self.eval_files = eval_files
    self._sequence_length = sequence_length
    self._batch_size = batch_size
    self._eval_batch_size = eval_batch_size
    self._seed = seed
    length = eval_bytes.shape[0]
    if eval_cycle_batches is None:
      # Every eval byte once, in order; the last window is zero-padded.
      self._eval_offsets = np.arange(0, length, sequence_length)
    else:
      # A fixed sample spread evenly over the whole split, so that every
      # eval round of a run scores the same windows.
      n_windows = eval_cycle_batches * eval_batch_size
      last = max(length - sequence_length, 0)
      self._eval_offsets = np.linspace(0, last, n_windows).astype(np.int64)

  def train_stream(self, n_devices, process_index=None, process_count=None):
    """Returns an endless iterator of random training windows.

    Mirrors the stream functions of `trax.data.inputs.Inputs`. In a
    multi-process run each process reads its own rows of the global batch:
    process i of P yields rows [i * B / P, (i + 1) * B / P) of the batch of
    B = batch_size rows that a single process would yield at the same
    position, so P processes x D devices train on exactly what one process
    with P * D devices does.

    Args:
      n_devices: int, number of devices of this process the batch is split
        over.
      process_index: int in [0, process_count), this process; None for
        `jax.process_index()`.
      process_count: int >= 1, processes of the run; None for
        `jax.process_count()`.

    Returns:
      Iterator of (inputs, targets, weights) with shapes
      (batch_size / process_count, sequence_length), dtypes int32, int32,
      float32. The same `seed` gives the same sequence of batches on every
      call. Making the stream sets its position (`trax.data.inputs.
      data_counters[TRAIN_COUNTER]`, the number of batches yielded) to 0;
      when that counter is later raised (trax's `Loop` restoring a
      checkpoint), the stream jumps ahead to it.

    Raises:
      CorpusSettingError: If batch_size is not divisible by n_devices times
        process_count, or the process index or count is out of range.
    """
    if process_index is None or process_count is None:
      this_index, this_count = _this_process()
      process_index = this_index if process_index is None else process_index
      process_count = this_count if process_count is None else process_count
    _check_divisible('batch_size', self._batch_size, n_devices)
    _check_process_split(self._batch_size, n_devices, process_index,
                         process_count)
    trax_inputs.data_counters[TRAIN_COUNTER] = 0
    return self._train_batches(process_index, process_count)

  def train_batch(self, index, process_index=0, process_count=1):
    """Returns training batch number `index` (int >= 0) of the stream.

    Args:
      index: int >= 0, the batch's position in the stream.
      process_index: int, this process's index (see `train_stream`).
      process_count: int, processes the global batch is split over.

    Returns:
      (inputs, targets, weights), each of shape
      (batch_size / process_count, sequence_length): the process's rows of
      the global batch.
    """
    high = self.train_bytes.shape[0] - self._sequence_length + 1
    rng = np.random.default_rng([self._seed, index])
    offsets = rng.integers(0, high, size=self._batch_size)
    rows = self._batch_size // process_count
    offsets = offsets[process_index * rows:(process_index + 1) * rows]
    return _batch(self.train_bytes, offsets, self._sequence_length)

  def _train_batches(self, process_index, process_count):
    index = 0
    while True:
      # Read at every batch: trax's Loop replaces the whole dict when it
      # loads the counters of a checkpoint.
      index = max(index, trax_inputs.data_counters.get(TRAIN_COUNTER, 0))
      batch = self.train_batch(index, process_index, process_count)
      index += 1
      trax_inputs.data_counters[TRAIN_COUNTER] = index
      yield batch

  def eval_stream(self, n_devices):
    """Returns an endless iterator cycling over fixed eval windows.

    Not split over processes: in a multi-process run every process
    evaluates the whole eval batch (trax's `Loop` evaluates on each host
    alone), so each reports the metrics a single process would.

    Args:
      n_devices: int, number of devices the batch is split over.

    Returns:
      Iterator of (inputs, targets, weights) with shapes
      (eval_batch_size, sequence_length), dtypes int32, int32, float32;
      every call yields the same batches in the same order.

    Raises:
      CorpusSettingError: If eval_batch_size is not divisible by n_devices.
    """
    _check_divisible('eval_batch_size', self._eval_batch_size, n_devices)
    return self._eval_batches()

  def _eval_batches(self):
    offsets = self._eval_offsets
    position = 0
    while True:
      take = np.arange(position, position + self._eval_batch_size)
      yield _batch(self.eval_bytes, offsets[take % len(offsets)],
                   self._sequence_length)
      position = (position + self._eval_batch_size) % len(offsets)


def load_corpus(paths=None, eval_paths=None, sequence_length=256,
                batch_size=8, eval_batch_size=None, eval_fraction=0.1,
                split_by='file', eval_cycle_batches=None,
                exclude_dirs=DEFAULT_EXCLUDED_DIRS, seed=0):
  """Reads the corpus and returns a `LocalTextCorpus`; see local_text_inputs.

  Raises:
    CorpusSettingError: On a setting out of range.
    CorpusError: On files that do not make a corpus.
  """
  _check_positive_int('sequence_length', sequence_length)
  _check_positive_int('batch_size', batch_size)
  eval_batch_size = batch_size if eval_batch_size is None else eval_batch_size
  _check_positive_int('eval_batch_size', eval_batch_size)
  if eval_cycle_batches is not None:
    _check_positive_int('eval_cycle_batches', eval_cycle_batches)
  if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or (
      seed < 0):
    raise CorpusSettingError(f'local_text_inputs.seed must be an int >= 0, got '
                      f'{seed!r}.')
  if split_by not in _SPLITS:
    raise CorpusSettingError(f'local_text_inputs.split_by must be one of {_SPLITS}, '
                      f'got {split_by!r}.')
  if eval_paths is None and not 0.0 < eval_fraction < 1.0:
    raise CorpusSettingError(f'local_text_inputs.eval_fraction must be in (0, 1), '
                      f'got {eval_fraction!r}.')

  if paths is None:
    files = default_corpus_files(exclude_dirs=exclude_dirs)
    described = f'the standard library at {default_corpus_root()!r}'
  else:
    files = resolve_paths(paths)
    described = repr(paths)

  if eval_paths is not None:
    train_files, eval_files = files, resolve_paths(eval_paths)
    train_bytes, eval_bytes = read_bytes(train_files), read_bytes(eval_files)
  elif split_by == 'file':
    train_files, eval_files = split_files(files, eval_fraction, seed)
    train_bytes, eval_bytes = read_bytes(train_files), read_bytes(eval_files)
  else:
    train_files = eval_files = files
    everything = read_bytes(files)
    cut = int(round(everything.shape[0] * (1.0 - eval_fraction)))
    train_bytes, eval_bytes = everything[:cut], everything[cut:]

  if train_bytes.shape[0] < sequence_length:
    raise CorpusError(
        f'The train split of {described} has {train_bytes.shape[0]} bytes, '
        f'fewer than sequence_length = {sequence_length}; name more or '
        f'larger files, or shorten the sequences.')
  if eval_bytes.shape[0] == 0:
    raise CorpusError(f'The eval split of {described} is empty (only empty '
                      f'files); name non-empty files.')
  logging.info('local_text_inputs: train %d files, %d bytes; eval %d files, '
               '%d bytes (from %s).', len(train_files), train_bytes.shape[0],
               len(eval_files), eval_bytes.shape[0], described)
  return LocalTextCorpus(train_bytes, eval_bytes, train_files, eval_files,
                         sequence_length, batch_size, eval_batch_size,
                         eval_cycle_batches, seed)


@gin.configurable(module='trax_revplus.data')
def local_text_inputs(paths=None, eval_paths=None, sequence_length=256,
                      batch_size=8, eval_batch_size=None, eval_fraction=0.1,
                      split_by='file', eval_cycle_batches=None,
                      exclude_dirs=DEFAULT_EXCLUDED_DIRS, seed=0):
  """Byte-level LM inputs from local text files, for `train.inputs`.

  Plays the role of `trax.data.inputs.batcher` (with an LM `data_streams`)
  for text on this machine.

  Args:
    paths: None for the `.py` sources of the running Python's standard
      library (directories in `exclude_dirs` skipped); otherwise a str or a
      list of str, each a file, a directory (read recursively) or a glob.
    eval_paths: Optional files/directories/globs for eval. If given, all of
      `paths` is used for training and `eval_fraction`/`split_by` are ignored.
    sequence_length: Tokens (bytes) per example (int).
    batch_size: Train examples per batch over all devices of all processes
      (int, the global batch); must be divisible by the number of devices
      of the run. In a multi-process run each process reads its own
      consecutive rows of it (see `LocalTextCorpus.train_stream`).
    eval_batch_size: Eval examples per batch (int); `batch_size` if None.
    eval_fraction: Share of the corpus held out for eval, in (0, 1).
    split_by: "file": whole files go to train or eval, chosen by a hash of
      each file's relative path and `seed` (at least one file each);
      "bytes": eval is the last `eval_fraction` of the concatenated bytes
      (for a single large file such as enwik8).
    eval_cycle_batches: If None, the eval stream walks through the whole eval
      split in order and wraps around; if an int N, it cycles over N batches
      whose windows are spread evenly over the split. Set N to
      `train.eval_steps` so that every eval round scores the same data.
    exclude_dirs: Directory names skipped when reading the default corpus.
    seed: int >= 0; fixes the file split and the order of training windows.

  Returns:
    A `trax.data.inputs.Inputs`. Its `train_stream(n_devices)` yields random
    windows and `eval_stream(n_devices)` fixed windows, each a tuple
    (inputs, targets, weights) of shape (batch, sequence_length) and dtypes
    int32, int32, float32, with inputs == targets (trax LMs shift right
    internally) and weights 0.0 where the target is the pad id 0.

  Raises:
    CorpusError (a ValueError): if a path or glob matches no file, the files
      are empty or too short for one sequence, or a per-file split has
      fewer than 2 files.
    CorpusSettingError (a CorpusError): if a setting is out of range, or
      (when a stream is made) a batch size is not divisible by the device
      count (for the train batch: of all processes).
  """
  corpus = load_corpus(paths=paths, eval_paths=eval_paths,
                       sequence_length=sequence_length, batch_size=batch_size,
                       eval_batch_size=eval_batch_size,
                       eval_fraction=eval_fraction, split_by=split_by,
                       eval_cycle_batches=eval_cycle_batches,
                       exclude_dirs=exclude_dirs, seed=seed)
  return trax_inputs.Inputs(train_stream=corpus.train_stream,
                            eval_stream=corpus.eval_stream)
