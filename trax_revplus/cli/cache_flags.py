"""The compilation cache of `train` and `estimate`, from their flags.

`directory_from_flags` checks the directory before anything is imported or
compiled (a bad one is a one-line usage error); `enabled` turns the cache
on for the command's work and makes JAX's warnings about unreadable
entries one line for the whole run (`UnreadableEntries`).
"""

import argparse
import contextlib
import logging as std_logging
from typing import Iterator

from trax_revplus import compilation_cache
from trax_revplus.errors import UserError


def directory_from_flags(flags: argparse.Namespace) -> str | None:
  """The cache directory the flags name, checked; None: no cache.

  Raises:
    UserError (exit status 2): the directory cannot be created or written.
  """
  if flags.nocompilation_cache:
    return None
  try:
    return compilation_cache.check_writable(flags.compilation_cache_dir)
  except compilation_cache.CompilationCacheError as e:
    raise UserError(str(e)) from None


class UnreadableEntries(std_logging.Filter):
  """Lets the first of JAX's warnings about an unreadable cache entry
  through as one line naming the directory and the fix, and drops the
  rest (one warning each per damaged entry)."""

  def __init__(self, directory: str):
    super().__init__()
    self._directory = directory
    self._told = False

  def filter(self, record: std_logging.LogRecord) -> bool:
    program = compilation_cache.is_unreadable_entry_warning(record.getMessage())
    if program is None:
      return True
    if self._told:
      return False
    self._told = True
    record.msg = (
      f'the compilation cache {self._directory} holds entries that cannot '
      f'be read (the first: {program!r}); their programs compile again '
      f'and are rewritten. To clear the cache, remove that directory'
    )
    record.args = ()
    return True


@contextlib.contextmanager
def enabled(directory: str | None) -> Iterator[None]:
  """The compilation cache on in `directory` while entered (None: off).

  Python warnings pass through logging's 'py.warnings' logger while a
  command runs (`noise.route_warnings`); the filter on it collapses JAX's
  unreadable-entry warnings to one line.
  """
  if directory is None:
    yield
    return
  logger = std_logging.getLogger('py.warnings')
  collapse = UnreadableEntries(directory)
  logger.addFilter(collapse)
  try:
    with compilation_cache.enabled(directory):
      yield
  finally:
    logger.removeFilter(collapse)
