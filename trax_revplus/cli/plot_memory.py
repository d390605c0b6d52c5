"""`trax-revplus plot-memory`: a run's memory log as a PNG.

A thin command around `trax_revplus.memory.plot`, which finds the log
(`resolve_jsonl`), names the default PNG (`default_png`) and draws it
(`plot_reading`). Here: each of its errors becomes one line with an exit
status, the PNG's path is checked before anything is drawn
(`output_files.check`), and unreadable lines of the log (`memory.reading`)
are named in a warning line. A log with lines but no valid record is
corrupt (exit status 1), one without any line holds no records yet (2).
"""

import argparse
import sys

from trax_revplus import output_files
from trax_revplus.cli.messages import warning_line
from trax_revplus.errors import EXIT_OK
from trax_revplus.errors import EXIT_RUNTIME
from trax_revplus.errors import one_line
from trax_revplus.errors import UserError

COMMAND = 'plot-memory'


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
  # pylint: disable=g-import-not-at-top
  # matplotlib and JAX: imported once the flags are read, not for --help.
  from trax_revplus.memory import plot
  from trax_revplus.memory import reading

  # pylint: enable=g-import-not-at-top
  try:
    path = plot.resolve_jsonl(flags.run_dir)
  except FileNotFoundError as e:
    raise UserError(one_line(e)) from None
  output = flags.output or plot.default_png(path)
  output_files.check(output, '--output')
  try:
    log = reading.read(path)
  except OSError as e:
    raise UserError(
      f'cannot read {path}: {e.strerror or one_line(e)}', EXIT_RUNTIME
    ) from None
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
