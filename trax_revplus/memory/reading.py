"""Reading a `memory.jsonl` defensively: its valid records, and what is not.

Every reader of a memory log uses the records that are valid: the commands
(`plot-memory`, `compare`) through `read`, and say how many lines are not
and where the first one is, instead of tracing back on a field of the wrong
type or skipping damage without a word; Python callers through
`read_memory_log`, which logs the same. A line is unreadable when it

  * is not one JSON object (a record cut short by a killed writer, binary
    junk, text of another file), or
  * lacks `step` (a number) or `phase` (a string), or has a field that the
    readers use (`fields.FIELD_TYPES`) of another type.

Other fields are not checked: the trainer may add fields of its own, and
the readers ignore what they do not know. A file with lines but no valid
record is corrupt (`CorruptMemoryLogError`); an empty file is not, it only
holds no records yet.
"""

import json
import math
import os
from typing import Any, NamedTuple

from absl import logging

from trax_revplus.errors import EXIT_RUNTIME
from trax_revplus.errors import UserError
from trax_revplus.memory.fields import FIELD_TYPES
from trax_revplus.memory.fields import INT
from trax_revplus.memory.fields import NUMBER
from trax_revplus.memory.fields import REQUIRED

Record = dict[str, Any]


class CorruptMemoryLogError(UserError):
  """A memory log with lines, none of them a valid record (exit status 1)."""

  exit_code = EXIT_RUNTIME


def _has_type(value: Any, kind: str) -> bool:
  if isinstance(value, bool):
    return False
  if kind == NUMBER:
    return isinstance(value, (int, float)) and math.isfinite(value)
  if kind == INT:
    return isinstance(value, int)
  return isinstance(value, str)


def record_problem(record: Any) -> str | None:
  """What makes a parsed line unusable as a record, or None if nothing.

  Args:
    record: a line's parsed JSON value.

  Returns:
    str, e.g. "field 'step' is not a number", or None.
  """
  if not isinstance(record, dict):
    return 'not a JSON object'
  for name in REQUIRED:
    if record.get(name) is None:
      return f'no {name!r}'
  for name, kind in FIELD_TYPES.items():
    value = record.get(name)
    if value is not None and not _has_type(value, kind):
      return f'field {name!r} is not {kind}'
  return None


class LogReading(NamedTuple):
  """What `read` found in a memory log.

  Attributes:
    path: str, the file read.
    records: list of dict, its valid records in file order.
    lines: int, its non-empty lines.
    unreadable: int, the lines that are not valid records.
    first_unreadable_line: int (1-based line number) or None.
    first_problem: str or None, what is wrong with that line.
  """

  path: str
  records: list[Record]
  lines: int
  unreadable: int
  first_unreadable_line: int | None
  first_problem: str | None

  def unreadable_note(self) -> str | None:
    """One line on the unreadable lines, or None when there are none.

    E.g. 'memory.jsonl: 2 of 40 lines are not memory records and were
    skipped (the first, line 7: not a JSON object)'.
    """
    if not self.unreadable:
      return None
    many = self.unreadable != 1
    return (
      f'{self.path}: {self.unreadable} of {self.lines} lines '
      f'{"are" if many else "is"} not {"" if many else "a "}memory '
      f'record{"s" if many else ""} and {"were" if many else "was"} '
      f'skipped (the first, line {self.first_unreadable_line}: '
      f'{self.first_problem})'
    )

  def check_not_corrupt(self) -> None:
    """Raises `CorruptMemoryLogError` when no line is a valid record."""
    if self.lines and not self.records:
      which = (
        'its only line is not'
        if self.lines == 1
        else f'none of its {self.lines} lines is'
      )
      raise CorruptMemoryLogError(
        f'{self.path} is corrupt: {which} a memory record (line '
        f'{self.first_unreadable_line}: {self.first_problem}); plot the '
        f'memory.jsonl a trax_revplus training run wrote'
      )


def read(path: str | os.PathLike) -> LogReading:
  """Reads a memory log, keeping its valid records.

  Args:
    path: a `memory.jsonl` file.

  Returns:
    `LogReading`.

  Raises:
    OSError: the file cannot be opened or read (e.g. FileNotFoundError).
  """
  path = os.fspath(path)
  records = []
  lines = unreadable = 0
  first_line = first_problem = None
  with open(path, 'rb') as f:
    for number, raw in enumerate(f, start=1):
      text = raw.decode('utf-8', errors='replace').strip()
      if not text:
        continue
      lines += 1
      try:
        record = json.loads(text)
        problem = record_problem(record)
      except (ValueError, RecursionError):
        problem = 'not a JSON object'
      if problem is None:
        records.append(record)
        continue
      unreadable += 1
      if first_line is None:
        first_line, first_problem = number, problem
  return LogReading(path, records, lines, unreadable, first_line, first_problem)


def read_memory_log(path: str | os.PathLike) -> list[Record]:
  """The valid records of a `memory.jsonl` file (`read`), in file order.

  The unreadable lines (`LogReading.unreadable_note`) are logged at info
  level, not raised: a run's log may end in a record cut short.

  Args:
    path: a `memory.jsonl` file.

  Returns:
    list of dict.

  Raises:
    OSError: the file cannot be opened or read (e.g. FileNotFoundError).
  """
  log = read(path)
  note = log.unreadable_note()
  if note:
    logging.info('%s', note)
  return log.records
