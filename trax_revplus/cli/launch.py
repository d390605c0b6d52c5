"""`trax-revplus launch`: N local processes of one training run.

Each process runs `trax-revplus train` with the flags given after `--`, plus
`--num_processes=N --process_id=I --coordinator_address=127.0.0.1:PORT`
(`trax_revplus.multiprocess.launcher`, which forwards their output and
signals and stops the others when one fails).

Before any process starts: the launch flags (at most `--max_local_processes`
processes, a positive grace), the train flags as `train` parses them, the
config files as `train` checks them and their syntax (the names in them
are looked up by each process), and
the output dir, which every process shares: the default one is named here
once (each process would name its own from its clock), checked and made.
Each process's full output goes to `OUTPUT_DIR/launch.process<I>.log`; once
one process fails, the terminal shows its lines and the launcher's line,
nothing more from the others.
"""

import argparse
import os
import sys

from trax_revplus.cli import gin_errors
from trax_revplus.cli import output_dir as output_dirs
from trax_revplus.cli import parser
from trax_revplus.cli.config_flags import configs_from_flags
from trax_revplus.errors import EXIT_RUNTIME
from trax_revplus.errors import UserError
from trax_revplus.multiprocess import launch_flags
from trax_revplus.multiprocess import launcher

_SET_BY_LAUNCH = ('--num_processes', '--process_id', '--coordinator_address')


def train_command(train_args: list[str]) -> list[str]:
  """The command each process runs, before the launcher's own flags."""
  return [sys.executable, '-m', 'trax_revplus.cli', 'train', *train_args]


def _train_flags(train_args: list[str]) -> argparse.Namespace:
  """The train flags, parsed (and checked) as `train` parses them.

  Raises:
    UserError: a flag the launcher sets itself, or one `train` rejects.
  """
  for arg in train_args:
    if arg.split('=', 1)[0] in _SET_BY_LAUNCH:
      raise UserError(
        f'{arg.split("=", 1)[0]} is set by launch for each '
        f'process; remove it from the train flags.'
      )
  flags = parser.parse(['train', *train_args])
  if isinstance(flags, int):  # --help among the train flags.
    raise UserError(
      'give the train flags after --, without --help (see '
      'trax-revplus train --help)'
    )
  return flags


def run(flags: argparse.Namespace) -> int:
  """Runs the processes and waits for them.

  Returns:
    0 when every process succeeded.

  Raises:
    UserError: a bad launch or train flag, an unusable output dir, a
      process that failed (its exit status; a `LaunchError`), or the launch
      itself failing.
  """
  max_processes = (
    flags.max_local_processes or launch_flags.default_max_processes()
  )
  launch_flags.check_launch(
    flags.num_processes, flags.stop_grace_seconds, max_processes
  )
  train_flags = _train_flags(flags.train_args)
  # The config files as train checks them, and their syntax, once here
  # rather than once per process after each has started.
  gin_errors.check_syntax(*configs_from_flags(train_flags))
  train_args = list(flags.train_args)
  output_dir = train_flags.output_dir
  if output_dir is None:
    output_dir = output_dirs.default_output_dir(train_flags.config_file)
    train_args.append(f'--output_dir={output_dir}')
  output_dir = os.path.expanduser(output_dir)
  output_dirs.check_writable(output_dir)
  output_dirs.make(output_dir)
  try:
    return launcher.launch(
      train_command(train_args),
      flags.num_processes,
      stop_grace_seconds=flags.stop_grace_seconds,
      log_dir=output_dir,
      max_processes=max_processes,
    )
  except OSError as e:
    raise UserError(
      f'cannot start the processes: {e.strerror or e}', EXIT_RUNTIME
    ) from None
