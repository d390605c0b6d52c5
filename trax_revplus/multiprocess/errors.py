"""How joining or launching a multi-process run fails: one line, one status.

Every error here is a `trax_revplus.errors.UserError`: its message is one
line and it carries the exit status the command ends with, so the CLI
reports it as it reports any other mistake.

  DistributedError             any of them (exit 1 unless below)
    DistributedUsageError      a value missing, malformed, out of range or
                               disagreeing (exit 2)
    DistributedRuntimeError    joining failed: network, port, JAX (exit 1)
      JoinTimeoutError         not every process joined in time
      JoinInterruptedError     a signal while joining (exit 128 + signal)
    LaunchError                the local launch could not complete
      LaunchUsageError         a bad number of processes or no command
                               (also a DistributedUsageError: exit 2)
      ProcessFailedError       a launched process failed (its status)
      LaunchInterruptedError   the launcher got a signal (128 + signal)
"""

from trax_revplus.errors import EXIT_RUNTIME
from trax_revplus.errors import EXIT_USAGE
from trax_revplus.errors import signal_exit_status
from trax_revplus.errors import UserError


class DistributedError(UserError):
  """A multi-process run that cannot start or complete; `str()` is one line.

  Attributes:
    exit_code: int, the exit status a command should end with.
  """

  exit_code = EXIT_RUNTIME


class DistributedUsageError(DistributedError, ValueError):
  """A value is missing, malformed, out of range or disagrees (exit 2)."""

  exit_code = EXIT_USAGE


class DistributedRuntimeError(DistributedError, RuntimeError):
  """Joining failed: network, port, timeout, or JAX already started (exit 1)."""

  exit_code = EXIT_RUNTIME


class JoinTimeoutError(DistributedRuntimeError):
  """Not every process joined within `timeout_seconds`."""


class JoinInterruptedError(DistributedRuntimeError):
  """A signal (e.g. Ctrl-C) arrived while waiting for the other processes."""

  def __init__(self, message: str, signum: int):
    super().__init__(message, signal_exit_status(signum))


class LaunchError(DistributedError):
  """The local launch (`launcher.launch`) could not complete."""


class LaunchUsageError(LaunchError, DistributedUsageError):
  """A bad number of processes or an empty command (exit 2)."""


class ProcessFailedError(LaunchError, RuntimeError):
  """A process exited with a non-zero status or was killed by a signal.

  Attributes:
    process_id: int, the first process seen to fail other than with
      `EXIT_LOST_PROCESS`, or the first seen to fail when all did so.
    returncode: int, its `Popen.returncode` (negative: killed by signal).
    exit_code: its exit status; 128 + the signal number for a signal.
  """

  def __init__(self, message: str, process_id: int, returncode: int):
    super().__init__(
      message, signal_exit_status(-returncode) if returncode < 0 else returncode
    )
    self.process_id = process_id
    self.returncode = returncode


class LaunchInterruptedError(LaunchError):
  """The launcher received SIGINT or SIGTERM and forwarded it.

  Attributes:
    signum: int, the first signal received.
    exit_code: 128 + signum.
  """

  def __init__(self, message: str, signum: int):
    super().__init__(message, signal_exit_status(signum))
    self.signum = signum
