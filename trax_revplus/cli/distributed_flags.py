"""`train`'s multi-process flags as a `DistributedConfig`, and the join.

The flags (`--num_processes`, `--process_id`, `--coordinator_address`,
`--join_timeout_seconds`, `--heartbeat_timeout_seconds`) become plain
values here; `trax_revplus.multiprocess` takes those, never the flags.
"""

import argparse

from trax_revplus.cli.messages import PROG
from trax_revplus.multiprocess import join
from trax_revplus.multiprocess.config import DistributedConfig
from trax_revplus.multiprocess.config import resolve_config


def config_from_flags(flags: argparse.Namespace) -> DistributedConfig:
  """The `DistributedConfig` of `train`'s flags and the environment.

  Raises:
    DistributedUsageError: values that cannot work together.
  """
  heartbeat = flags.heartbeat_timeout_seconds
  return resolve_config(
    flags.num_processes,
    flags.process_id,
    flags.coordinator_address,
    timeout_seconds=flags.join_timeout_seconds,
    heartbeat_timeout_seconds=heartbeat,
    # A process that finished waits this long for the others at exit.
    shutdown_timeout_seconds=max(heartbeat, flags.join_timeout_seconds),
  )


def join_from_flags(
  flags: argparse.Namespace, command: str
) -> DistributedConfig:
  """Joins the multi-process run the flags or environment ask for.

  Does nothing for one process. Must run before anything touches JAX.

  Args:
    flags: `train`'s parsed flags.
    command: str, the command whose error lines the join prints.

  Returns:
    The run's `DistributedConfig`.

  Raises:
    DistributedError (a `UserError`): values that cannot work (exit 2), or
      the join failed (1).
  """
  config = config_from_flags(flags)
  join.initialize(config, error_prefix=f'{PROG} {command}: error: ')
  return config
