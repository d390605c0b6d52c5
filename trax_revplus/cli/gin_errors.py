"""A gin error on a config as one line: where it is, then what is wrong.

gin says where a mistake is in three ways. Its `SyntaxError` carries the
file, line and column; an error applying a statement (an unknown
configurable, parameter or reference, a module that does not import)
carries gin's "In file "F", line N" or "In bindings string line N" lines
in its message, the line's text and, where gin knows it, a caret under
the column; Python's tokenizer, which gin reads the text with, raises
`tokenize.TokenError` for a bracket or string left open, with neither
file nor a useful position (`gin_text.unclosed` finds the bracket). Each
becomes `cannot parse config file P: <where>: <what>` (or `cannot apply
--config=...: ...`), where is "F, line N, column C" ("line N,
column C" in the file the command names, "column C" in a one-line
binding), and what is gin's first line (for a setting of ours, the fix:
`validation.gin_hints`). `check_macros_bound` names a macro nothing binds
in the same form, which gin reports only when a configurable using it is
called; `check_syntax` checks the syntax alone, importing nothing.
"""

import os
import re
import tokenize

from trax_revplus.cli import gin_text
from trax_revplus.errors import one_line
from trax_revplus.errors import UserError

# gin's lines saying where a statement is (`gin.utils.try_with_location`).
_IN_FILE = re.compile(r'^\s*In file "(.*)", line (\d+)$')
_IN_BINDINGS = re.compile(r'^\s*In bindings string line (\d+)$')
_CARET = re.compile(r'^ {4}( *)\^$')


def _same_file(a: str | None, b: str | None) -> bool:
  if a is None or b is None:
    return False
  try:
    return os.path.samefile(a, b)
  except OSError:
    return os.path.abspath(a) == os.path.abspath(b)


def _what(exception: BaseException) -> str:
  """gin's message without its location lines; for a setting of ours
  that does not exist, the fix (`validation.gin_hints`)."""
  # Here: the CLI starts on the standard library alone (cli/__init__).
  from trax_revplus import validation  # pylint: disable=g-import-not-at-top

  if isinstance(exception, SyntaxError):
    return exception.msg
  removed = validation.removed_knob_message(str(exception))
  if removed:
    return removed
  text = one_line(exception, context=False, typed=not str(exception))
  hint = validation.unknown_knob_hint(str(exception))
  return f'{text.rstrip(".")}; {hint}' if hint else text


def _column_of_name(message: str, line_text: str) -> int | None:
  """Where a statement-level error's subject stands: gin gives no column
  for those, but names the subject in quotes ('Foo', '@Foo', 'd_modle');
  the last one found in the statement's line, from 1."""
  for name in reversed(re.findall(r"'([^'\s]+)'", message)):
    found = re.search(rf'(?<![\w@%]){re.escape(name)}(?!\w)', line_text)
    if found:
      return found.start() + 1
  return None


def _located(
  exception: BaseException,
) -> tuple[str | None, gin_text.Position | None]:
  """(file or None, position) gin gives for `exception`; (None, None)
  where it gives none."""
  if isinstance(exception, SyntaxError):
    if exception.lineno is None:
      return exception.filename, None
    column = None if exception.offset is None else exception.offset + 1
    return exception.filename, gin_text.Position(exception.lineno, column)
  lines = str(exception).splitlines()
  for i, line in enumerate(lines):
    in_file, in_bindings = _IN_FILE.match(line), _IN_BINDINGS.match(line)
    match = in_file or in_bindings
    if not match:
      continue
    number = int(match.groups()[-1])
    statement = lines[i + 1][4:] if i + 1 < len(lines) else ''
    caret = _CARET.match(lines[i + 2]) if i + 2 < len(lines) else None
    column = (
      len(caret.group(1)) + 1
      if caret
      else _column_of_name(one_line(exception, context=False), statement)
    )
    return (
      in_file.group(1) if in_file else None,
      gin_text.Position(number, column),
    )
  return None, None


def _where(
  path: str | None,
  position: gin_text.Position | None,
  one_line_binding: bool = False,
) -> str:
  """'F, line N, column C', without what is None or goes without saying."""
  parts = [path] if path else []
  if position is not None:
    if not one_line_binding:
      parts.append(f'line {position.line}')
    if position.column is not None:
      parts.append(f'column {position.column}')
  return ', '.join(parts)


def _line(where: str, what: str) -> str:
  return f'{where}: {what}' if where else what


def _in_file(path: str, text: str) -> str:
  return f'cannot parse config file {path}: {text}'


def _in_binding(binding: str, text: str) -> str:
  return f'cannot apply --config={binding!r}: {text}'


def _binding_where(binding: str, position: gin_text.Position | None) -> str:
  """Where in a binding: its line too where it has several."""
  return _where(None, position, '\n' not in binding.strip('\n'))


def _token_error_in_file(exception: tokenize.TokenError, path: str) -> str:
  """Where a file (or one it includes) leaves a bracket or string open."""
  for candidate in gin_text.closure([path]):
    text = gin_text.read(candidate)
    found = text is not None and gin_text.unclosed(text)
    if found:
      what, position = found
      shown = None if _same_file(candidate, path) else candidate
      return _line(_where(shown, position), what)
  # In a file found on gin's search path only: gin names its include line.
  included_from, included_at = _located(exception)
  where = _where(
    None if _same_file(included_from, path) else included_from, included_at
  )
  return _line(where, f'{exception.args[0]} in the file included there')


def file_error(exception: BaseException, path: str) -> str:
  """'cannot parse config file <path>: <where>: <what>' for an error gin
  raised parsing config file `path` (another file is named where the error
  is in a file it includes)."""
  if isinstance(exception, tokenize.TokenError):
    return _in_file(path, _token_error_in_file(exception, path))
  located, position = _located(exception)
  shown = None if located is None or _same_file(located, path) else located
  return _in_file(path, _line(_where(shown, position), _what(exception)))


def binding_error(exception: BaseException, binding: str) -> str:
  """ "cannot apply --config='<binding>': <where>: <what>" for an error gin
  raised parsing `binding`."""
  if isinstance(exception, tokenize.TokenError):
    found = gin_text.unclosed(binding)
    what, position = found or (exception.args[0], None)
  else:
    what, (_, position) = _what(exception), _located(exception)
  return _in_binding(binding, _line(_binding_where(binding, position), what))


def _is_bound(name: str) -> bool:
  """Whether macro `%name` has a value: bound in the config, or a constant
  (`gin.constant`)."""
  # Here: the CLI starts on the standard library alone (cli/__init__).
  import gin  # pylint: disable=g-import-not-at-top

  for key in (f'%{name}', name):
    try:
      gin.query_parameter(key)
      return True
    except ValueError:
      continue
  return False


def check_macros_bound(config_files: list[str], bindings: list[str]) -> None:
  """Checks that every macro the config uses is bound, once it is parsed.

  gin itself raises, with its whole config in the message, only when a
  configurable using an unbound macro is called.

  Raises:
    UserError (exit status 2): naming the first use of a macro nothing
      binds, in the files (those they include next to them too) in order,
      then the bindings.
  """

  def unbound(name: str) -> str:
    return (
      f'macro %{name} is not bound; bind it (e.g. --config="{name} = '
      f'..."), or fix the name'
    )

  for config_file in config_files:
    for path in gin_text.closure([config_file]):
      for name, position in gin_text.macro_uses(gin_text.read(path) or ''):
        if not _is_bound(name):
          shown = None if _same_file(path, config_file) else path
          raise UserError(
            _in_file(config_file, _line(_where(shown, position), unbound(name)))
          )
  for binding in bindings:
    for name, position in gin_text.macro_uses(binding):
      if not _is_bound(name):
        raise UserError(
          _in_binding(
            binding, _line(_binding_where(binding, position), unbound(name))
          )
        )


def check_syntax(config_files: list[str], bindings: list[str]) -> None:
  """Checks the configs' syntax as gin reads it, applying nothing: no
  module imported, no name looked up. For a command whose configs are
  parsed later, elsewhere (`launch`: in each process, after it joined).

  Raises:
    UserError (exit status 2): the line `gin_config.parse_configs` gives
      for the same mistake.
  """
  # Here: the CLI starts on the standard library alone (cli/__init__).
  from gin import config_parser  # pylint: disable=g-import-not-at-top

  class AnyName(config_parser.ParserDelegate):
    """Takes every reference and macro: names are not checked here."""

    def configurable_reference(self, scoped_configurable_name, evaluate):
      del scoped_configurable_name, evaluate

    def macro(self, macro_name):
      del macro_name

  def statements(text_or_file) -> None:
    for _ in config_parser.ConfigParser(text_or_file, AnyName()):
      pass

  for config_file in config_files:
    for path in gin_text.closure([config_file]):
      try:
        with open(path, encoding='utf-8') as f:
          statements(f)
      except (OSError, UnicodeDecodeError):
        continue  # gin reports the file when it parses it.
      except (SyntaxError, tokenize.TokenError) as e:
        raise UserError(file_error(e, config_file)) from None
  for binding in bindings:
    try:
      statements(binding)
    except (SyntaxError, tokenize.TokenError) as e:
      raise UserError(binding_error(e, binding)) from None
