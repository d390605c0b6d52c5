"""The config files and gin bindings a command was given, checked.

`train`, `compare`, `estimate` and `launch` take the same `--config_file`
and `--config` flags; each checks them here, with the same lines, before
anything reads the files (`gin_config` parses them).
"""

import argparse
import os

from trax_revplus.errors import UserError


def configs_from_flags(
  flags: argparse.Namespace,
) -> tuple[list[str], list[str]]:
  """The config files and bindings a command was given.

  Returns:
    `(config_files, bindings)`.

  Raises:
    UserError: when neither a config file nor a binding is given, or when a
      config file is missing or unreadable.
  """
  config_files = list(flags.config_file or [])
  bindings = list(flags.config or [])
  if not config_files and not bindings:
    raise UserError(
      'no config: give --config_file=FILE.gin (and/or --config=BINDING)'
    )
  for path in config_files:
    if not os.path.exists(path):
      raise UserError(f'config file not found: {path}')
    if not os.path.isfile(path):
      raise UserError(f'config file is not a regular file: {path}')
    if not os.access(path, os.R_OK):
      raise UserError(f'config file is not readable: {path}')
  return config_files, bindings
