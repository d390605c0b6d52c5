"""Importing trax and parsing gin configs the way `trax-revplus train` does."""

import contextlib
import io
import logging as std_logging
import os
import sys
import tempfile
import tokenize
from typing import Any, Iterator

import trax_revplus
from trax_revplus import import_signals
from trax_revplus import trax_import
from trax_revplus.cli import gin_errors
from trax_revplus.cli import gin_text
from trax_revplus.errors import UserError

# What gin raises for a config it cannot parse or apply; Python's
# tokenizer, which gin reads the text with, raises TokenError.
_GIN_ERRORS = (
  SyntaxError,
  tokenize.TokenError,
  ValueError,
  ImportError,
  NameError,
  AttributeError,
  TypeError,
  OSError,
  KeyError,
)
# trax's modules whose gin configurables configs use.
_TRAX_CONFIGURABLES = (
  'trax.data',
  'trax.layers',
  'trax.models',
  'trax.optimizers',
  'trax.supervised.trainer_lib',
)


@contextlib.contextmanager
def _stderr_captured_to(capture) -> Iterator[None]:
  """Sends file descriptor 2 to the temporary file `capture` meanwhile."""
  sys.stderr.flush()
  saved = os.dup(2)
  os.dup2(capture.fileno(), 2)
  try:
    yield
  finally:
    sys.stderr.flush()
    os.dup2(saved, 2)
    os.close(saved)


def import_trax_quietly() -> str:
  """Imports trax and the modules whose gin configurables configs use.

  TensorFlow, XLA and gym print notices on stderr while trax is imported
  (see `noise.KNOWN_NOISE`); they are captured here and go to the run's
  log, not the terminal. If the import fails, they are printed after all.

  Returns:
    The text trax's imports printed on stderr (str).
  """
  python_level = io.StringIO()  # sys.stderr, where it is not descriptor 2.
  with tempfile.TemporaryFile(mode='w+b') as capture:
    try:
      with (
        import_signals.signals_wait_for_imports(),
        _stderr_captured_to(capture),
        contextlib.redirect_stderr(python_level),
      ):
        for name in _TRAX_CONFIGURABLES:
          trax_import.module(name)
        # Ours that configs use, which import trax.
        # pylint: disable=g-import-not-at-top,unused-import
        from trax_revplus import data as _revplus_data  # noqa: F401
        from trax_revplus import progress as _revplus_progress  # noqa: F401
        # pylint: enable=g-import-not-at-top,unused-import
    except Exception as e:  # pylint: disable=broad-except
      # Here: the CLI starts on the standard library alone (cli/__init__).
      from trax_revplus import interrupt  # pylint: disable=g-import-not-at-top

      if isinstance(e, interrupt.Interrupted):
        raise  # A signal stopped the import: its notices are no news.
      capture.seek(0)
      sys.stderr.write(
        capture.read().decode('utf-8', 'replace') + python_level.getvalue()
      )
      raise
    capture.seek(0)
    return capture.read().decode('utf-8', 'replace') + python_level.getvalue()


class _GinSearchNoise(std_logging.Filter):
  """Drops gin's "Path not found" errors for search-path misses.

  gin looks for an `include`d file under every search path in turn and logs
  an error on the root logger for each miss, even when a later path has it.
  """

  def filter(self, record: std_logging.LogRecord) -> bool:
    return not (
      record.pathname.endswith('resource_reader.py')
      and record.getMessage().startswith('Path not found')
    )


def parse_configs(config_files: list[str], bindings: list[str]) -> None:
  """Parses gin config files, then bindings, the way `train` does.

  Starts from an empty gin config and stock trax (any earlier activation is
  undone), so that an `import trax_revplus.activate` line in the configs
  takes effect in this call. The directory of each config file, and of each
  file they include (transitively), is added to gin's search path, so
  `include 'base.gin'` finds a file next to its includer at any depth.
  trax and the configurables configs use must be imported already.

  Args:
    config_files: paths of .gin files, parsed in order.
    bindings: gin binding strings, parsed after the files.

  Raises:
    UserError (exit status 2): one line naming the file or binding gin
      could not parse or apply, the position in it and what is wrong
      (`gin_errors`); or a macro the config uses that nothing binds.
  """
  # Here: the CLI starts on the standard library alone (cli/__init__).
  import gin  # pylint: disable=g-import-not-at-top

  gin.clear_config()
  # Also lets gin's `import trax_revplus.activate` run the module (and
  # activate) again in this process.
  trax_revplus.deactivate()
  for folder in _include_dirs(config_files):
    gin.add_config_file_search_path(folder)
  noise = _GinSearchNoise()
  std_logging.getLogger().addFilter(noise)
  try:
    for path in config_files:
      try:
        gin.parse_config_file(path)
      except _GIN_ERRORS as e:
        raise UserError(gin_errors.file_error(e, path)) from None
  finally:
    std_logging.getLogger().removeFilter(noise)
  for binding in bindings:
    try:
      gin.parse_config(binding)
    except _GIN_ERRORS as e:
      raise UserError(gin_errors.binding_error(e, binding)) from None
  gin_errors.check_macros_bound(config_files, bindings)


def _include_dirs(config_files: list[str]) -> list[str]:
  """The directories of `config_files` and of every file they include,
  transitively, where found next to the includer: gin looks an include up
  only on its search paths, so a file included from an included file in
  another directory needs that directory there too."""
  dirs, seen = [], set()
  pending = [os.path.abspath(p) for p in config_files]
  while pending:
    path = pending.pop(0)
    if path in seen:
      continue
    seen.add(path)
    folder = os.path.dirname(path)
    if folder not in dirs:
      dirs.append(folder)
    pending.extend(gin_text.includes(path))
  return dirs


_UNBOUND = object()


def bound_value(name: str, default: Any = _UNBOUND) -> Any:
  """The value gin binds to `name` (e.g. 'train.steps'), macros followed.

  Args:
    name: 'configurable.parameter' or a macro name.
    default: returned when `name` is not bound.

  Returns:
    The bound value as parsed (an int, str, list, ... or a
    `gin.config.ConfigurableReference` for `@name` and `@name()`).

  Raises:
    ValueError: `name` is not bound and no default is given.
  """
  # Here: the CLI starts on the standard library alone (cli/__init__).
  import gin  # pylint: disable=g-import-not-at-top

  try:
    value = gin.query_parameter(name)
  except ValueError:
    if default is _UNBOUND:
      raise
    return default
  seen = set()
  # A macro (`%name`) is a reference whose text starts with '%'.
  while (
    isinstance(value, gin.config.ConfigurableReference)
    and str(value).startswith('%')
    and str(value) not in seen
  ):
    seen.add(str(value))
    value = gin.query_parameter(str(value))
  return value


def is_reference(value: Any) -> bool:
  """Whether a bound value is a `@configurable` reference (not a literal)."""
  # Here: the CLI starts on the standard library alone (cli/__init__).
  import gin  # pylint: disable=g-import-not-at-top

  return isinstance(value, gin.config.ConfigurableReference)
