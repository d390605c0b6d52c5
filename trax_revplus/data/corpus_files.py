"""Finding, reading and splitting the files of a local text corpus."""

import fnmatch
import glob
import hashlib
import os
import sysconfig
from typing import Iterable, Sequence, Union

import numpy as np

from trax_revplus.data.errors import CorpusError
from trax_revplus.data.errors import CorpusSettingError

# Directory names skipped in the default corpus: third-party code installed
# next to the standard library, and the stdlib's own test suites (they hold
# deliberately malformed and binary-ish sources).
DEFAULT_EXCLUDED_DIRS = (
  'site-packages',
  'dist-packages',
  '__pycache__',
  'test',
  'tests',
  'idle_test',
)

# Where files are read from: a file, a directory or a glob, or a sequence
# of them (see `resolve_paths`).
Paths = Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]]


def default_corpus_root() -> str:
  """Returns the directory of the running Python's standard library (str)."""
  return sysconfig.get_paths()['stdlib']


def default_corpus_files(
  root: str | None = None,
  exclude_dirs: Iterable[str] | None = DEFAULT_EXCLUDED_DIRS,
) -> list[str]:
  """Lists the `*.py` files of the standard library, sorted.

  Args:
    root: Directory to search (str); the stdlib of the running Python if None.
    exclude_dirs: Directory names (not paths) whose subtrees are skipped.

  Returns:
    Sorted list of absolute file paths (str).

  Raises:
    CorpusError: If no `.py` file is found under `root`.
  """
  root = os.path.abspath(root or default_corpus_root())
  excluded = set(exclude_dirs or ())
  files: list[str] = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = [d for d in dirnames if d not in excluded]
    files.extend(
      os.path.join(dirpath, f) for f in fnmatch.filter(filenames, '*.py')
    )
  if not files:
    raise CorpusError(
      f'No *.py files found under the standard library '
      f'directory {root!r}; name files with '
      f'local_text_inputs.paths.'
    )
  return sorted(files)


def resolve_paths(paths: Paths) -> list[str]:
  """Expands files, directories and globs into a sorted list of files.

  Args:
    paths: A str or a sequence of str. Each entry is a file, a directory (all
      regular files below it, recursively) or a glob pattern (`**` matches
      any number of directories). `~` is expanded.

  Returns:
    Sorted list of unique absolute file paths (str).

  Raises:
    CorpusError: If `paths` is empty or an entry matches no regular file or
      only empty files.
  """
  entries = (
    [paths] if isinstance(paths, (str, os.PathLike)) else list(paths or ())
  )
  if not entries:
    raise CorpusSettingError(
      'local_text_inputs.paths is empty; give at least '
      'one file, directory or glob, or None for the '
      'default corpus.'
    )
  files: set[str] = set()
  for entry in entries:
    pattern = os.path.expanduser(os.fspath(entry))
    if os.path.isdir(pattern):
      matched = [
        os.path.join(d, f) for d, _, names in os.walk(pattern) for f in names
      ]
    else:
      matched = glob.glob(pattern, recursive=True)
    matched = [os.path.abspath(m) for m in matched if os.path.isfile(m)]
    if not matched:
      raise CorpusError(
        f'Path or glob {entry!r} matches no file; check the '
        f'spelling or the working directory '
        f'({os.getcwd()!r}).'
      )
    if not any(os.path.getsize(m) for m in matched):
      raise CorpusError(f'Path or glob {entry!r} matches only empty files.')
    files.update(matched)
  return sorted(files)


def read_bytes(files: Sequence[str]) -> np.ndarray:
  """Reads and concatenates files into one byte buffer.

  Args:
    files: Sequence of file paths (str), read in the given order.

  Returns:
    1-D `np.uint8` array of length sum of the file sizes (bytes).
  """
  sizes = [os.path.getsize(f) for f in files]
  buffer = np.empty(sum(sizes), dtype=np.uint8)
  view = buffer.data  # A memoryview of its bytes, which readinto fills.
  position = 0
  for path, size in zip(files, sizes):
    with open(path, 'rb') as f:
      # A file may shrink between getsize and read; keep what was read.
      position += f.readinto(view[position : position + size])
  return buffer[:position]


def _split_score(relative_path: str, seed: int) -> float:
  """A deterministic pseudo-random number in [0, 1) for one file."""
  digest = hashlib.sha256(f'{seed}:{relative_path}'.encode('utf-8')).digest()
  return int.from_bytes(digest[:8], 'big') / 2.0**64


def split_files(
  files: Iterable[str], eval_fraction: float, seed: int = 0
) -> tuple[list[str], list[str]]:
  """Assigns whole files to train or eval, deterministically.

  The assignment of a file depends only on its path relative to the files'
  common directory and on `seed`, so it is the same on every machine and does
  not change when other files are added or removed. Each split gets at least
  one file.

  Args:
    files: At least 2 file paths (str).
    eval_fraction: Expected fraction of files in eval, in (0, 1).
    seed: int; changes the assignment.

  Returns:
    (train_files, eval_files): two disjoint sorted lists of paths.

  Raises:
    CorpusError: If fewer than 2 files are given.
  """
  files = sorted(files)
  if len(files) < 2:
    raise CorpusError(
      f'{len(files)} file(s) matched, but a per-file train/eval split needs '
      f'at least 2. Set local_text_inputs.split_by = "bytes" (eval is the '
      f'last eval_fraction of the bytes) or name eval files with '
      f'local_text_inputs.eval_paths.'
    )
  root = os.path.commonpath(files)
  scored = sorted(
    (_split_score(os.path.relpath(f, root).replace(os.sep, '/'), seed), f)
    for f in files
  )
  n_eval = sum(1 for score, _ in scored if score < eval_fraction)
  n_eval = min(max(n_eval, 1), len(files) - 1)
  eval_files = sorted(f for _, f in scored[:n_eval])
  train_files = sorted(f for _, f in scored[n_eval:])
  return train_files, eval_files
