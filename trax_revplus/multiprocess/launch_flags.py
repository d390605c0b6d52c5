"""The flags of a local launch and the limits they are checked against.

`trax-revplus launch` and `python -m trax_revplus.multiprocess.launcher`
both read --num_processes, --stop_grace_seconds and --max_local_processes
through `add_launch_flags`, and `launcher.launch` checks its numbers with
`check_launch`. Kept apart from the launcher so that the CLI's parser can
add and check these flags without the machinery that starts processes.
"""

import argparse
import os

from trax_revplus.multiprocess.errors import LaunchUsageError
from trax_revplus.strict_argparse import Once
from trax_revplus.strict_argparse import positive_int
from trax_revplus.strict_argparse import positive_seconds

DEFAULT_STOP_GRACE_SECONDS = 10.0
# Processes of one local run per CPU core, at most, unless told otherwise:
# each imports JAX and holds its own copy of the model, so more only thrash.
PROCESSES_PER_CORE = 4


def default_max_processes() -> int:
  """The most processes a local launch starts unless told otherwise."""
  return PROCESSES_PER_CORE * (os.cpu_count() or 1)


def add_launch_flags(parser: argparse.ArgumentParser) -> None:
  """Adds the flags of a launch: --num_processes, --stop_grace_seconds and
  --max_local_processes (`trax-revplus launch` and `launcher.main`).

  `--max_local_processes` defaults to None: `default_max_processes()`.
  """
  parser.add_argument(
    '--num_processes',
    action=Once,
    type=positive_int,
    required=True,
    metavar='N',
    help='Processes to start.',
  )
  parser.add_argument(
    '--stop_grace_seconds',
    action=Once,
    type=positive_seconds,
    default=DEFAULT_STOP_GRACE_SECONDS,
    metavar='S',
    help='After one process failed, how long the others get to stop on '
    'SIGTERM before SIGKILL, > 0 (default: %(default)s).',
  )
  parser.add_argument(
    '--max_local_processes',
    action=Once,
    type=positive_int,
    metavar='N',
    help=f'The most processes launch starts on this host (default: '
    f'{PROCESSES_PER_CORE} per CPU core: each process imports JAX and '
    f'holds its own model, so more only thrash); raise it to start '
    f'more.',
  )


def check_launch(
  num_processes: int,
  stop_grace_seconds: float,
  max_processes: int | None = None,
) -> None:
  """Checks the numbers of a launch (see `launch`).

  Raises:
    LaunchUsageError: N < 1 or above `max_processes`, or
      `stop_grace_seconds` not a positive number.
  """
  if (
    isinstance(num_processes, bool)
    or not isinstance(num_processes, int)
    or num_processes < 1
  ):
    raise LaunchUsageError(
      f'--num_processes={num_processes!r} must be an integer >= 1.'
    )
  if max_processes is not None and num_processes > max_processes:
    raise LaunchUsageError(
      f'--num_processes={num_processes} is more than the '
      f'{max_processes} processes a local launch starts on this host '
      f'({PROCESSES_PER_CORE} per CPU core: each imports JAX and holds '
      f'its own model); give fewer, or --max_local_processes='
      f'{num_processes} to start them anyway.'
    )
  if (
    isinstance(stop_grace_seconds, bool)
    or not isinstance(stop_grace_seconds, (int, float))
    or not 0 < stop_grace_seconds < float('inf')
  ):
    raise LaunchUsageError(
      f'--stop_grace_seconds={stop_grace_seconds!r} must be a positive '
      f'number of seconds, e.g. 10.'
    )
