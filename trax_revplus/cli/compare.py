"""`trax-revplus compare`: the command's front end.

The comparison itself is `trax_revplus.compare`.
"""

import argparse
import os

from trax_revplus.cli import output_dir as output_dirs
from trax_revplus.cli.train import configs_from_flags


def run(flags: argparse.Namespace) -> int:
  """Runs `trax-revplus compare` with the parsed flags.

  Returns:
    The exit status: 0 the trax_revplus run succeeded, 1 it failed.

  Raises:
    UserError: bad configs, an unusable output dir, or output dirs that
      already hold runs.
  """
  config_files, bindings = configs_from_flags(flags)
  if flags.output_dir:
    output_dirs.check_writable(os.path.expanduser(flags.output_dir))
  # Imported here, not at the top: only this command needs it.
  from trax_revplus import compare  # pylint: disable=g-import-not-at-top
  return compare.compare_main(config_files=config_files, bindings=bindings,
                              output_dir=flags.output_dir, steps=flags.steps,
                              seed=flags.seed)
