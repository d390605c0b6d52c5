"""`trax-revplus launch`: N local processes of one training run.

Each process runs `trax-revplus train` with the flags given after `--`, plus
`--num_processes=N --process_id=I --coordinator_address=127.0.0.1:PORT`
(`trax_revplus.multiprocess.launcher`, which forwards their output and
signals and stops the others when one fails).
"""

import argparse
import sys

from trax_revplus.errors import EXIT_RUNTIME
from trax_revplus.errors import UserError
from trax_revplus.multiprocess import launcher

_SET_BY_LAUNCH = ('--num_processes', '--process_id', '--coordinator_address')


def train_command(train_args: list[str]) -> list[str]:
  """The command each process runs, before the launcher's own flags."""
  return [sys.executable, '-m', 'trax_revplus.cli', 'train', *train_args]


def run(flags: argparse.Namespace) -> int:
  """Runs the processes and waits for them.

  Returns:
    0 when every process succeeded.

  Raises:
    UserError: a train flag the launcher sets itself, a process that failed
      (its exit status; a `LaunchError`), or the launch itself failing.
  """
  for arg in flags.train_args:
    if arg.split('=', 1)[0] in _SET_BY_LAUNCH:
      raise UserError(f'{arg.split("=", 1)[0]} is set by launch for each '
                      f'process; remove it from the train flags.')
  try:
    return launcher.launch(train_command(flags.train_args),
                           flags.num_processes,
                           stop_grace_seconds=flags.stop_grace_seconds)
  except OSError as e:
    raise UserError(f'cannot start the processes: {e.strerror or e}',
                    EXIT_RUNTIME) from None
