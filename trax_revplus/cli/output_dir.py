"""A command's output directory: its default, its checks and its lock.

The lock keeps two runs out of one directory: each `trax-revplus train`
holds an exclusive `fcntl.flock` on `<output_dir>/trax-revplus.lock` for as
long as it runs, the file naming the process that holds it. The kernel
drops the lock when its process ends, however it ends, so a lock left by a
killed process is free to take; the next run takes it over with a warning
naming that process. A run that ends normally removes the file.
"""

import datetime
import errno
import json
import os
import socket
import time
from typing import Sequence

from trax_revplus.cli.messages import PROG
from trax_revplus.errors import EXIT_RUNTIME
from trax_revplus.errors import UserError

try:
  import fcntl  # pylint: disable=g-import-not-at-top
except ImportError:  # Not on POSIX: runs are not locked.
  fcntl = None  # type: ignore[assignment]  # the module or None

LOCK_FILENAME = 'trax-revplus.lock'


def default_output_dir(config_files: Sequence[str], prefix: str = '') -> str:
  """`~/trax/<prefix><first config name>_<date>_<time>` (not expanded).

  Args:
    config_files: the command's config files; 'trax' names the dir when
      there are none.
    prefix: e.g. 'compare_'.
  """
  name = (
    os.path.splitext(os.path.basename(config_files[0]))[0]
    if config_files
    else 'trax'
  )
  stamp = datetime.datetime.now().strftime('%Y%m%d_%H%M%S')
  return os.path.join('~', 'trax', f'{prefix}{name}_{stamp}')


def check_writable(output_dir: str) -> None:
  """Checks that `output_dir` is a writable directory or can be made one.

  Raises:
    UserError (exit status 1): naming the path that is not a directory or
      not writable.
  """
  path = os.path.abspath(output_dir)
  probe = path
  while not os.path.exists(probe):
    parent = os.path.dirname(probe)
    if parent == probe:
      break
    probe = parent
  if not os.path.isdir(probe):
    raise UserError(
      f'cannot use output dir {output_dir}: {probe} is not a '
      f'directory; give an --output_dir that is a directory or '
      f'does not exist yet',
      EXIT_RUNTIME,
    )
  if not os.access(probe, os.W_OK | os.X_OK):
    what = 'it' if probe == path else f'its parent {probe}'
    raise UserError(
      f'cannot write to output dir {output_dir}: {what} is not '
      f'writable; give an --output_dir you can write to',
      EXIT_RUNTIME,
    )


def make(output_dir: str) -> None:
  """Creates `output_dir` and its parents.

  Raises:
    UserError (exit status 1): if it cannot be created.
  """
  try:
    os.makedirs(output_dir, exist_ok=True)
  except OSError as e:
    raise UserError(
      f'cannot create output dir {output_dir}: {e.strerror or e}', EXIT_RUNTIME
    ) from None


def _describe_holder(holder: dict) -> str:
  parts = [f'process {holder.get("pid", "?")}']
  if holder.get('host') and holder['host'] != socket.gethostname():
    parts[0] += f' on {holder["host"]}'
  details = []
  if holder.get('command'):
    details.append(str(holder['command']))
  if holder.get('started'):
    details.append(f'since {holder["started"]}')
  if details:
    parts.append(f'({", ".join(details)})')
  return ' '.join(parts)


class OutputDirLock:
  """An exclusive lock on an output directory for the length of a run.

  Usage:
    lock = OutputDirLock(output_dir, 'trax-revplus train')
    warning = lock.acquire()   # UserError if another process holds it
    try:
      ...
    finally:
      lock.release()

  Attributes:
    path: str, the lock file, `<output_dir>/trax-revplus.lock`.
  """

  def __init__(self, output_dir: str, command: str = PROG):
    self.output_dir = output_dir
    self.path = os.path.join(output_dir, LOCK_FILENAME)
    self._command = command
    self._fd: int | None = None

  @property
  def held(self) -> bool:
    """Whether this object holds the lock."""
    return self._fd is not None

  def acquire(self) -> str | None:
    """Takes the lock; the directory must exist.

    Returns:
      None, or a warning (str) when a lock left by a process that ended
      without releasing it (killed, crashed) was taken over, or when the
      file system cannot lock files (the run is then not protected).

    Raises:
      UserError (exit status 1): another live process holds the lock; the
        message names the directory and that process.
    """
    if fcntl is None:
      return None
    if self.held:
      return None
    while True:
      fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except OSError as e:
        if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
          os.close(fd)
          return (
            f'cannot lock {self.output_dir} ({e.strerror or e}): a '
            f'second run into it would not be detected'
          )
        holder = _read_holder(fd)
        os.close(fd)
        raise UserError(
          f'output dir {self.output_dir} is in use by '
          f'{_describe_holder(holder)}, which holds {self.path}; wait for '
          f'it to end, stop it, or give another --output_dir',
          EXIT_RUNTIME,
        ) from None
      # The file may have been removed (by its releasing holder) between
      # our open and our lock: then the lock is on a file nobody else sees.
      try:
        same = os.path.samestat(os.fstat(fd), os.stat(self.path))
      except FileNotFoundError:
        same = False
      if same:
        break
      os.close(fd)
    self._fd = fd
    previous = _read_holder(fd)
    record = {
      'pid': os.getpid(),
      'host': socket.gethostname(),
      'command': self._command,
      'started': time.strftime('%Y-%m-%d %H:%M:%S'),
    }
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(record).encode('utf-8') + b'\n', 0)
    os.fsync(fd)
    if previous.get('pid') is not None and previous.get('pid') != (os.getpid()):
      return (
        f'took over the lock of {self.output_dir} left by '
        f'{_describe_holder(previous)}, which ended without releasing '
        f'it (killed or crashed)'
      )
    return None

  def release(self) -> None:
    """Removes the lock file and releases the lock; harmless if not held."""
    fd, self._fd = self._fd, None
    if fd is None:
      return
    try:
      os.remove(self.path)
    except OSError:
      pass
    os.close(fd)


def _read_holder(fd: int) -> dict:
  """The lock file's record of its holder ({} if empty or unreadable)."""
  try:
    text = os.pread(fd, 4096, 0).decode('utf-8', 'replace')
    holder = json.loads(text) if text.strip() else {}
  except (OSError, ValueError):
    return {}
  return holder if isinstance(holder, dict) else {}
