"""`local_text_inputs`, the gin-configurable inputs, and `load_corpus`."""

from typing import Iterable

from absl import logging
import gin
import numpy as np
from trax.data import inputs as trax_inputs

from trax_revplus.data.errors import CorpusError
from trax_revplus.data.errors import CorpusSettingError
from trax_revplus.data.corpus_files import DEFAULT_EXCLUDED_DIRS
from trax_revplus.data.corpus_files import Paths
from trax_revplus.data.corpus_files import default_corpus_files
from trax_revplus.data.corpus_files import default_corpus_root
from trax_revplus.data.corpus_files import read_bytes
from trax_revplus.data.corpus_files import resolve_paths
from trax_revplus.data.corpus_files import split_files
from trax_revplus.data.streams import LocalTextCorpus

_SPLITS = ('file', 'bytes')


def _check_positive_int(name: str, value: object) -> None:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
    raise CorpusSettingError(
      f'local_text_inputs.{name} must be an int, got {value!r}.'
    )
  if value < 1:
    raise CorpusSettingError(
      f'local_text_inputs.{name} must be >= 1, got {value}.'
    )


def load_corpus(
  paths: Paths | None = None,
  eval_paths: Paths | None = None,
  sequence_length: int = 256,
  batch_size: int = 8,
  eval_batch_size: int | None = None,
  eval_fraction: float = 0.1,
  split_by: str = 'file',
  eval_cycle_batches: int | None = None,
  exclude_dirs: Iterable[str] | None = DEFAULT_EXCLUDED_DIRS,
  seed: int = 0,
) -> LocalTextCorpus:
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
  if (
    isinstance(seed, bool)
    or not isinstance(seed, (int, np.integer))
    or (seed < 0)
  ):
    raise CorpusSettingError(
      f'local_text_inputs.seed must be an int >= 0, got {seed!r}.'
    )
  if split_by not in _SPLITS:
    raise CorpusSettingError(
      f'local_text_inputs.split_by must be one of {_SPLITS}, got {split_by!r}.'
    )
  if eval_paths is None and not 0.0 < eval_fraction < 1.0:
    raise CorpusSettingError(
      f'local_text_inputs.eval_fraction must be in '
      f'(0, 1), got {eval_fraction!r}.'
    )

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
      f'larger files, or shorten the sequences.'
    )
  if eval_bytes.shape[0] == 0:
    raise CorpusError(
      f'The eval split of {described} is empty (only empty '
      f'files); name non-empty files.'
    )
  logging.info(
    'local_text_inputs: train %d files, %d bytes; eval %d files, '
    '%d bytes (from %s).',
    len(train_files),
    train_bytes.shape[0],
    len(eval_files),
    eval_bytes.shape[0],
    described,
  )
  return LocalTextCorpus(
    train_bytes,
    eval_bytes,
    train_files,
    eval_files,
    sequence_length,
    batch_size,
    eval_batch_size,
    eval_cycle_batches,
    seed,
  )


@gin.configurable(module='trax_revplus.data')
def local_text_inputs(
  paths: Paths | None = None,
  eval_paths: Paths | None = None,
  sequence_length: int = 256,
  batch_size: int = 8,
  eval_batch_size: int | None = None,
  eval_fraction: float = 0.1,
  split_by: str = 'file',
  eval_cycle_batches: int | None = None,
  exclude_dirs: Iterable[str] | None = DEFAULT_EXCLUDED_DIRS,
  seed: int = 0,
) -> trax_inputs.Inputs:
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
  corpus = load_corpus(
    paths=paths,
    eval_paths=eval_paths,
    sequence_length=sequence_length,
    batch_size=batch_size,
    eval_batch_size=eval_batch_size,
    eval_fraction=eval_fraction,
    split_by=split_by,
    eval_cycle_batches=eval_cycle_batches,
    exclude_dirs=exclude_dirs,
    seed=seed,
  )
  return trax_inputs.Inputs(
    train_stream=corpus.train_stream, eval_stream=corpus.eval_stream
  )
