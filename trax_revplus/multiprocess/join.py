"""Joins JAX's multi-process runtime (`jax.distributed`) before training.

Each process of a multi-process run (one per host, or several on one host)
joins through a coordinator that process 0 serves; then `jax.devices()`
lists every process's devices and collectives span them all. This module
does that join, and turns each way it can fail into one line and an exit
status instead of a hang or a C++ stack trace (`join_guard`): `initialize`
checks what it can before JAX does, bounds the wait, and checks that the
processes agree and can run a collective (`DistributedRuntimeError`, exit
1; `DistributedUsageError`, exit 2). The values it joins with are a
`config.DistributedConfig`.
"""

import errno
import os
import signal
import socket

from absl import logging
import numpy as np

from trax_revplus import trax_import
from trax_revplus.errors import one_line
from trax_revplus.multiprocess import join_guard
from trax_revplus.multiprocess.config import DistributedConfig
from trax_revplus.multiprocess.config import FLAGS_HINT
from trax_revplus.multiprocess.config import parse_address
from trax_revplus.multiprocess.errors import DistributedRuntimeError
from trax_revplus.multiprocess.errors import DistributedUsageError
from trax_revplus.multiprocess.errors import JoinInterruptedError
from trax_revplus.multiprocess.errors import JoinTimeoutError

# JAX's own join deadline is set this much later than ours, so that ours
# (one line) fires first and JAX's (an abort with a stack trace) never does.
_JAX_DEADLINE_MARGIN_SECONDS = 30


def _check_resolves(host):
  try:
    socket.getaddrinfo(host, None)
  except (socket.gaierror, UnicodeError) as e:
    raise DistributedRuntimeError(
      f'coordinator host {host!r} does not resolve ({e}); give the name '
      f'or IP address of the host that runs process 0.'
    ) from None


def _check_port_free(config):
  """On process 0: the coordinator's port is free where JAX will bind it."""
  bind = os.environ.get('JAX_COORDINATOR_BIND_ADDRESS')
  if bind:
    host, port = parse_address(bind)
  else:  # JAX binds '[::]:PORT', every address of the host.
    host, port = '::', parse_address(config.coordinator_address)[1]
  family = socket.AF_INET6 if ':' in host else socket.AF_INET
  probe = None
  try:
    try:
      probe = socket.socket(family, socket.SOCK_STREAM)
    except OSError:  # No IPv6 on this host: JAX falls back to IPv4.
      host, family = '0.0.0.0', socket.AF_INET
      probe = socket.socket(family, socket.SOCK_STREAM)
    # As gRPC does: a port held only by connections in TIME_WAIT is free.
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    probe.bind((host, port))
  except OSError as e:
    if e.errno == errno.EADDRINUSE:
      raise DistributedRuntimeError(
        f'port {port} of the coordinator address is already in use on '
        f'this host (process 0 serves the coordinator there); choose '
        f'another port for --coordinator_address.'
      ) from None
    raise DistributedRuntimeError(
      f'cannot serve the coordinator on port {port} of this host '
      f'({e.strerror or e}); choose another --coordinator_address port.'
    ) from None
  finally:
    if probe is not None:
      probe.close()


def initialize(
  config: DistributedConfig, error_prefix: str = 'error: '
) -> None:
  """Joins JAX's multi-process runtime; does nothing for one process.

  Must run before anything initialises a JAX backend (any computation, and
  `jax.devices()`). Uses gloo for collectives on the CPU backend
  (`jax_cpu_collectives_implementation`) and turns JAX's preemption service
  off (it would swallow SIGTERM). When it returns, the backend is
  initialised, `jax.process_count()` equals `config.num_processes`, and a
  collective over every device of every process has completed, so that a
  process that dies later fails its peers' next collective at once.

  Failures before JAX connects raise. Once waiting for the other processes
  nothing can be raised (the wait is inside JAX, and a normal exit would
  wait in JAX's shutdown barrier), so each of these prints
  `error_prefix` + one line on stderr and ends the process:

    * not every process joined within `timeout_seconds` (`JoinTimeoutError`,
      exit 1);
    * SIGINT or SIGTERM arrived, whatever their handlers were, ignored
      included (`JoinInterruptedError`, exit 128 + signal);
    * the coordinator rejected this process, e.g. a second process with its
      id (JAX aborts it: SIGABRT; its stack trace is condensed to the line);
    * after connecting, process 0 started the run for another number of
      processes (`DistributedUsageError`, exit 2), or the first collective
      failed or did not finish within min(`timeout_seconds`,
      `heartbeat_timeout_seconds` / 2) (`DistributedRuntimeError`, exit 1).

  Args:
    config: `DistributedConfig` (see `config.resolve_config`).
    error_prefix: str printed before such a line, e.g.
      'trax-revplus train: error: '.

  Raises:
    DistributedRuntimeError: the coordinator host does not resolve, its port
      is taken (process 0), this process already joined, or a JAX backend
      was initialised before the call.
    DistributedUsageError: JAX rejects the values (e.g. a Kubernetes job
      without the `kubernetes` package to find the coordinator).
  """
  if not config.is_multi_process:
    return
  jax = trax_import.jax

  if jax.distributed.is_initialized():
    raise DistributedRuntimeError(
      'this process has already joined a multi-process run; initialize '
      'once per process.'
    )
  if config.coordinator_address is not None:
    host, _ = parse_address(config.coordinator_address)
    _check_resolves(host)
    if config.process_id == 0:
      _check_port_free(config)
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  # JAX's preemption service catches SIGTERM in C++ and only records it,
  # for `multihost_utils.reached_preemption_sync_point`; a process not
  # polling that would ignore SIGTERM. Keep SIGTERM's usual meaning.
  jax.config.update('jax_enable_preemption_service', False)
  me = config.describe()
  watchdog = join_guard.JoinWatchdog(
    config.timeout_seconds,
    JoinTimeoutError(
      f'{me}: not every process joined within '
      f'{config.timeout_seconds:g} s; check that all of them are '
      f'running, that process 0 runs on the coordinator host, and '
      f'{FLAGS_HINT}.'
    ),
    lambda signum: JoinInterruptedError(
      f'interrupted by {signal.Signals(signum).name} while joining the '
      f'other processes.',
      signum,
    ),
    error_prefix,
  )
  logging.info('Joining the multi-process run as %s.', me)
  with (
    watchdog,
    join_guard.CondensedStderr(
      error_prefix,
      f'{me}: JAX ended this process while joining',
      FLAGS_HINT + '.',
    ),
  ):
    try:
      jax.distributed.initialize(
        coordinator_address=config.coordinator_address,
        num_processes=config.num_processes,
        process_id=config.process_id,
        local_device_ids=config.local_device_ids,
        initialization_timeout=int(
          config.timeout_seconds + _JAX_DEADLINE_MARGIN_SECONDS
        ),
        heartbeat_timeout_seconds=int(config.heartbeat_timeout_seconds),
        shutdown_timeout_seconds=int(config.shutdown_timeout_seconds),
      )
    except RuntimeError as e:
      if 'before' in str(e):  # JAX: called after a backend was initialised.
        raise DistributedRuntimeError(
          'a JAX backend was initialised before joining the multi-process '
          'run; join first, before any JAX computation or jax.devices().'
        ) from None
      raise DistributedRuntimeError(one_line(e, all_lines=True)) from None
    except (ValueError, TypeError) as e:
      hint = ''
      if config.cluster == 'k8s':
        hint = (
          '; in a Kubernetes job JAX needs the `kubernetes` package to '
          'find the coordinator, or pass --coordinator_address and '
          '--num_processes'
        )
      raise DistributedUsageError(
        f'JAX cannot join the multi-process run: '
        f'{one_line(e, all_lines=True)}{hint}.'
      ) from None
    # Every process has connected. What follows takes seconds; a process
    # that leaves now would have JAX abort the others (with a stack trace)
    # heartbeat_timeout_seconds later, so give up, in one line, before.
    watchdog.restart(
      min(config.timeout_seconds, config.heartbeat_timeout_seconds / 2),
      DistributedRuntimeError(
        f'{me}: all processes connected, but not all of them completed '
        f'the start-up (a first collective over all devices) in time; '
        f"see the other processes' output for their error."
      ),
    )
    try:
      error = _check_joined(config)
    except Exception as e:  # pylint: disable=broad-except
      # E.g. gloo's connection to a process that left timing out (30 s).
      error = DistributedRuntimeError(
        f'{me}: the first collective over all devices failed '
        f'({type(e).__name__}: {one_line(e, all_lines=True)})'
      )
    if error is not None:
      watchdog.fail(error)
  logging.info(
    'Joined: process %d of %d, %d local and %d global devices.',
    jax.process_index(),
    jax.process_count(),
    jax.local_device_count(),
    jax.device_count(),
  )


def _check_joined(config):
  """The error that makes the joined run unusable, or None."""
  jax = trax_import.jax
  count = jax.process_count()
  if config.num_processes is not None and count != config.num_processes:
    return DistributedUsageError(
      f'{config.describe()}: process 0 started the run for {count} '
      f'processes; {FLAGS_HINT}.'
    )
  # A collective over every device of every process: proves they all take
  # part, and connects them now (gloo connects a set of devices at its
  # first collective), so that a process that dies later fails its peers'
  # next collective at once instead of leaving them waiting for it until
  # the heartbeat timeout aborts them.
  total = _count_devices_collectively()
  if total != jax.device_count():
    return DistributedRuntimeError(
      f'{config.describe()}: a collective over all {jax.device_count()} '
      f'devices counted {total:g}.'
    )
  return None


def _count_devices_collectively():
  """psum of one per device over a mesh of `jax.devices()` (a float)."""
  jax = trax_import.jax
  sharding = jax.sharding
  mesh = sharding.Mesh(np.array(jax.devices()), ('devices',))
  ones = jax.make_array_from_process_local_data(
    sharding.NamedSharding(mesh, sharding.PartitionSpec('devices')),
    np.ones((jax.local_device_count(),), np.float32),
    (jax.device_count(),),
  )
  total = jax.jit(
    jax.shard_map(
      lambda x: jax.lax.psum(x, 'devices'),
      mesh=mesh,
      in_specs=sharding.PartitionSpec('devices'),
      out_specs=sharding.PartitionSpec(),
    )
  )(ones)
  return float(np.asarray(total.addressable_shards[0].data)[0])


def shutdown() -> None:
  """Leaves the run normally, waiting for the other processes to finish.

  JAX registers this with `atexit` too; calling it early releases the
  coordinator (process 0) before the interpreter winds down.
  """
  jax = trax_import.jax
  jax.distributed.shutdown()
