"""What a training run does differently when it spans several processes.

`trax-revplus train` with `--num_processes` (or under a cluster launcher)
joins the run first (`distributed.initialize`), then:

  * every process starts from the same seed: process 0's, shared with
    the others, when the config sets none (`shared_random_seed`);
  * a SIGINT or SIGTERM that reached any process stops every process after
    the same step (`StopTogether`), so that none waits in a collective for a
    peer that stopped;
  * a failure ends the process with one line (`failure`), with exit status
    `launch.EXIT_LOST_PROCESS` when it is another process's loss, and without
    JAX's shutdown barrier (`distributed.exit_immediately`), which would
    otherwise wait for a dead peer and then abort with a stack trace;
  * each process logs to its own file, its lines marked with its index
    (`log_file_name`, `ProcessFormatter`).

Only process 0 writes checkpoints, summaries and the memory log's files
(trax's `Loop.is_chief`, `checkpoints.save_checkpoint`,
`ReversibleSerialTrainer.set_output_dir`).
"""

import argparse
import logging as std_logging
from typing import Any, Optional, Tuple

import numpy as np

from trax_revplus import distributed
from trax_revplus import launch


def config_from_flags(flags: argparse.Namespace
                      ) -> distributed.DistributedConfig:
  """The `DistributedConfig` of `train`'s flags and the environment.

  Raises:
    distributed.DistributedUsageError: values that cannot work together.
  """
  heartbeat = flags.heartbeat_timeout_seconds
  return distributed.resolve_config(
      flags.num_processes, flags.process_id, flags.coordinator_address,
      timeout_seconds=flags.join_timeout_seconds,
      heartbeat_timeout_seconds=heartbeat,
      # A process that finished waits this long for the others at exit.
      shutdown_timeout_seconds=max(heartbeat, flags.join_timeout_seconds))


def process_index() -> int:
  """This process's index (0 without a multi-process run)."""
  import jax  # pylint: disable=g-import-not-at-top
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
    return '\n'.join(self._prefix + line
                     for line in self._inner.format(record).split('\n'))


def shared_random_seed() -> int:
  """Process 0's seed from its clock, the same on every process."""
  from trax_revplus import compat  # pylint: disable=g-import-not-at-top
  return compat.shared_random_seed()


def barrier(name: str) -> None:
  """Waits until every process reached `barrier(name)` (a collective).

  E.g. after the run, so that no process reads the checkpoint set before
  process 0 finished writing it.
  """
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  multihost_utils.sync_global_devices(name)


def any_signal(signum: Optional[int]) -> Optional[int]:
  """The first signal any process received (a collective), or None.

  Args:
    signum: int or None, this process's.
  """
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  received = np.asarray(multihost_utils.process_allgather(
      np.int32(signum or 0))).ravel()
  received = [int(s) for s in received if s]
  return received[0] if received else None


def stop_together(stop: Any) -> Any:
  """A Loop callback that shares `stop`'s signal with every process.

  Runs at the end of each step, before `stop.callback` (which then saves a
  checkpoint and stops): when any process received SIGINT or SIGTERM during
  the step, every process acts as if it had. One small collective per step.

  Args:
    stop: the run's `interrupt.StopOnSignal`.

  Returns:
    The callback class's factory, for `train.callbacks`.
  """
  from trax.supervised import callbacks  # pylint: disable=g-import-not-at-top

  class _StopTogether(callbacks.TrainingStepCallback):
    """Agrees on a signal at the end of every step."""

    def call_at(self, step):
      del step
      return True

    def on_step_begin(self, step):
      del step

    def on_step_end(self, step):
      del step
      signum = any_signal(stop.signum)
      if signum is not None and stop.signum is None:
        stop.signum = signum

  return _StopTogether


def failure(error: BaseException, config: Any) -> Tuple[str, int]:
  """The line and exit status for an error that ends a multi-process run.

  An error of a collective (a peer exited, was killed, or stopped
  answering) names that and gives `launch.EXIT_LOST_PROCESS`, so that a
  launcher can tell the process that failed first from those that failed
  because of it; anything else is the error's first line and exit 1.

  Args:
    error: the exception that ends this process.
    config: the run's `DistributedConfig` (its `describe()` starts the line).

  Returns:
    (line, exit_code): str without a newline, int.
  """
  from trax_revplus import errors  # pylint: disable=g-import-not-at-top
  # The first line, without gin's "In call to configurable ..." context.
  text = errors.one_line(error, context=False) or type(error).__name__
  name = type(error).__name__
  lost = ('Gloo', 'gloo', 'Connection reset', 'Connection closed',
          'heartbeat', 'UNAVAILABLE', 'DEADLINE_EXCEEDED', 'non-addressable')
  if name in ('JaxRuntimeError', 'XlaRuntimeError') or any(
      k in text for k in lost):
    return (f'{config.describe()}: the run lost another process (it '
            f'failed, was stopped or stopped responding; see its output): '
            f'{name}: {text[:300]}', launch.EXIT_LOST_PROCESS)
  return f'{config.describe()}: {name}: {text[:300]}', errors.EXIT_RUNTIME
