"""The one-line form of `trax-revplus`'s errors and warnings.

Every command reports a mistake a user can make as one line on stderr,
`trax-revplus <command>: error: <what is wrong and how to fix it>`, without a
traceback, and ends with the error's exit status; the statuses and the
error base class are in `trax_revplus.errors`.
"""

PROG = 'trax-revplus'


def error_line(command: str | None, message: str) -> str:
  """`trax-revplus <command>: error: <message>`, on one line."""
  head = f'{PROG} {command}' if command else PROG
  return f'{head}: error: {" ".join(message.split())}'


def warning_line(command: str | None, message: str) -> str:
  """`trax-revplus <command>: warning: <message>`, on one line."""
  head = f'{PROG} {command}' if command else PROG
  return f'{head}: warning: {" ".join(message.split())}'
