"""This process within a multi-process training run: index, seed, log, barrier.

  * every process starts from the same seed: process 0's, shared with
    the others, when the config sets none (`shared_random_seed`);
  * each process logs to its own file, its lines marked with its index
    (`log_file_name`, `ProcessFormatter`);
  * `barrier` makes every process wait for the others, e.g. until process
    0 has written the checkpoint set.

Only process 0 writes checkpoints, summaries and the memory log's files
(trax's `Loop.is_chief`, `checkpoints.save_checkpoint`,
`ReversibleSerialTrainer.set_output_dir`).
"""

import logging as std_logging
import time

import numpy as np

from trax_revplus import trax_import


def process_index() -> int:
  """This process's index (0 without a multi-process run)."""
  jax = trax_import.jax
  return jax.process_index()


def log_file_name(index: int) -> str:
  """'train.log' for process 0, 'train.process<I>.log' for the others."""
  return 'train.log' if index == 0 else f'train.process{index}.log'


class ProcessFormatter(std_logging.Formatter):
  """Prefixes each line another formatter makes with 'process I: '."""

  def __init__(self, inner: std_logging.Formatter, index: int):
    super().__init__()
    self._inner = inner
    self._prefix = f'process {index}: '

  def format(self, record: std_logging.LogRecord) -> str:
    return '\n'.join(
      self._prefix + line for line in self._inner.format(record).split('\n')
    )


def shared_random_seed() -> int:
  """A seed from process 0's clock, the same on every process (a collective).

  Every process must call it: process 0's value is broadcast to the others.

  Returns:
    int in [0, 2**31).
  """
  multihost_utils = trax_import.multihost_utils
  seed = np.int64(int(1e6 * time.time()) % 2**31)
  return int(multihost_utils.broadcast_one_to_all(seed))


def barrier(name: str) -> None:
  """Waits until every process reached `barrier(name)` (a collective).

  E.g. after the run, so that no process reads the checkpoint set before
  process 0 finished writing it.
  """
  multihost_utils = trax_import.multihost_utils
  multihost_utils.sync_global_devices(name)
