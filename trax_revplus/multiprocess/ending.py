"""How a run of P processes ends: together on a signal, at once on a failure.

* A SIGINT or SIGTERM that reached any process stops every process after
  the same step (`stop_together`), so that none waits in a collective for
  a peer that stopped.
* A failure ends the process with one line (`failure`), with exit status
  `EXIT_LOST_PROCESS` when it is another process's loss, so that a
  launcher can tell the process that failed first from those it took
  along; and without JAX's shutdown barrier (`exit_immediately`), which
  would otherwise wait for a dead peer and then abort with a stack trace.
"""

import os
import sys
from typing import Any, NoReturn, Tuple

import numpy as np

from trax_revplus import trax_import
from trax_revplus.errors import EXIT_LOST_PROCESS
from trax_revplus.errors import EXIT_RUNTIME
from trax_revplus.errors import one_line


def exit_immediately(exit_code: int) -> NoReturn:
  """Ends this process now, without JAX's shutdown barrier.

  A normal exit runs `jax.distributed.shutdown` (registered with `atexit`),
  which waits for every other process, up to the heartbeat timeout for one
  that died, and then aborts with a C++ stack trace. Flushes stdout and
  stderr first.

  Args:
    exit_code: int, the exit status.
  """
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError):
      pass
  os._exit(exit_code)  # pylint: disable=protected-access


def any_signal(signum: int | None) -> int | None:
  """The first signal any process received (a collective), or None.

  Args:
    signum: int or None, this process's.
  """
  multihost_utils = trax_import.multihost_utils
  gathered = np.asarray(
    multihost_utils.process_allgather(np.int32(signum or 0))
  ).ravel()
  received = [int(s) for s in gathered if s]
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
  step_callback: Any = trax_import.module(
    'trax.supervised.callbacks'
  ).TrainingStepCallback

  class _StopTogether(step_callback):
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
  answering) names that and gives `EXIT_LOST_PROCESS`, so that a launcher
  can tell the process that failed first from those that failed because of
  it; anything else is the error's first line and exit 1.

  Args:
    error: the exception that ends this process.
    config: the run's `DistributedConfig` (its `describe()` starts the line).

  Returns:
    (line, exit_code): str without a newline, int.
  """
  # The first line, without gin's "In call to configurable ..." context.
  text = one_line(error, context=False) or type(error).__name__
  name = type(error).__name__
  lost = (
    'Gloo',
    'gloo',
    'Connection reset',
    'Connection closed',
    'heartbeat',
    'UNAVAILABLE',
    'DEADLINE_EXCEEDED',
    'non-addressable',
  )
  if name in ('JaxRuntimeError', 'XlaRuntimeError') or any(
    k in text for k in lost
  ):
    return (
      f'{config.describe()}: the run lost another process (it '
      f'failed, was stopped or stopped responding; see its output): '
      f'{name}: {text[:300]}',
      EXIT_LOST_PROCESS,
    )
  return f'{config.describe()}: {name}: {text[:300]}', EXIT_RUNTIME
