"""The process's compile threads: XLA compiles outside the GIL, so programs
compile beside each other and beside Python's tracing.

`compile_pool()` gives the threads (one per CPU core, made on first use);
`wait_for` waits for one of their results in a way a signal interrupts;
`compiles_in_flight` says whether any still runs, for a process that ends
before they do (Ctrl-C while planning): it must leave without Python's
finalization, which would abort it (a thread stopped inside XLA's
compiler) or wait for the compiler. A process that finalizes all the same
(a script that ends while a fused program compiles beside its first
steps) waits for them at exit (`atexit`) rather than abort.
"""

import atexit
import concurrent.futures
import contextlib
import os
import queue
import threading
import time
from typing import Any, Callable, Iterator

# Each wait for compilations wakes this often, so that a signal handler
# runs (Ctrl-C while planning) within this many seconds.
WAIT_SLICE_SECONDS = 0.25


class Done(concurrent.futures.Future):
  """A finished future standing for a compilation already analyzed."""

  def __init__(self):
    super().__init__()
    self.set_result(None)


DONE = Done()


class _DaemonPool:
  """Helper threads that compile, one per CPU core.

  Daemon threads (unlike `concurrent.futures.ThreadPoolExecutor`'s): a
  process that stops while a compilation runs (Ctrl-C while planning)
  exits without waiting for it.
  """

  def __init__(self, workers: int):
    self._queue: queue.SimpleQueue = queue.SimpleQueue()
    self.pending = 0  # submitted and not finished
    self._lock = threading.Lock()
    for i in range(workers):
      threading.Thread(
        target=self._work, name=f'trax_revplus_compile_{i}', daemon=True
      ).start()

  def _work(self) -> None:
    while True:
      future, fn, args = self._queue.get()
      result, error = None, None
      try:
        if future.set_running_or_notify_cancel():
          result = fn(*args)
      except BaseException as e:  # pylint: disable=broad-except
        error = e
      # Not in flight once the compiler returned: a process ending now
      # finalizes as usual (`compiles_in_flight`).
      with self._lock:
        self.pending -= 1
      try:
        if error is not None:
          future.set_exception(error)
        elif future.running():
          future.set_result(result)
      except BaseException:  # pylint: disable=broad-except
        # The process is ending (finalization): nobody waits any more.
        return

  def submit(self, fn: Callable, *args: Any) -> concurrent.futures.Future:
    future: concurrent.futures.Future = concurrent.futures.Future()
    with self._lock:
      self.pending += 1
    self._queue.put((future, fn, args))
    return future


_pool: _DaemonPool | None = None
_pool_lock = threading.Lock()


# Whether the compilation this thread runs goes on beside the training
# steps (`beside_steps`): a plan's programs compiling while the steps run
# another plan, not a step's own.
_local = threading.local()


@contextlib.contextmanager
def beside_steps(flag: bool = True) -> Iterator[None]:
  """Marks what the calling thread compiles inside as compiling beside
  the training steps (`compiling_beside_steps`) where `flag`."""
  before = compiling_beside_steps()
  _local.beside_steps = flag
  try:
    yield
  finally:
    _local.beside_steps = before


def compiling_beside_steps() -> bool:
  """Whether the calling thread compiles beside the training steps
  (`beside_steps`): a step's compile count leaves that out."""
  return getattr(_local, 'beside_steps', False)


def wait_for(future: concurrent.futures.Future) -> None:
  """Waits for `future`, waking each `WAIT_SLICE_SECONDS` so that a
  signal reaches the waiting thread."""
  while not future.done():
    concurrent.futures.wait([future], timeout=WAIT_SLICE_SECONDS)


def compiles_in_flight() -> int:
  """Compilations submitted to the process's compile threads and not
  finished (0 where none was ever submitted). A process that ends with
  some in flight must leave without Python's finalization
  (`os._exit`): a thread stopped inside XLA's compiler then aborts the
  process."""
  return 0 if _pool is None else _pool.pending


def compile_pool() -> _DaemonPool:
  """The process's compile threads (made on first use)."""
  global _pool
  with _pool_lock:
    if _pool is None:
      _pool = _DaemonPool(os.cpu_count() or 1)
      atexit.register(_wait_for_compiles)
    return _pool


def _wait_for_compiles() -> None:
  """Waits for the compilations in flight: at exit, before finalization
  stops the daemon threads, one of which would abort the process where
  stopped inside the compiler."""
  while compiles_in_flight():
    time.sleep(WAIT_SLICE_SECONDS / 5)
