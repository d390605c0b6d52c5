"""JAX's persistent compilation cache, on for every run.

Compiling the programs of a step takes minutes at the sizes users train
(on a TPU, trax's enwik8 Reformer compiles each program for one to two
minutes), and a run that resumes, or a second run of the same config,
compiles the same programs again. JAX keeps compiled executables on disk
when `jax_compilation_cache_dir` is set; `enable` sets it, so that a
program compiled once by any run of this user is read back in every later
one. The cache key is JAX's: the program's HLO, the compile options, the
backend and JAX's version, so a changed model, plan or JAX compiles anew.

`trax-revplus train` enables it before anything compiles
(`--compilation_cache_dir`, default `default_directory()`;
`--nocompilation_cache` leaves it off); from Python, call `enable()`. The
trainer keeps the plans it chooses in the same directory
(`trainer._search.plan_store`), so that a config plans once per device.
Every program is cached, however short its compilation: a plan's many
small programs add up to most of a first step.

An entry that cannot be read (a damaged file) is compiled again and
rewritten; JAX warns once per entry (`is_unreadable_entry_warning` tells
those warnings apart).
"""

import contextlib
import importlib.util
import os
import re
import tempfile
from typing import Iterator

from trax_revplus import notices
from trax_revplus import trax_import

AUTO = 'auto'
# The most bytes the cache keeps: past it, the entries read least recently
# go. JAX keeps a cache with a size under a file lock (the `filelock`
# package), so that processes sharing it, e.g. those of a `launch`, never
# read an entry another is still writing.
MAX_SIZE_BYTES = 8 * 2**30
_UNREADABLE_ENTRY = re.compile(
  r"Error reading persistent compilation cache entry for '([^']*)'"
)


class CacheUnboundedWarning(UserWarning):
  """The cache is kept without its size limit (`MAX_SIZE_BYTES`)."""


class CompilationCacheError(ValueError):
  """The compilation cache directory cannot be created or written."""


def default_directory() -> str:
  """`$XDG_CACHE_HOME/trax_revplus/jax` (default `~/.cache/...`)."""
  base = os.environ.get('XDG_CACHE_HOME') or os.path.join(
    os.path.expanduser('~'), '.cache'
  )
  return os.path.join(base, 'trax_revplus', 'jax')


def resolve(directory: str) -> str:
  """The directory `directory` names: `AUTO` is `default_directory()`;
  `~` is expanded; the result is absolute."""
  if directory == AUTO:
    directory = default_directory()
  return os.path.abspath(os.path.expanduser(directory))


def check_writable(directory: str) -> str:
  """Creates `directory` where missing and checks that files can be
  written in it, before anything is compiled.

  Args:
    directory: a path, or `AUTO`.

  Returns:
    The resolved directory (`resolve`).

  Raises:
    CompilationCacheError: it cannot be created, or a file cannot be
      written in it (read-only, not a directory, no permission).
  """
  path = resolve(directory)
  try:
    os.makedirs(path, exist_ok=True)
    # os.access says yes to root on a read-only mount; writing tells.
    with tempfile.NamedTemporaryFile(dir=path, prefix='.write-check-'):
      pass
  except OSError as e:
    reason = e.strerror or type(e).__name__
    raise CompilationCacheError(
      f'the compilation cache directory {path} cannot be written '
      f'({reason}): give a writable one with --compilation_cache_dir=DIR, '
      f'or run without the cache with --nocompilation_cache'
    ) from None
  return path


# The directory `enable` last set (`enabled_directory`).
_enabled: str | None = None


def enable(directory: str = AUTO) -> str:
  """Turns JAX's persistent compilation cache on, in `directory`.

  Programs compiled after the call are written there, and a program
  compiled before by any process using the same directory is read back
  instead of compiled. Call it before the first compilation that should be
  cached; calling it again moves the cache.

  Args:
    directory: where the cache lives; `AUTO` (default):
      `default_directory()`.

  Returns:
    The directory, resolved.

  Raises:
    CompilationCacheError: as `check_writable`.
  """
  jax = trax_import.jax
  compilation_cache = trax_import.compilation_cache
  global _enabled
  path = check_writable(directory)
  jax.config.update('jax_compilation_cache_dir', path)
  _enabled = path
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
  jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)
  if importlib.util.find_spec('filelock') is not None:
    jax.config.update('jax_compilation_cache_max_size', MAX_SIZE_BYTES)
  else:
    # JAX keeps a bounded cache only under a file lock: without `filelock`
    # every read would fail (as an unreadable entry) and every program
    # compile again. Unbounded, the cache still serves every run.
    jax.config.update('jax_compilation_cache_max_size', -1)
    notices.notify(
      f'the compilation cache {path} has no size limit: the filelock '
      f'package is not installed (pip install filelock)',
      CacheUnboundedWarning,
    )
  # JAX opens its cache once, at the first compilation: this makes the
  # next compilation open it in `path`.
  compilation_cache.reset_cache()
  return path


_SETTINGS = (
  'jax_compilation_cache_dir',
  'jax_persistent_cache_min_compile_time_secs',
  'jax_persistent_cache_min_entry_size_bytes',
  'jax_compilation_cache_max_size',
)


@contextlib.contextmanager
def enabled(directory: str = AUTO) -> Iterator[str]:
  """`enable(directory)` while entered; JAX's cache settings as they were
  afterwards.

  Yields:
    The directory, resolved.

  Raises:
    CompilationCacheError: as `check_writable`.
  """
  jax = trax_import.jax
  compilation_cache = trax_import.compilation_cache
  saved = {name: getattr(jax.config, name) for name in _SETTINGS}
  try:
    yield enable(directory)
  finally:
    for name, value in saved.items():
      jax.config.update(name, value)
    compilation_cache.reset_cache()


def enabled_directory() -> str | None:
  """The directory `enable` turned the cache on in, while it is on there;
  else None (off, or set through JAX's own settings). The planner keeps
  its chosen plans there too (`trainer._search.plan_store`)."""
  jax = trax_import.jax
  # JAX's config holds each option as an attribute made at run time, which
  # its types do not declare.
  if (
    _enabled is not None and jax.config.jax_compilation_cache_dir == _enabled  # type: ignore[attr-defined]
  ):
    return _enabled
  return None


def is_unreadable_entry_warning(message: str) -> str | None:
  """The program's name where `message` is JAX's warning that a cache entry
  could not be read (it compiles again); else None."""
  match = _UNREADABLE_ENTRY.search(message)
  return match.group(1) if match else None
