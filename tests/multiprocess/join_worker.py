"""One process of a multi-process test run; prints one JSON line on stdout.

Run by tests/multiprocess/test_join.py and test_launcher.py, N times with
`--num_processes=N --process_id=I --coordinator_address=HOST:PORT` (as
`trax_revplus.multiprocess.launcher` appends them):

  python tests/multiprocess/join_worker.py MODE [--timeout_seconds=S]
      [--heartbeat_timeout_seconds=S]
      --num_processes=N --process_id=I --coordinator_address=HOST:PORT

Modes (after `join.initialize`, unless said otherwise):
  psum          every device contributes (its global device index + 1);
                prints the sum over all devices of all processes (a
                collective across processes, on a mesh of `jax.devices()`);
                and the least over processes of byte counts above 2**31
                and below zero (`placement.least_over_processes`).
  exit-early    process 1 exits with status 3 right after joining; the
                others then run collectives until one fails.
  backend-first calls `jax.devices()` before joining.

A `DistributedError` is printed as 'error: <message>' on stderr and ends the
process with its exit status; a collective failing after the join likewise,
with status `EXIT_LOST_PROCESS`, through `ending.exit_immediately`.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(
  0,
  os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
)

# pylint: disable=g-import-not-at-top
from trax_revplus.errors import EXIT_LOST_PROCESS
from trax_revplus.multiprocess import config as config_lib
from trax_revplus.multiprocess import ending
from trax_revplus.multiprocess import errors
from trax_revplus.multiprocess import join
# pylint: enable=g-import-not-at-top


def _report(error):
  print(f'error: {error}', file=sys.stderr, flush=True)


def _psum_over_all_devices():
  import jax  # pylint: disable=g-import-not-at-top
  from jax.sharding import Mesh, NamedSharding, PartitionSpec  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  mesh = Mesh(np.array(jax.devices()), ('batch',))
  sharding = NamedSharding(mesh, PartitionSpec('batch'))
  first = jax.process_index() * jax.local_device_count()
  local = (
    np.arange(first, first + jax.local_device_count(), dtype=np.float32)[
      :, None
    ]
    + 1
  )
  x = jax.make_array_from_process_local_data(
    sharding, local, (jax.device_count(), 1)
  )
  total = jax.jit(
    jax.shard_map(
      lambda v: jax.lax.psum(v, 'batch'),
      mesh=mesh,
      in_specs=PartitionSpec('batch'),
      out_specs=PartitionSpec(),
    )
  )(x)
  return float(np.asarray(total.addressable_shards[0].data)[0, 0])


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('mode')
  parser.add_argument('--num_processes', type=int)
  parser.add_argument('--process_id', type=int)
  parser.add_argument('--coordinator_address')
  parser.add_argument('--timeout_seconds', type=float, default=120)
  parser.add_argument('--heartbeat_timeout_seconds', type=int, default=100)
  args = parser.parse_args()

  try:
    config = config_lib.resolve_config(
      args.num_processes,
      args.process_id,
      args.coordinator_address,
      timeout_seconds=args.timeout_seconds,
      heartbeat_timeout_seconds=args.heartbeat_timeout_seconds,
      shutdown_timeout_seconds=args.heartbeat_timeout_seconds,
    )
    if args.mode == 'backend-first':
      import jax  # pylint: disable=g-import-not-at-top

      jax.devices()
    join.initialize(config, error_prefix='error: ')
  except errors.DistributedError as e:
    _report(e)
    return e.exit_code

  import jax  # pylint: disable=g-import-not-at-top

  out = {
    'process_index': jax.process_index(),
    'process_count': jax.process_count(),
    'device_count': jax.device_count(),
    'local_device_count': jax.local_device_count(),
  }
  try:
    if args.mode == 'psum':
      out['psum'] = _psum_over_all_devices()
      from trax_revplus import placement  # pylint: disable=g-import-not-at-top

      index = jax.process_index()
      out['least_large'] = placement.least_over_processes(
        (5 << 32) + 7 - 3 * index
      )
      out['least_signed'] = placement.least_over_processes(
        -(3 << 31) if index == 1 else 11
      )
    elif args.mode == 'exit-early':
      if jax.process_index() == 1:
        print('process 1 exits now', flush=True)
        ending.exit_immediately(3)
      started = time.monotonic()
      for _ in range(100000):
        _psum_over_all_devices()
      out['psum_loop_seconds'] = time.monotonic() - started
  except Exception as e:  # pylint: disable=broad-except
    # A collective failed: the line, then out without the shutdown barrier,
    # with the status of a process that lost another one.
    first = ' '.join(str(e).split())[:300]
    print(
      f'error: a collective failed: {type(e).__name__}: {first}',
      file=sys.stderr,
      flush=True,
    )
    ending.exit_immediately(EXIT_LOST_PROCESS)
  print(json.dumps(out), flush=True)
  return 0


if __name__ == '__main__':
  sys.exit(main())
