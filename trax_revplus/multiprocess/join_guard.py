"""Keeps a blocked `jax.distributed` join to one line: deadline, signal, abort.

`jax.distributed.initialize` waits in C++ (the GIL released) until every
process has connected. Three things then escape Python's error handling:

  * its own deadline ends the process with an abort and a C++ stack trace;
  * a signal's Python handler (Ctrl-C) cannot run until it returns;
  * JAX aborts the process, again with a stack trace, when the coordinator
    rejects it (e.g. another process registered with the same id).

`JoinWatchdog` handles the first two from a thread: past its deadline, or on
SIGINT/SIGTERM, it prints one line and ends the process
(`ending.exit_immediately`, which skips JAX's shutdown barrier).
`CondensedStderr` handles the third: for the duration of the join, file
descriptor 2 goes through a small filter process that passes every line
on, except that JAX's fatal log line and the stack trace after it become
one line naming the cause.
"""

import os
import select
import signal
import subprocess
import sys
import threading
import time
from types import FrameType
from typing import Any, Callable, NoReturn, Optional, Union

from trax_revplus.errors import UserError
from trax_revplus.multiprocess.ending import exit_immediately

# A signal's disposition as `signal.signal` returns it: a Python handler,
# SIG_DFL or SIG_IGN, or None (not installed from Python).
_Handler = Union[Callable[[int, Optional[FrameType]], Any], int, None]


class JoinWatchdog:
  """Ends the process with one line past a deadline or on SIGINT/SIGTERM.

  Signals are seen through `signal.set_wakeup_fd`, which the interpreter
  writes to as a signal arrives, whatever the main thread is doing; only
  from the main thread (elsewhere only the deadline is watched). The
  interpreter writes there only for a signal with a Python handler, so for
  the join the watchdog installs its own for SIGINT and SIGTERM, whatever
  they were (Python's default, SIGTERM's default action, or ignored, as a
  process started in the background of a shell inherits SIGINT), and
  restores them after. A signal that arrives as the join ends, before the
  watchdog thread has seen it, is reported when the watchdog exits.
  """

  def __init__(
    self,
    seconds: float,
    timeout_error: UserError,
    interrupted_error: Callable[[int], UserError],
    prefix: str,
  ):
    """Arms the watchdog; it starts watching on `__enter__`.

    Args:
      seconds: float, the deadline from now.
      timeout_error: the exception (with `exit_code`) reported at the
        deadline.
      interrupted_error: callable(signum) returning the exception (with
        `exit_code`) reported on SIGINT or SIGTERM.
      prefix: str printed before the exception's message on stderr.
    """
    self._deadline = time.monotonic() + seconds
    self._timeout_error = timeout_error
    self._interrupted_error = interrupted_error
    self._prefix = prefix
    self._done = threading.Event()
    self._read_fd, self._write_fd = os.pipe()
    os.set_blocking(self._write_fd, False)
    self._previous_wakeup_fd: int | None = None
    self._previous_handlers: dict[int, _Handler] = {}
    self._signal: int | None = None
    self._thread = threading.Thread(
      target=self._watch, daemon=True, name='join-watchdog'
    )

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      self._previous_wakeup_fd = signal.set_wakeup_fd(
        self._write_fd, warn_on_full_buffer=False
      )
      for signum in (signal.SIGINT, signal.SIGTERM):
        self._previous_handlers[signum] = signal.signal(signum, self._note)
    self._thread.start()
    return self

  def __exit__(self, *unused_exc_info):
    self._done.set()
    for signum, handler in self._previous_handlers.items():
      if handler is not None:  # None: not installed from Python.
        signal.signal(signum, handler)
    if self._previous_wakeup_fd is not None:
      signal.set_wakeup_fd(self._previous_wakeup_fd)
    self._wake()
    self._thread.join()
    os.close(self._read_fd)
    os.close(self._write_fd)
    if self._signal is not None:  # Came as the join ended.
      self.fail(self._interrupted_error(self._signal))

  def _note(self, signum, unused_frame):
    """The Python handler during the join: the watchdog thread reports."""
    if self._signal is None:
      self._signal = signum

  def restart(self, seconds: float, timeout_error: UserError) -> None:
    """Sets a new deadline, `seconds` from now, and what it reports."""
    self._deadline = time.monotonic() + seconds
    self._timeout_error = timeout_error
    self._wake()

  def fail(self, error: UserError) -> NoReturn:
    """Prints `error` as one line and ends the process with its status."""
    try:
      print(f'{self._prefix}{error}', file=sys.stderr, flush=True)
    except (OSError, ValueError):
      pass  # stderr is gone; the exit status still tells.
    exit_immediately(error.exit_code)

  def _wake(self):
    try:
      os.write(self._write_fd, b'\0')  # Not a signal number: only wakes.
    except OSError:
      pass

  def _watch(self):
    while not self._done.is_set():
      remaining = self._deadline - time.monotonic()
      if remaining <= 0:
        self.fail(self._timeout_error)
      readable, _, _ = select.select([self._read_fd], [], [], remaining)
      if readable and not self._done.is_set():
        for signum in os.read(self._read_fd, 64):
          if signum in (signal.SIGINT, signal.SIGTERM):
            self.fail(self._interrupted_error(signum))


# The filter process. argv: prefix, lead, hint. Lines pass through; JAX's
# fatal line (absl format 'F<mmdd> <time> <thread> <file>:<line>] ...') and
# all after it become, at end of input, one line with the status JAX gave.
_FILTER = r"""
import re, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
prefix, lead, hint = sys.argv[1:4]
fatal = re.compile(rb'^F\d{4} [0-9:.]+ +\d+ [^\]]*\] (.*)')
out = sys.stdout.buffer
status = None
for line in sys.stdin.buffer:
  if status is None:
    match = fatal.match(line)
    if match is None:
      out.write(line)
      out.flush()
      continue
    status = match.group(1).decode('utf-8', 'replace').strip()
    status = status.split('absl::Status: ', 1)[-1][:300]
if status is not None:
  if status.startswith('ALREADY_EXISTS'):
    hint = 'another process joined with the same --process_id; ' + hint
  out.write(f'{prefix}{lead} ({status}); {hint}\n'.encode())
  out.flush()
"""


class CondensedStderr:
  """File descriptor 2 through a filter that condenses JAX's fatal abort.

  Only for a short span (the join): the filter is a separate process, so it
  outlives an abort of this one and prints the line last; Python's
  `sys.stderr` and C++ logging both write to descriptor 2 and pass through.
  Does nothing if descriptor 2 is not open.
  """

  def __init__(self, prefix: str, lead: str, hint: str):
    """Prepares the filter.

    Args:
      prefix: str before the line (e.g. 'error: ').
      lead: str, what failed (e.g. 'process 1 of 2: JAX ended the join').
      hint: str, what to check, after JAX's status.
    """
    self._argv = [prefix, lead, hint]
    self._saved_fd: int | None = None
    self._proc: subprocess.Popen[bytes] | None = None

  def __enter__(self):
    try:
      self._saved_fd = os.dup(2)
    except OSError:
      return self
    sys.stderr.flush()
    try:
      self._proc = subprocess.Popen(
        [sys.executable, '-S', '-c', _FILTER] + self._argv,
        stdin=subprocess.PIPE,
        stdout=self._saved_fd,
        stderr=subprocess.DEVNULL,
      )
    except OSError:  # No interpreter to run it: JAX's output stays as is.
      os.close(self._saved_fd)
      return self
    assert self._proc.stdin is not None  # stdin=subprocess.PIPE.
    os.dup2(self._proc.stdin.fileno(), 2)
    return self

  def __exit__(self, *unused_exc_info):
    if self._proc is None:
      return
    # Both set in __enter__ with the filter (its stdin a pipe).
    assert self._saved_fd is not None and self._proc.stdin is not None
    sys.stderr.flush()
    os.dup2(self._saved_fd, 2)
    os.close(self._saved_fd)
    self._proc.stdin.close()  # The filter sees the end and exits.
    try:
      self._proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
      self._proc.kill()
      self._proc.wait()
