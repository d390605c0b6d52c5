"""Train and eval batch streams over a corpus held in host memory.

Both streams resume: batch n is a function of `seed` and n only, and each
stream keeps n in trax's data counters (`trax.data.inputs.data_counters`,
names `TRAIN_COUNTER` and `EVAL_COUNTER`), which a checkpoint set keeps and
restores. In a multi-process run each process reads its own rows of the same
global train batch.
"""

from typing import Callable

import jax
import numpy as np
from trax.data import inputs as trax_inputs

from trax_revplus.data.errors import CorpusSettingError
from trax_revplus.typing import HostArray

VOCAB_SIZE = 256
PAD_ID = 0

# Keys of the streams' positions in trax's data counters.
TRAIN_COUNTER = 'trax_revplus.data.local_text_inputs/train'
EVAL_COUNTER = 'trax_revplus.data.local_text_inputs/eval'

# (inputs, targets, weights) of shape (batch, sequence_length), dtypes
# int32, int32, float32.
TokenBatch = tuple[HostArray, HostArray, HostArray]


def _check_divisible(name: str, batch_size: int, n_devices: int) -> None:
  if batch_size % n_devices:
    raise CorpusSettingError(
      f'local_text_inputs.{name} = {batch_size} is not divisible by the '
      f'{n_devices} devices; choose a multiple of {n_devices}.'
    )


def _this_process() -> tuple[int, int]:
  """(index, count) of this process in a multi-process JAX run."""
  return jax.process_index(), jax.process_count()


def _check_process_split(
  batch_size: int, n_devices: int, process_index: int, process_count: int
) -> None:
  """Checks that the global batch splits over processes, then devices."""
  for name, value, low in (
    ('process_count', process_count, 1),
    ('process_index', process_index, 0),
  ):
    if (
      isinstance(value, bool)
      or not isinstance(value, (int, np.integer))
      or (value < low)
    ):
      raise CorpusSettingError(
        f'{name} must be an int >= {low}, got {value!r}.'
      )
  if process_index >= process_count:
    raise CorpusSettingError(
      f'process_index = {process_index} is not below '
      f'process_count = {process_count}.'
    )
  total = n_devices * process_count
  if batch_size % total:
    raise CorpusSettingError(
      f'local_text_inputs.batch_size = {batch_size} (the global batch) is '
      f'not divisible by the {total} devices of the run ({process_count} '
      f'processes x {n_devices} local devices); choose a multiple of '
      f'{total}.'
    )


def _batch(
  buffer: HostArray, offsets: HostArray, sequence_length: int
) -> TokenBatch:
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


class CountedStream:
  """An endless stream whose position lives in trax's data counters.

  Batch n is `batch_fn(n)`; the position (the number of batches yielded) is
  `trax.data.inputs.data_counters[data_counter]`. It is read at every batch,
  since trax's `Loop` replaces the whole dict when it loads the counters of
  a checkpoint, and the stream jumps ahead to a raised counter.

  Attributes:
    data_counter: str, the stream's key in `trax.data.inputs.data_counters`
      (a checkpoint save finds the eval stream's key here to account for
      the eval batches a step's evals take after its checkpoint).
  """

  def __init__(self, data_counter: str, batch_fn: Callable[[int], TokenBatch]):
    self.data_counter = data_counter
    self._batch_fn = batch_fn
    self._index = 0
    trax_inputs.data_counters[data_counter] = 0

  def __iter__(self) -> 'CountedStream':
    return self

  def __next__(self) -> TokenBatch:
    self._index = max(
      self._index, trax_inputs.data_counters.get(self.data_counter, 0)
    )
    batch = self._batch_fn(self._index)
    self._index += 1
    trax_inputs.data_counters[self.data_counter] = self._index
    return batch


class LocalTextCorpus:
  """Train and eval byte buffers with their batch streams.

  Attributes:
    train_bytes: 1-D np.uint8 array, the train split.
    eval_bytes: 1-D np.uint8 array, the eval split.
    train_files: Sorted list of the files read for train (str).
    eval_files: Sorted list of the files read for eval (str); with
      split_by="bytes" the same as train_files.
  """

  def __init__(
    self,
    train_bytes: HostArray,
    eval_bytes: HostArray,
    train_files: list[str],
    eval_files: list[str],
    sequence_length: int,
    batch_size: int,
    eval_batch_size: int,
    eval_cycle_batches: int | None,
    seed: int,
  ):
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

  def train_stream(
    self,
    n_devices: int,
    process_index: int | None = None,
    process_count: int | None = None,
  ) -> CountedStream:
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
    _check_process_split(
      self._batch_size, n_devices, process_index, process_count
    )
    return CountedStream(
      TRAIN_COUNTER,
      lambda index: self.train_batch(index, process_index, process_count),
    )

  def train_batch(
    self, index: int, process_index: int = 0, process_count: int = 1
  ) -> TokenBatch:
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
    offsets = offsets[process_index * rows : (process_index + 1) * rows]
    return _batch(self.train_bytes, offsets, self._sequence_length)

  def eval_stream(self, n_devices: int) -> CountedStream:
    """Returns an endless iterator cycling over fixed eval windows.

    Not split over processes: in a multi-process run every process
    evaluates the whole eval batch (trax's `Loop` evaluates on each host
    alone), so each reports the metrics a single process would.

    Args:
      n_devices: int, number of devices the batch is split over.

    Returns:
      `CountedStream` of (inputs, targets, weights) with shapes
      (eval_batch_size, sequence_length), dtypes int32, int32, float32:
      `eval_batch(0)`, `eval_batch(1)`, ... Making the stream sets its
      position (`trax.data.inputs.data_counters[EVAL_COUNTER]`) to 0; when
      that counter is later raised (a checkpoint set restored), the stream
      jumps ahead to it, so a resumed run's evals score the batches an
      uninterrupted run's would.

    Raises:
      CorpusSettingError: If eval_batch_size is not divisible by n_devices.
    """
    _check_divisible('eval_batch_size', self._eval_batch_size, n_devices)
    return CountedStream(EVAL_COUNTER, self.eval_batch)

  def eval_batch(self, index: int) -> TokenBatch:
    """Returns eval batch number `index` (int >= 0) of the stream.

    Batch n holds the eval windows n * eval_batch_size onwards, wrapping
    around at the last window (see `local_text_inputs`'s
    `eval_cycle_batches`).

    Returns:
      (inputs, targets, weights), each of shape
      (eval_batch_size, sequence_length).
    """
    offsets = self._eval_offsets
    take = index * self._eval_batch_size + np.arange(self._eval_batch_size)
    return _batch(
      self.eval_bytes, offsets[take % len(offsets)], self._sequence_length
    )
