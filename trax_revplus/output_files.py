"""Writing a command's output file without destroying what was there.

Every file a `trax-revplus` command writes at a path the user named (the
JSON of `estimate`, the PNG of `plot-memory`, `compare.json` and
`compare.png`) goes through `write`, after `check` said, before any work,
that it can be written:

  * a regular file, or a path where nothing is yet (its directory must
    exist), is written to a temporary file in the same directory, flushed
    to the disk and renamed over the path: a reader sees the old file or
    the new one, never half of one;
  * a symbolic link is followed: its target is written as above and the
    link stays a link;
  * a named pipe or a character device (`/dev/stdout`, `/dev/null`, a
    terminal) is written through, in place: it cannot be replaced, only
    written to;
  * `-` is standard output (where the command allows it);
  * anything else (a directory, a block device, a socket) is refused.

The temporary file is removed on every failure (a full disk included), so
no `.tmp` file and no empty output is left behind. Every refusal is a
`UserError`: one line naming the path, what is wrong and the fix.

Only the standard library is imported here, so a command checks its
output paths before its slow imports.
"""

import contextlib
import errno
import os
import stat
import sys
import tempfile
from typing import IO, Callable, Iterator

from trax_revplus.errors import EXIT_RUNTIME
from trax_revplus.errors import EXIT_USAGE
from trax_revplus.errors import UserError

STDOUT = '-'


class OutputFileError(UserError):
  """An output path that cannot be written, or a write that failed."""


def _kind(mode: int) -> str | None:
  """What a file of `mode` is, when it is not writable in place or by
  rename (None: it is)."""
  if stat.S_ISDIR(mode):
    return 'a directory'
  if stat.S_ISBLK(mode):
    return 'a block device'
  if stat.S_ISSOCK(mode):
    return 'a socket'
  return None


def _written_in_place(mode: int) -> bool:
  """Whether a file of `mode` is written through (a pipe, a character
  device) rather than replaced."""
  return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)


def _target(path: str) -> str:
  """`path` with symbolic links followed (the file that gets written)."""
  return os.path.realpath(path) if os.path.islink(path) else path


def check(path: str, flag: str, allow_stdout: bool = False) -> None:
  """Checks, before any work, that `write(path, ...)` can succeed.

  Args:
    path: str, the output path as the user gave it.
    flag: str naming it in messages, e.g. '--json'.
    allow_stdout: whether `-` (standard output) is allowed.

  Raises:
    OutputFileError: exit status 2 for a path that can never be an output
      file (empty, `-` where not allowed, a directory, a block device, a
      socket, a dangling link's loop); 1 for one that cannot be written
      here (its directory is missing or not writable, the file is not
      writable).
  """
  if path == STDOUT:
    if allow_stdout:
      return
    raise OutputFileError(f'{flag}=- is not allowed here; give a file path')
  if not path:
    raise OutputFileError(f'{flag} is empty; give a file path')
  target = _target(path)
  shown = path if target == path else f'{path} (a link to {target})'
  try:
    mode = os.stat(target).st_mode
  except (FileNotFoundError, NotADirectoryError):
    mode = None
  except OSError as e:
    if e.errno == errno.ELOOP:
      raise OutputFileError(
        f'{flag}={shown}: the link loops; give a file path'
      ) from None
    raise OutputFileError(
      f'cannot write {flag}={shown}: {e.strerror or e}', EXIT_RUNTIME
    ) from None
  if mode is not None:
    kind = _kind(mode)
    if kind is not None:
      raise OutputFileError(
        f'{flag}={shown} is {kind}; give the path of a file', EXIT_USAGE
      )
    if not os.access(target, os.W_OK):
      raise OutputFileError(
        f'cannot write {flag}={shown}: the file is not writable', EXIT_RUNTIME
      )
    if _written_in_place(mode):
      return
  directory = os.path.dirname(os.path.abspath(target))
  if not os.path.isdir(directory):
    what = (
      f'{directory} is not a directory; give a path in a directory'
      if os.path.lexists(directory)
      else f'directory {directory} does not exist; create it first'
    )
    raise OutputFileError(f'cannot write {flag}={shown}: {what}', EXIT_RUNTIME)
  if not os.access(directory, os.W_OK | os.X_OK):
    raise OutputFileError(
      f'cannot write {flag}={shown}: directory {directory} is not writable',
      EXIT_RUNTIME,
    )


def write(
  path: str, fill: Callable[[IO[bytes]], object], flag: str | None = None
) -> str:
  """Writes an output file safely (see the module docstring).

  Args:
    path: str, the output path; `-` for standard output.
    fill: callable(binary file object) that writes the content.
    flag: str naming the path in messages (default: the path alone).

  Returns:
    str, the path written: `path` itself (for a link, the link's path).

  Raises:
    OutputFileError: exit status 1 when the file cannot be written (e.g.
      no space left: nothing is left behind), 2 when the path is one that
      can never be written (as `check`).
  """
  name = f'{flag}={path}' if flag else path
  if path == STDOUT:
    sys.stdout.flush()
    fill(sys.stdout.buffer)
    sys.stdout.buffer.flush()
    return path
  check(path, flag or 'the output', allow_stdout=False)
  target = _target(path)
  try:
    mode = os.stat(target).st_mode
  except (FileNotFoundError, NotADirectoryError):
    mode = None
  except OSError as e:
    raise OutputFileError(
      f'cannot write {name}: {e.strerror or e}', EXIT_RUNTIME
    ) from None
  try:
    if mode is not None and _written_in_place(mode):
      with open(target, 'wb') as f:
        fill(f)
    else:
      with _replacing(target) as f:
        fill(f)
  except OSError as e:
    raise OutputFileError(
      f'cannot write {name}: {e.strerror or e}', EXIT_RUNTIME
    ) from None
  return path


@contextlib.contextmanager
def _replacing(target: str) -> Iterator[IO[bytes]]:
  """A temporary file beside `target`, renamed over it when the block ends
  without an error; removed otherwise. Keeps an existing file's mode."""
  directory = os.path.dirname(os.path.abspath(target))
  fd, tmp = tempfile.mkstemp(
    dir=directory, prefix=f'.{os.path.basename(target)}.', suffix='.tmp'
  )
  try:
    with os.fdopen(fd, 'wb') as f:
      yield f
      f.flush()
      os.fsync(f.fileno())
    try:
      os.chmod(tmp, stat.S_IMODE(os.stat(target).st_mode))
    except FileNotFoundError:  # A new file: the mode umask gives.
      umask = os.umask(0)
      os.umask(umask)
      os.chmod(tmp, 0o666 & ~umask)
    os.replace(tmp, target)
  except BaseException:
    with contextlib.suppress(OSError):
      os.unlink(tmp)
    raise
