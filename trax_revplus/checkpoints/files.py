"""Durable file operations a checkpoint set is committed with.

Each write reaches the disk (`fsync`) before the rename that makes it
visible, and the directory entry is flushed after, so a power cut leaves
either the old file or the new one.
"""

import json
import os
from typing import Any


def fsync(path: str) -> None:
  """Flushes the file (or directory) at `path` to the disk.

  Raises:
    OSError: `path` cannot be opened or flushed.
  """
  fd = os.open(path, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


def fsync_dir(directory: str) -> None:
  """Flushes `directory`'s entries to the disk where the platform can."""
  try:
    fsync(directory)
  except OSError:
    pass  # Some platforms cannot open or fsync a directory.


def remove(path: str) -> None:
  """Removes the file at `path`; a missing file is not an error."""
  try:
    os.remove(path)
  except FileNotFoundError:
    pass


def write_json_atomic(path: str, obj: dict[str, Any]) -> None:
  """Writes `obj` as JSON to `path`: the old content or the new, never half.

  Writes `<path>._tmp_`, flushes it, renames it over `path` and flushes the
  directory. On any failure the temporary file is removed.

  Args:
    path: the file to write.
    obj: a JSON-serializable dict (keys sorted in the file).

  Raises:
    OSError: the file cannot be written (nothing is left behind).
  """
  tmp = path + '._tmp_'
  try:
    with open(tmp, 'w', encoding='utf-8') as f:
      json.dump(obj, f, indent=1, sort_keys=True)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    remove(tmp)
    raise
  fsync_dir(os.path.dirname(path))
