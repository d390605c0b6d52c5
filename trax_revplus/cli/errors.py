"""Exit statuses of `trax-revplus` and the one-line form of its errors.

Every command reports a mistake a user can make as one line on stderr,
`trax-revplus <command>: error: <what is wrong and how to fix it>`, without a
traceback, and exits with `EXIT_USAGE` (the command line or config cannot
work) or `EXIT_RUNTIME` (it could, but something failed while running).
`trax_revplus.compare` uses the same definitions.
"""

import re

PROG = 'trax-revplus'
EXIT_OK = 0
EXIT_RUNTIME = 1
EXIT_USAGE = 2


class UserError(Exception):
  """A mistake in the command line, the config or the environment.

  Reported in one line (its message) and ends the command with `exit_code`.

  Attributes:
    exit_code: int, `EXIT_USAGE` (default) or `EXIT_RUNTIME`, or 128 + a
      signal number for a run stopped by that signal.
  """

  def __init__(self, message: str, exit_code: int = EXIT_USAGE):
    super().__init__(message)
    self.exit_code = exit_code


def one_line(exception: BaseException, context: bool = True) -> str:
  """Condenses an exception's message (e.g. gin's, with context) to a line.

  Keeps the first non-empty line, plus gin's "In file ..." / "In call to
  configurable ..." context line when there is one.

  Args:
    exception: any exception.
    context: keep gin's context line; False drops it, also when gin's
      context is all the message there is.

  Returns:
    str without newlines; '' (context=False) or the exception's class name
    if it has no message.
  """
  lines = [line.strip() for line in str(exception).splitlines()]
  lines = [line for line in lines if line]
  if not context:
    lines = [line for line in lines if not line.startswith(
        ('In call to configurable', 'In file ', 'In bindings string'))]
    return lines[0] if lines else ''
  if not lines:
    return type(exception).__name__
  where = [line for line in lines[1:] if line.startswith('In ')]
  text = lines[0]
  if where:
    # gin names the configurable and then its repr, e.g. "(<function f at
    # 0x7f...>)"; the name is enough.
    text += f' ({re.sub(r" [(]<[^>]*>[)]", "", where[0])})'
  return text


def error_line(command: str | None, message: str) -> str:
  """`trax-revplus <command>: error: <message>`, on one line."""
  head = f'{PROG} {command}' if command else PROG
  return f'{head}: error: {" ".join(message.split())}'


def warning_line(command: str | None, message: str) -> str:
  """`trax-revplus <command>: warning: <message>`, on one line."""
  head = f'{PROG} {command}' if command else PROG
  return f'{head}: warning: {" ".join(message.split())}'
