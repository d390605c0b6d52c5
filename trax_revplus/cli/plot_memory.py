"""`trax-revplus plot-memory`: a run's memory log as a PNG."""

import argparse
import os

from trax_revplus.errors import EXIT_OK
from trax_revplus.errors import EXIT_RUNTIME
from trax_revplus.errors import one_line
from trax_revplus.errors import UserError


def run(flags: argparse.Namespace) -> int:
  """Runs `trax-revplus plot-memory` with the parsed flags.

  Prints the path of the PNG written.

  Returns:
    The exit status: 0 done.

  Raises:
    UserError: exit status 2 when RUN_DIR does not exist, holds no memory
      log, or the log holds no records; 1 when the PNG cannot be written.
  """
  run_dir = flags.run_dir
  if not os.path.exists(run_dir):
    raise UserError(f'run directory not found: {run_dir}')
  from trax_revplus.memory import plot  # pylint: disable=g-import-not-at-top
  try:
    png = plot.plot_memory(run_dir, flags.output)
  except ValueError as e:  # A log without records.
    raise UserError(one_line(e)) from None
  except OSError as e:
    # plot_memory's own "No memory log at ..." carries no errno; the
    # system's errors writing the PNG do.
    if e.errno is None:
      raise UserError(one_line(e)) from None
    raise UserError(f'cannot write {flags.output or "memory.png"}: '
                    f'{e.strerror or one_line(e)}', EXIT_RUNTIME) from None
  print(png)
  return EXIT_OK
