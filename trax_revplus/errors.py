"""Exit statuses, the base class of reported errors, and an error as one line.

Every command of trax_revplus (`trax-revplus` and its subcommands, the
processes of a multi-process run, the local launcher) ends with one of
these statuses:

  0    `EXIT_OK`: done.
  1    `EXIT_RUNTIME`: the command could work, but something failed while
       running.
  2    `EXIT_USAGE`: the command line, the config or the environment cannot
       work.
  4    `EXIT_LOST_PROCESS`: a process of a multi-process run ended because
       the run lost another process; the cause is elsewhere.
  128 + N  `signal_exit_status(N)`: stopped by signal N (130 for Ctrl-C).

A mistake a user can make is raised as a `UserError` (or a subclass, e.g.
`trax_revplus.multiprocess.errors`), whose message is one line and which
carries its exit status; the command prints it without a traceback.
`one_line` condenses any other exception's message for such a line.

Only the standard library is imported here: the CLI reads this module
before trax's import (seconds of CPU), and `multiprocess`, `cli` and
`compare` all import it.
"""

EXIT_OK = 0
EXIT_RUNTIME = 1
EXIT_USAGE = 2
# A process that ended because a collective found another process gone: a
# launcher can tell the process that failed first from those it took along.
EXIT_LOST_PROCESS = 4

# The lines gin adds to an exception's message to say where it was raised:
# the statement of a config file or bindings string (a position), or the
# configurable gin was calling (a call site, which gives a user nothing to
# fix: it is always left out).
_GIN_POSITION = ('In file ', 'In bindings string')
_GIN_CALL_SITE = 'In call to configurable'


def signal_exit_status(signum: int) -> int:
  """128 + `signum`: the status of a command stopped by that signal."""
  return 128 + signum


class UserError(Exception):
  """An error a command reports in one line (its message), no traceback.

  A mistake in the command line, the config or the environment, or a run
  that failed in a way the message explains.

  Attributes:
    exit_code: int, the status the command ends with: `EXIT_USAGE` unless
      given (or set by a subclass), `EXIT_RUNTIME`, `EXIT_LOST_PROCESS`, or
      `signal_exit_status(N)` for a run stopped by signal N.
  """

  exit_code = EXIT_USAGE

  def __init__(self, message: str, exit_code: int | None = None):
    super().__init__(message)
    if exit_code is not None:
      self.exit_code = exit_code


def one_line(
  exception: BaseException,
  context: bool = True,
  all_lines: bool = False,
  typed: bool = False,
  max_chars: int | None = None,
) -> str:
  """Condenses an exception's message (e.g. gin's, with context) to a line.

  By default keeps the first non-empty line, plus gin's "In file ..." /
  "In bindings string ..." context line when there is one; gin's "In call
  to configurable ..." line (where gin called a function) never.

  Args:
    exception: any exception.
    context: keep gin's context line; False drops it, also when gin's
      context is all the message there is.
    all_lines: keep every non-empty line, joined by spaces (e.g. JAX's
      errors, whose later lines say why), instead of the first; `context`
      then does not apply.
    typed: the exception's class name first, 'KeyError: ...'; the name
      alone where the line would be empty.
    max_chars: the most characters the line keeps; a longer one is cut to
      end with '...'. None: no limit.

  Returns:
    str without newlines; '' (context=False, typed=False) or the
    exception's class name if it has no message.
  """
  text = _condensed(exception, context, all_lines)
  if typed:
    name = type(exception).__name__
    text = f'{name}: {text}' if text else name
  if max_chars is not None and len(text) > max_chars:
    text = text[: max_chars - 3] + '...'
  return text


def _condensed(exception: BaseException, context: bool, all_lines: bool) -> str:
  """`one_line`'s text before its class name and limit."""
  lines = [line.strip() for line in str(exception).splitlines()]
  lines = [
    line for line in lines if line and not line.startswith(_GIN_CALL_SITE)
  ]
  if all_lines:
    return ' '.join(lines) or type(exception).__name__
  if not context:
    lines = [line for line in lines if not line.startswith(_GIN_POSITION)]
    return lines[0] if lines else ''
  if not lines:
    return type(exception).__name__
  where = [line for line in lines[1:] if line.startswith(_GIN_POSITION)]
  text = lines[0]
  if where:
    text += f' ({where[0]})'
  return text
