"""`trax-revplus plot-memory`: a run's memory log as a PNG.

Before anything is drawn: RUN_DIR exists and holds a memory log, and the
PNG's path can be written (`output_files.check`). The log is read
defensively (`memory.reading`): unreadable lines are named in a warning
line and left out; a log with lines but no valid record is corrupt (exit
status 1), one without any line holds no records yet (2). The PNG is
written safely, at exactly the path printed.
"""

import argparse
import os
import sys

from trax_revplus import output_files
from trax_revplus.cli.messages import warning_line
from trax_revplus.errors import EXIT_OK
from trax_revplus.errors import EXIT_RUNTIME
from trax_revplus.errors import one_line
from trax_revplus.errors import UserError

COMMAND = 'plot-memory'
_LOG_FILENAME = 'memory.jsonl'  # as `memory.MEMORY_LOG_FILENAME`
_PNG_FILENAME = 'memory.png'  # as `memory.plot.DEFAULT_PNG_FILENAME`


def _log_path(run_dir: str) -> str:
  """The memory log RUN_DIR names.

  Raises:
    UserError (exit status 2): RUN_DIR is missing or holds no memory log.
  """
  if not os.path.exists(run_dir):
    raise UserError(f'run directory not found: {run_dir}')
  path = (os.path.join(run_dir, _LOG_FILENAME) if os.path.isdir(run_dir)
          else run_dir)
  if not os.path.isfile(path):
    raise UserError(
        f'No memory log at {path}: give a training output dir that holds '
        f'{_LOG_FILENAME} (written by the trax_revplus trainer) or the '
        f'path of the file itself')
  return path


def run(flags: argparse.Namespace) -> int:
  """Runs `trax-revplus plot-memory` with the parsed flags.

  Prints the path of the PNG written, after a warning line if some lines of
  the log are not records.

  Returns:
    The exit status: 0 done.

  Raises:
    UserError: exit status 2 when RUN_DIR does not exist, holds no memory
      log, the log holds no records, or --output can never be a file; 1
      when the log is corrupt or unreadable, or the PNG cannot be written.
  """
  path = _log_path(flags.run_dir)
  output = flags.output or os.path.join(
      os.path.dirname(os.path.abspath(path)), _PNG_FILENAME)
  output_files.check(output, '--output')
  # pylint: disable=g-import-not-at-top
  from trax_revplus.memory import plot
  from trax_revplus.memory import reading
  # pylint: enable=g-import-not-at-top
  try:
    log = reading.read(path)
  except OSError as e:
    raise UserError(f'cannot read {path}: {e.strerror or one_line(e)}',
                    EXIT_RUNTIME) from None
  log.check_not_corrupt()
  note = log.unreadable_note()
  if note:
    print(warning_line(COMMAND, note), file=sys.stderr, flush=True)
  try:
    png = plot.plot_reading(log, output)
  except ValueError as e:  # A log without records.
    raise UserError(one_line(e)) from None
  print(png, flush=True)
  return EXIT_OK
