"""Where the lines of a local launch's processes go (`launcher.launch`).

Each process's stdout and stderr are read line by line on a thread of
their own (`LineForwarder`) and handed to one `LineOutput`, which writes
every line to the process's log file and forwards it, prefixed, to the
launcher's terminal until another process has failed; from then on the
lines of the others wait, and only the cause's are printed
(`LineOutput.release`). Whether a process has failed is asked of the
kernel as each line is read (`has_failed`), so a line printed after a
failure is never forwarded, however busy the machine.
"""

import os
import subprocess
import threading
from typing import IO, Sequence


def has_failed(proc: subprocess.Popen) -> bool:
  """Whether `proc` has ended other than with status 0, as the kernel
  knows it now (without reaping it: its waiting thread does)."""
  if proc.returncode is not None:
    return proc.returncode != 0
  if not hasattr(os, 'waitid'):
    return False
  try:
    info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
  except ChildProcessError:  # Reaped by its waiting thread just now.
    return proc.wait() != 0
  if info is None:
    return False
  return not (info.si_code == os.CLD_EXITED and info.si_status == 0)


class LineOutput:
  """Where the processes' lines go: the terminal, their log files.

  Until a process fails, every line is forwarded. After, the lines of the
  others are held back (and written to their log files only); the cause's
  are printed at the end (`release`).
  """

  def __init__(
    self,
    procs: Sequence[subprocess.Popen],
    log_files: Sequence[IO[str] | None],
    received: Sequence[int],
  ):
    self.lock = threading.Lock()
    self._procs = procs
    self._log_files = log_files
    self._received = received
    self._held: list[list[tuple[IO[str], str]]] = []

  def line(self, i: int, stream: IO[str], prefix: str, text: str) -> None:
    """Process i printed `text` (no newline) on `stream`; on the terminal
    it gets `prefix`."""
    with self.lock:
      log = self._log_files[i]
      if log is not None:
        try:
          log.write(text + '\n')
          log.flush()
        except (OSError, ValueError):
          pass
      while len(self._held) <= i:
        self._held.append([])
      # After a signal to the launcher every process ends: its lines say
      # how, and none is a failure the others follow from.
      others_failed = not self._received and any(
        has_failed(p) for j, p in enumerate(self._procs) if j != i
      )
      if others_failed:
        self._held[i].append((stream, prefix + text))
      else:
        write(stream, prefix + text)

  def release(self, i: int) -> None:
    """Prints what process i printed after another had failed."""
    with self.lock:
      held = self._held[i] if i < len(self._held) else []
      for stream, text in held:
        write(stream, text)
      held.clear()


def write(stream: IO[str], text: str) -> None:
  """Writes `text` and a newline to `stream`, flushed; a stream that is
  gone is skipped."""
  try:
    stream.write(text + '\n')
    stream.flush()
  except (OSError, ValueError):
    pass  # The launcher's own output is gone; keep draining.


class LineForwarder(threading.Thread):
  """Copies one pipe of process i, line by line with a prefix, to `output`."""

  def __init__(
    self,
    pipe: IO[bytes],
    stream: IO[str],
    prefix: str,
    output: LineOutput,
    i: int,
  ):
    super().__init__(daemon=True)
    self._pipe, self._stream, self._prefix = pipe, stream, prefix
    self._output, self._i = output, i

  def run(self) -> None:
    with self._pipe:
      for raw in iter(self._pipe.readline, b''):
        line = raw.decode('utf-8', errors='replace').rstrip('\r\n')
        self._output.line(self._i, self._stream, self._prefix, line)
