"""The one argument parser of `trax-revplus` and its subcommands.

Built on argparse with real subcommands (`train`, `compare`,
`plot-memory`, `estimate`, `launch`), whose flags and help are in
`command_flags` and which read them by `strict_argparse`'s rules: every
mistake on the command line raises `UserError` (exit status 2). Importing
this module imports no trax, so `--help` and flag errors answer at once.
"""

import argparse
import sys
from typing import Sequence

from trax_revplus.cli import command_flags
from trax_revplus.cli.messages import PROG
from trax_revplus.errors import EXIT_OK
from trax_revplus.errors import UserError
from trax_revplus.strict_argparse import Exit
from trax_revplus.strict_argparse import Parser

COMMANDS = ('train', 'compare', 'plot-memory', 'estimate', 'launch')

OVERVIEW = f"""\
usage: {PROG} <command> [flags]

Drop-in memory-efficient reversible training for Trax.

commands:
  train         Train a gin-configured trax model (python -m trax.trainer,
                on current JAX), with progress lines and a summary.
  compare       Train the same config with stock trax and with trax_revplus
                in fresh processes; print a table of time, memory and loss.
  plot-memory   Plot the memory log (memory.jsonl) of a run directory.
  estimate      Device memory one training step of a config needs, per
                trainer, from XLA's figures; runs no step.
  launch        Start N processes of one multi-process training run on this
                host (loopback), e.g. to try it before a cluster.

Run '{PROG} <command> --help' for the flags of a command.
"""


def build() -> argparse.ArgumentParser:
  """The parser of every command (`COMMANDS`), one subparser each."""
  parser = Parser(prog=PROG, usage=f'{PROG} <command> [flags]', add_help=False)
  commands = parser.add_subparsers(
    dest='command', metavar='<command>', required=True, parser_class=Parser
  )
  command_flags.add_train(commands)
  command_flags.add_compare(commands)
  command_flags.add_plot_memory(commands)
  command_flags.add_estimate(commands)
  command_flags.add_launch(commands)
  return parser


def parse(args: Sequence[str]) -> argparse.Namespace | int:
  """Parses the command line after the program name.

  Args:
    args: e.g. ['train', '--config_file=a.gin'].

  Returns:
    The parsed flags (an `argparse.Namespace` whose `command` is one of
    `COMMANDS`), or the exit status (int) when help was printed.

  Raises:
    UserError: no or an unknown command, an unknown flag, a bad or
      contradicting flag value, or a stray argument.
  """
  args = list(args)
  if args and args[0] in ('-h', '--help'):
    sys.stdout.write(OVERVIEW)
    return EXIT_OK
  if not args or args[0] not in COMMANDS:
    if not args or args[0].startswith('-'):
      raise UserError(
        f'give a command first: {", ".join(COMMANDS)} (see {PROG} --help)'
      )
    raise UserError(
      f'unknown command {args[0]!r} (choose from '
      f'{", ".join(COMMANDS)}; see {PROG} --help)'
    )
  command_args = None
  if args[0] == 'launch' and '--' in args:
    split = args.index('--')
    args, command_args = args[:split], args[split + 1 :]
  try:
    namespace, extra = build().parse_known_args(args)
  except Exit as e:
    return e.status
  if args[0] == 'launch':
    if not command_args:
      raise UserError(
        'give the train flags after --, e.g. trax-revplus '
        'launch --num_processes=2 -- --config_file=FILE.gin'
      )
    namespace.train_args = command_args
  if extra:
    flags = [a for a in extra if a.startswith('-')]
    if flags:
      raise UserError(
        f'unknown flag {flags[0].split("=")[0]} (in '
        f'{" ".join(flags)}; see {PROG} {args[0]} --help)'
      )
    raise UserError(
      f'unexpected arguments: {" ".join(extra)} (use '
      f'--config_file=FILE and --config=BINDING)'
    )
  vars(namespace).pop('_given_once', None)
  return namespace
