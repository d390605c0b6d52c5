"""What Python's tokenizer reads in a gin config's text.

gin reads a config with Python's `tokenize`, which fails on a bracket or
string left open only at the end of the text, with `tokenize.TokenError`,
no file name, and the position of that end (`unclosed` finds the bracket
itself). A macro (`%name`) that nothing binds is an error gin raises only
when a configurable using it is called (`macro_uses` finds every use, so
the config can be checked before anything runs). Both read tokens, so a
`%` or a bracket inside a string or a comment is none.
"""

import dataclasses
import io
import os
import re
import tokenize
from typing import Iterator

_CLOSING = {'(': ')', '[': ']', '{': '}'}

# gin's include statement, as its parser reads it at the start of a line.
_INCLUDE = re.compile(r"""^\s*include\s+(['"])(.+?)\1""", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class Position:
  """A place in a config's text.

  Attributes:
    line: int, from 1.
    column: int, from 1, or None where only the line is known.
  """

  line: int
  column: int | None = None


def _tokens(text: str) -> Iterator[tokenize.TokenInfo]:
  return tokenize.generate_tokens(io.StringIO(text).readline)


def unclosed(text: str) -> tuple[str, Position] | None:
  """What `text` leaves open, where Python's tokenizer cannot read it.

  Args:
    text: a gin config's text (a file's, or one binding).

  Returns:
    None where the text tokenizes; else (what, position): for a bracket
    never closed, "'(' is never closed" and the bracket's position; for a
    closing bracket that closes none, that bracket's; otherwise the
    tokenizer's message and line (e.g. a string never closed; its column
    differs between Python versions, so it is left out).
  """
  opened = []
  try:
    for token in _tokens(text):
      if token.type != tokenize.OP:
        continue
      if token.string in _CLOSING:
        opened.append(token)
      elif token.string in _CLOSING.values():
        if not opened:
          return (
            f'{token.string!r} closes no bracket',
            Position(token.start[0], token.start[1] + 1),
          )
        opened.pop()
  except tokenize.TokenError as e:
    if opened and 'statement' in e.args[0]:
      bracket = opened[-1]
      return (
        f'{bracket.string!r} is never closed',
        Position(bracket.start[0], bracket.start[1] + 1),
      )
    message = e.args[0]
    line = e.args[1][0] if len(e.args) > 1 else 1
    return message, Position(max(1, min(line, text.count('\n') + 1)))
  return None


def macro_uses(text: str) -> Iterator[tuple[str, Position]]:
  """Each macro `text` uses: (its name as written after '%', e.g.
  'eval_steps' or 'scope/name', and the position of its '%').

  A text the tokenizer cannot read yields the uses before that point.
  """
  tokens: list[tokenize.TokenInfo] = []
  try:
    tokens.extend(_tokens(text))
  except tokenize.TokenError:
    pass
  for i, token in enumerate(tokens):
    if token.type != tokenize.OP or token.string != '%':
      continue
    name, end = '', token.end
    for part in tokens[i + 1 :]:  # The name's parts follow without a space.
      if part.start != end or not (
        part.type == tokenize.NAME or part.string in ('.', '/')
      ):
        break
      name, end = name + part.string, part.end
    if name:
      yield name, Position(token.start[0], token.start[1] + 1)


def includes(path: str) -> list[str]:
  """The files `path` includes that lie next to it, as absolute paths, in
  order (gin looks others up on its search paths).

  A file that cannot be read includes none (gin reports the file itself).
  """
  folder = os.path.dirname(os.path.abspath(path))
  try:
    with open(path, encoding='utf-8') as f:
      text = f.read()
  except (OSError, UnicodeDecodeError):
    return []
  found = []
  for _, name in _INCLUDE.findall(text):
    candidate = os.path.join(folder, os.path.expanduser(name))
    if os.path.isfile(candidate):
      found.append(os.path.abspath(candidate))
  return found


def closure(config_files: list[str]) -> list[str]:
  """`config_files` and, transitively, the files they include next to
  their includers (`includes`), each once, as absolute paths; a file's
  includes come before it, as gin reads them (an include is parsed where
  it stands, the rest of its includer after it)."""
  ordered, seen = [], set()

  def visit(path: str) -> None:
    if path in seen:
      return
    seen.add(path)
    for included in includes(path):
      visit(included)
    ordered.append(path)

  for path in config_files:
    visit(os.path.abspath(path))
  return ordered


def read(path: str) -> str | None:
  """The text of config file `path`, or None where it cannot be read."""
  try:
    with open(path, encoding='utf-8') as f:
      return f.read()
  except (OSError, UnicodeDecodeError):
    return None
