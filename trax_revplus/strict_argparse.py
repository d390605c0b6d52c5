"""argparse as every `trax-revplus` command reads its flags.

A mistake on the command line raises `UserError` (exit status 2) instead of
argparse's multi-line usage message and exit; flags must be spelled out (no
abbreviations) and show as `--name=VALUE` in help; a flag that takes one
value may be repeated only with the same value (`Once`). The value types
answer with the line a user reads after `argument --flag: `. Only the
standard library is imported, so `--help` and flag errors answer at once.
Numbers are written in the ASCII digits 0-9: Python's `int()` and
`float()` would read other scripts' digits too.

Below `cli` and `multiprocess`, which both read flags by it: the launch
flags (`multiprocess.launch_flags`) are the local launcher's own and the
CLI's `launch` command's.
"""

import argparse
import re
import sys
from typing import Any, NoReturn

from trax_revplus.errors import UserError


class Exit(Exception):
  """argparse asked to exit (after --help): the status to return."""

  def __init__(self, status: int):
    super().__init__(status)
    self.status = status


class Parser(argparse.ArgumentParser):
  """An ArgumentParser whose errors are `UserError`s, not exits.

  Flags must be spelled out (no abbreviations: `--config_fil` is an error,
  not `--config_file`) and show as `--name=VALUE` in help.
  """

  def __init__(self, **kwargs: Any):
    kwargs.setdefault('formatter_class', Formatter)
    kwargs.setdefault('allow_abbrev', False)
    super().__init__(**kwargs)

  def error(self, message: str) -> NoReturn:
    raise UserError(message)

  def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
    if message:
      sys.stderr.write(message)
    raise Exit(status)


class Formatter(argparse.RawDescriptionHelpFormatter):
  """Shows flags as `--name=VALUE`, the form absl and trax users type."""

  def __init__(self, prog: str):
    super().__init__(prog, max_help_position=32, width=80)

  def _format_action_invocation(self, action: argparse.Action) -> str:
    if not action.option_strings or action.nargs == 0:
      return super()._format_action_invocation(action)
    value = self._format_args(
      action, self._get_default_metavar_for_optional(action)
    )
    return ', '.join(f'{option}={value}' for option in action.option_strings)


class Once(argparse.Action):
  """Stores a one-value flag; a repeat must give the same value."""

  def __call__(
    self,
    parser: argparse.ArgumentParser,
    namespace: argparse.Namespace,
    values: Any,
    option_string: str | None = None,
  ) -> None:
    given = vars(namespace).setdefault('_given_once', {})
    if self.dest in given and given[self.dest][1] != values:
      first_option, first = given[self.dest]
      parser.error(
        f'{first_option}={first} and {option_string}={values} contradict '
        f'each other; give {option_string} once'
      )
    given[self.dest] = (option_string, values)
    setattr(namespace, self.dest, values)


# Numbers in flags are written in the ASCII digits 0-9, as the docs say:
# Python's int() and float() also read other scripts' digits ('٣'), spaces
# around the number, '_' between digits, '+', 'inf' and 'nan'.
_INTEGER = re.compile(r'-?[0-9]+')
_NUMBER = re.compile(r'-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?')
_DIGITS = 'in the digits 0-9'


def _int(text: str, what: str) -> int:
  """`text`, which `_INTEGER` matched, as an int."""
  try:
    return int(text)
  except ValueError:  # More digits than Python converts (4300).
    raise argparse.ArgumentTypeError(
      f'must be {what}, got {len(text)} digits'
    ) from None


def positive_int(text: str) -> int:
  """A flag's value as an int >= 1, written in the ASCII digits 0-9."""
  if not _INTEGER.fullmatch(text):
    raise argparse.ArgumentTypeError(
      f'must be a positive integer {_DIGITS}, got {text!r}'
    )
  value = _int(text, 'a positive integer')
  if value < 1:
    raise argparse.ArgumentTypeError(f'must be a positive integer, got {value}')
  return value


def positive_seconds(text: str) -> float:
  """A flag's value as a finite number of seconds > 0, written in the ASCII
  digits 0-9 (a decimal point and an exponent allowed: 10, 2.5, 1e3)."""
  if not _NUMBER.fullmatch(text):
    raise argparse.ArgumentTypeError(
      f'must be a positive number of seconds {_DIGITS}, e.g. 10 or 2.5, '
      f'got {text!r}'
    )
  value = float(text)
  if not 0 < value < float('inf'):
    raise argparse.ArgumentTypeError(
      f'must be a positive number of seconds, got {text}'
    )
  return value


def path(text: str) -> str:
  """A flag's value as a path, which must not be empty."""
  # An empty path would read as no flag at all (a default output place),
  # e.g. --output_dir= from a shell variable that is unset.
  if not text.strip():
    raise argparse.ArgumentTypeError('must be a path, got an empty one')
  return text


def integer(text: str) -> int:
  """A flag's value as an int, written in the ASCII digits 0-9 (with '-'
  before a negative one)."""
  if not _INTEGER.fullmatch(text):
    raise argparse.ArgumentTypeError(
      f'must be an integer {_DIGITS}, got {text!r}'
    )
  return _int(text, 'an integer')
