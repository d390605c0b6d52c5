"""Joins JAX's multi-process runtime (`jax.distributed`) before training.

Each process of a multi-process run (one per host, or several on one host)
joins through a coordinator that process 0 serves; then `jax.devices()`
lists every process's devices and collectives span them all. This module
does that join, and turns each way it can fail into one line and an exit
status instead of a hang or a C++ stack trace (`join_guard`):
`resolve_config` checks the values (`DistributedUsageError`, exit 2);
`initialize` checks what it can before JAX does, bounds the wait, and
checks that the processes agree and can run a collective
(`DistributedRuntimeError`, exit 1); `exit_immediately` ends a joined
process after a failure without JAX's shutdown barrier.

Where each of the three values comes from (first found wins):

  1. the argument (the command line's `--num_processes`, `--process_id`,
     `--coordinator_address`);
  2. `JAX_COORDINATOR_ADDRESS` (the address only; `JAX_LOCAL_DEVICE_IDS`,
     `JAX_COORDINATOR_PORT`, `JAX_COORDINATOR_BIND_ADDRESS` are read by JAX);
  3. a cluster launcher, detected as `jax/_src/clusters/` does: SLURM
     (`SLURM_NTASKS`, `SLURM_PROCID`), Open MPI (`OMPI_COMM_WORLD_SIZE`,
     `OMPI_COMM_WORLD_RANK`) or a Kubernetes indexed Job
     (`JOB_COMPLETION_INDEX`); what is still unset (the coordinator; the
     Kubernetes count) `jax.distributed.initialize` fills in.

With none of these the run is a single process and nothing is joined.
"""

import dataclasses
import errno
import os
import re
import signal
import socket
from typing import Mapping, Optional, Tuple

from absl import logging

from trax_revplus import join_guard

EXIT_RUNTIME = 1
EXIT_USAGE = 2

DEFAULT_TIMEOUT_SECONDS = 300
DEFAULT_HEARTBEAT_TIMEOUT_SECONDS = 100
DEFAULT_SHUTDOWN_TIMEOUT_SECONDS = 300

# JAX's own join deadline is set this much later than ours, so that ours
# (one line) fires first and JAX's (an abort with a stack trace) never does.
_JAX_DEADLINE_MARGIN_SECONDS = 30

_FLAGS_HINT = ('give every process the same --num_processes and '
               '--coordinator_address and its own --process_id in 0..N-1')


class DistributedError(Exception):
  """A multi-process setup that cannot work; `str()` is one line.

  Attributes:
    exit_code: int, the exit status a command should end with.
  """
  exit_code = EXIT_RUNTIME


class DistributedUsageError(DistributedError, ValueError):
  """A value is missing, malformed, out of range or disagrees (exit 2)."""
  exit_code = EXIT_USAGE


class DistributedRuntimeError(DistributedError, RuntimeError):
  """Joining failed: network, port, timeout, or JAX already started (exit 1)."""
  exit_code = EXIT_RUNTIME


class JoinTimeoutError(DistributedRuntimeError):
  """Not every process joined within `timeout_seconds`."""


class JoinInterruptedError(DistributedRuntimeError):
  """A signal (e.g. Ctrl-C) arrived while waiting for the other processes."""

  def __init__(self, message, signum):
    super().__init__(message)
    self.exit_code = 128 + signum


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
  """Where this process stands in a multi-process run.

  Attributes:
    num_processes: int >= 1, or None where a detected cluster launcher
      (Kubernetes) tells JAX the count.
    process_id: int in [0, num_processes), or None (filled in by JAX from
      the cluster launcher).
    coordinator_address: 'HOST:PORT' of process 0's coordinator, or None
      (JAX derives it from the cluster launcher; ignored for one process).
    local_device_ids: tuple of int, the devices of this host this process
      uses (GPU/TPU), or None for JAX's default (all of them, or one per
      process under SLURM and Open MPI on GPUs).
    cluster: str, the cluster launcher detected in the environment ('slurm',
      'ompi', 'k8s'), or None.
    timeout_seconds: float > 0, how long `initialize` waits for every
      process to join before giving up.
    heartbeat_timeout_seconds: int > 0, after how long without a heartbeat
      JAX declares a process dead (a stopped or frozen process; a process
      that exits is noticed by its peers' next collective).
    shutdown_timeout_seconds: int > 0, how long a process that finished
      waits at exit for the others to finish.
  """
  num_processes: Optional[int] = 1
  process_id: Optional[int] = 0
  coordinator_address: Optional[str] = None
  local_device_ids: Optional[Tuple[int, ...]] = None
  cluster: Optional[str] = None
  timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
  heartbeat_timeout_seconds: int = DEFAULT_HEARTBEAT_TIMEOUT_SECONDS
  shutdown_timeout_seconds: int = DEFAULT_SHUTDOWN_TIMEOUT_SECONDS

  @property
  def is_multi_process(self):
    """Whether `initialize` joins a runtime (more than one process)."""
    return self.num_processes != 1

  def describe(self):
    """One line for logs: 'process I of N (coordinator HOST:PORT)'."""
    n = '?' if self.num_processes is None else self.num_processes
    i = '?' if self.process_id is None else self.process_id
    where = self.coordinator_address or f'from {self.cluster or "JAX"}'
    return f'process {i} of {n} (coordinator {where})'


def parse_address(address):
  """Splits 'HOST:PORT' (IPv6 hosts in brackets, '[::1]:PORT').

  Args:
    address: str.

  Returns:
    (host, port): str without brackets, int in [1, 65535].

  Raises:
    DistributedUsageError: if `address` is not of that form.
  """
  match = re.fullmatch(r'(\[[0-9A-Fa-f:.]+\]|[^\s:\[\]/]+):(\d{1,5})',
                       address or '')
  port = int(match.group(2)) if match else 0
  if not match or not 1 <= port <= 65535:
    raise DistributedUsageError(
        f'--coordinator_address={address!r} is not HOST:PORT with a port in '
        f'1..65535 (e.g. 10.0.0.1:1234, or [::1]:1234 for IPv6); use the '
        f'address of the host that runs process 0.')
  return match.group(1).strip('[]'), port


def _int_value(name, value, source):
  if value is None or (isinstance(value, int) and not isinstance(value, bool)):
    return value
  try:
    return int(str(value).strip())
  except ValueError:
    raise DistributedUsageError(
        f'{name} must be an integer, got {value!r} from {source}.') from None


def _detect_cluster(environ):
  """(name, num_processes, process_id) of a cluster launcher, or None.

  Mirrors the `is_env_present` checks of JAX's `jax/_src/clusters/`
  (Kubernetes: only an indexed Job, not every pod).
  """
  if all(k in environ for k in ('SLURM_JOB_ID', 'SLURM_STEP_NODELIST',
                                'SLURM_NTASKS', 'SLURM_PROCID',
                                'SLURM_LOCALID')):
    return ('slurm', environ['SLURM_NTASKS'], environ['SLURM_PROCID'])
  if 'OMPI_MCA_orte_hnp_uri' in environ:
    return ('ompi', environ.get('OMPI_COMM_WORLD_SIZE'),
            environ.get('OMPI_COMM_WORLD_RANK'))
  if ('KUBERNETES_SERVICE_HOST' in environ and
      'JOB_COMPLETION_INDEX' in environ):
    return ('k8s', None, environ['JOB_COMPLETION_INDEX'])
  return None


def resolve_config(num_processes=None, process_id=None,
                   coordinator_address=None, local_device_ids=None,
                   timeout_seconds=DEFAULT_TIMEOUT_SECONDS,
                   heartbeat_timeout_seconds=DEFAULT_HEARTBEAT_TIMEOUT_SECONDS,
                   shutdown_timeout_seconds=DEFAULT_SHUTDOWN_TIMEOUT_SECONDS,
                   environ: Optional[Mapping[str, str]] = None):
  """Builds the `DistributedConfig` of this process; see the module doc.

  Args:
    num_processes: int or None (from the environment, else 1).
    process_id: int or None (from the environment).
    coordinator_address: 'HOST:PORT' or None (from the environment).
    local_device_ids: sequence of int, or None.
    timeout_seconds: number > 0, the join deadline.
    heartbeat_timeout_seconds: int > 0.
    shutdown_timeout_seconds: int > 0.
    environ: mapping of environment variables; `os.environ` if None.

  Returns:
    A validated `DistributedConfig`; `is_multi_process` is False when
    neither the arguments nor the environment ask for several processes.

  Raises:
    DistributedUsageError: a value is not an int, N < 1, I outside
      [0, N), the address is not HOST:PORT, a timeout is not > 0, or a
      multi-process run lacks a value nothing can fill in (e.g.
      --num_processes=2 without --process_id outside a cluster launcher).
  """
  environ = os.environ if environ is None else environ
  n = _int_value('--num_processes', num_processes, 'the command line')
  i = _int_value('--process_id', process_id, 'the command line')
  address = coordinator_address or environ.get('JAX_COORDINATOR_ADDRESS')
  cluster = _detect_cluster(environ)
  name = None
  if cluster is not None:
    name, env_n, env_i = cluster
    variables = f'the {name} environment'
    n = _int_value('num_processes', env_n, variables) if n is None else n
    i = _int_value('process_id', env_i, variables) if i is None else i
  for label, seconds in (('timeout_seconds', timeout_seconds),
                         ('heartbeat_timeout_seconds',
                          heartbeat_timeout_seconds),
                         ('shutdown_timeout_seconds',
                          shutdown_timeout_seconds)):
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or (
        not seconds > 0):
      raise DistributedUsageError(f'{label} must be a number > 0, got '
                                  f'{seconds!r}.')
  if n is not None and n < 1:
    raise DistributedUsageError(f'--num_processes={n} must be >= 1.')
  if n is None and name is None:
    if i is None and address is None:
      n = 1  # Nothing asks for several processes.
    else:
      raise DistributedUsageError(
          f'--process_id or a coordinator address is set but '
          f'--num_processes is not; {_FLAGS_HINT}.')
  if n == 1:
    if i not in (None, 0):
      raise DistributedUsageError(
          f'--process_id={i} but --num_processes=1; the one process is 0.')
    return DistributedConfig(1, 0, None, None, name, timeout_seconds,
                             heartbeat_timeout_seconds,
                             shutdown_timeout_seconds)
  if i is None:
    raise DistributedUsageError(
        f'--num_processes={n} needs --process_id (0..{n - 1}) for this '
        f'process; {_FLAGS_HINT}.')
  if i < 0 or (n is not None and i >= n):
    within = f'0..{n - 1} (--num_processes={n})' if n else '0..N-1'
    raise DistributedUsageError(
        f'--process_id={i} is outside {within}; {_FLAGS_HINT}.')
  if address is None and name is None:
    raise DistributedUsageError(
        f'--num_processes={n} needs --coordinator_address=HOST:PORT (the '
        f'host of process 0 and a free port there); {_FLAGS_HINT}.')
  if address is not None:
    parse_address(address)
  if local_device_ids is not None:
    local_device_ids = tuple(
        _int_value('local_device_ids', d, 'the command line')
        for d in local_device_ids)
  return DistributedConfig(n, i, address, local_device_ids, name,
                           timeout_seconds, heartbeat_timeout_seconds,
                           shutdown_timeout_seconds)


exit_immediately = join_guard.exit_immediately


def _check_resolves(host):
  try:
    socket.getaddrinfo(host, None)
  except (socket.gaierror, UnicodeError) as e:
    raise DistributedRuntimeError(
        f'coordinator host {host!r} does not resolve ({e}); give the name '
        f'or IP address of the host that runs process 0.') from None


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
          f'another port for --coordinator_address.') from None
    raise DistributedRuntimeError(
        f'cannot serve the coordinator on port {port} of this host '
        f'({e.strerror or e}); choose another --coordinator_address port.'
    ) from None
  finally:
    if probe is not None:
      probe.close()


def initialize(config: DistributedConfig, error_prefix: str = 'error: '):
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
    * SIGINT arrived, or SIGTERM where a Python handler is installed
      (`JoinInterruptedError`, exit 128 + signal; SIGTERM's default action
      simply ends the process);
    * the coordinator rejected this process, e.g. a second process with its
      id (JAX aborts it: SIGABRT; its stack trace is condensed to the line);
    * after connecting, process 0 started the run for another number of
      processes (`DistributedUsageError`, exit 2), or the first collective
      failed or did not finish within min(`timeout_seconds`,
      `heartbeat_timeout_seconds` / 2) (`DistributedRuntimeError`, exit 1).

  Args:
    config: `DistributedConfig` (see `resolve_config`).
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
  import jax  # pylint: disable=g-import-not-at-top

  if jax.distributed.is_initialized():
    raise DistributedRuntimeError(
        'this process has already joined a multi-process run; initialize '
        'once per process.')
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
          f'{_FLAGS_HINT}.'),
      lambda signum: JoinInterruptedError(
          f'interrupted by {signal.Signals(signum).name} while joining the '
          f'other processes.', signum),
      error_prefix)
  logging.info('Joining the multi-process run as %s.', me)
  with watchdog, join_guard.CondensedStderr(
      error_prefix, f'{me}: JAX ended this process while joining',
      _FLAGS_HINT + '.'):
    try:
      jax.distributed.initialize(
          coordinator_address=config.coordinator_address,
          num_processes=config.num_processes,
          process_id=config.process_id,
          local_device_ids=config.local_device_ids,
          initialization_timeout=int(config.timeout_seconds +
                                     _JAX_DEADLINE_MARGIN_SECONDS),
          heartbeat_timeout_seconds=int(config.heartbeat_timeout_seconds),
          shutdown_timeout_seconds=int(config.shutdown_timeout_seconds))
    except RuntimeError as e:
      if 'before' in str(e):  # JAX: called after a backend was initialised.
        raise DistributedRuntimeError(
            'a JAX backend was initialised before joining the multi-process '
            'run; join first, before any JAX computation or jax.devices().'
        ) from None
      raise DistributedRuntimeError(_one_line(e)) from None
    except (ValueError, TypeError) as e:
      hint = ''
      if config.cluster == 'k8s':
        hint = ('; in a Kubernetes job JAX needs the `kubernetes` package to '
                'find the coordinator, or pass --coordinator_address and '
                '--num_processes')
      raise DistributedUsageError(
          f'JAX cannot join the multi-process run: {_one_line(e)}{hint}.'
      ) from None
    # Every process has connected. What follows takes seconds; a process
    # that leaves now would have JAX abort the others (with a stack trace)
    # heartbeat_timeout_seconds later, so give up, in one line, before.
    watchdog.restart(
        min(config.timeout_seconds, config.heartbeat_timeout_seconds / 2),
        DistributedRuntimeError(
            f'{me}: all processes connected, but not all of them completed '
            f'the start-up (a first collective over all devices) in time; '
            f'see the other processes\' output for their error.'))
    try:
      error = _check_joined(config)
    except Exception as e:  # pylint: disable=broad-except
      # E.g. gloo's connection to a process that left timing out (30 s).
      error = DistributedRuntimeError(
          f'{me}: the first collective over all devices failed '
          f'({type(e).__name__}: {_one_line(e)})')
    if error is not None:
      watchdog.fail(error)
  logging.info('Joined: process %d of %d, %d local and %d global devices.',
               jax.process_index(), jax.process_count(),
               jax.local_device_count(), jax.device_count())


def _check_joined(config):
  """The error that makes the joined run unusable, or None."""
  import jax  # pylint: disable=g-import-not-at-top
  count = jax.process_count()
  if config.num_processes is not None and count != config.num_processes:
    return DistributedUsageError(
        f'{config.describe()}: process 0 started the run for {count} '
        f'processes; {_FLAGS_HINT}.')
  # A collective over every device of every process: proves they all take
  # part, and connects them now (gloo connects a set of devices at its
  # first collective), so that a process that dies later fails its peers'
  # next collective at once instead of leaving them waiting for it until
  # the heartbeat timeout aborts them.
  total = _count_devices_collectively()
  if total != jax.device_count():
    return DistributedRuntimeError(
        f'{config.describe()}: a collective over all {jax.device_count()} '
        f'devices counted {total:g}.')
  return None


def _count_devices_collectively():
  """psum of one per device over a mesh of `jax.devices()` (a float)."""
  import jax  # pylint: disable=g-import-not-at-top
  from jax.sharding import Mesh, NamedSharding, PartitionSpec  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  mesh = Mesh(np.array(jax.devices()), ('devices',))
  ones = jax.make_array_from_process_local_data(
      NamedSharding(mesh, PartitionSpec('devices')),
      np.ones((jax.local_device_count(),), np.float32),
      (jax.device_count(),))
  total = jax.jit(jax.shard_map(
      lambda x: jax.lax.psum(x, 'devices'), mesh=mesh,
      in_specs=PartitionSpec('devices'), out_specs=PartitionSpec()))(ones)
  return float(np.asarray(total.addressable_shards[0].data)[0])


def shutdown():
  """Leaves the run normally, waiting for the other processes to finish.

  JAX registers this with `atexit` too; calling it early releases the
  coordinator (process 0) before the interpreter winds down.
  """
  import jax  # pylint: disable=g-import-not-at-top
  jax.distributed.shutdown()


def _one_line(exception):
  lines = [line.strip() for line in str(exception).splitlines()]
  return ' '.join(line for line in lines if line) or type(exception).__name__


__all__ = ('DistributedConfig', 'DistributedError', 'DistributedRuntimeError',
           'DistributedUsageError', 'JoinInterruptedError', 'JoinTimeoutError',
           'exit_immediately', 'initialize', 'parse_address',
           'resolve_config', 'shutdown')
