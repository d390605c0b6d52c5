"""The values that place a process in a multi-process run.

`resolve_config` gathers them from the arguments (the command line's
`--num_processes`, `--process_id`, `--coordinator_address`, which the CLI
passes as plain values) and the environment into a checked
`DistributedConfig`; each way they can be wrong is a
`DistributedUsageError` whose message is one line.

Where each of the three values comes from (first found wins):

  1. the argument;
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
import os
import re
from typing import Mapping, Sequence, Tuple

from trax_revplus.multiprocess.errors import DistributedUsageError

DEFAULT_TIMEOUT_SECONDS = 300
DEFAULT_HEARTBEAT_TIMEOUT_SECONDS = 100
DEFAULT_SHUTDOWN_TIMEOUT_SECONDS = 300

# What every process must be given; ends the errors of values that disagree.
FLAGS_HINT = (
  'give every process the same --num_processes and '
  '--coordinator_address and its own --process_id in 0..N-1'
)


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
    timeout_seconds: float > 0, how long `join.initialize` waits for every
      process to join before giving up.
    heartbeat_timeout_seconds: int > 0, after how long without a heartbeat
      JAX declares a process dead (a stopped or frozen process; a process
      that exits is noticed by its peers' next collective).
    shutdown_timeout_seconds: int > 0, how long a process that finished
      waits at exit for the others to finish.
  """

  num_processes: int | None = 1
  process_id: int | None = 0
  coordinator_address: str | None = None
  local_device_ids: Tuple[int, ...] | None = None
  cluster: str | None = None
  timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
  heartbeat_timeout_seconds: int = DEFAULT_HEARTBEAT_TIMEOUT_SECONDS
  shutdown_timeout_seconds: int = DEFAULT_SHUTDOWN_TIMEOUT_SECONDS

  @property
  def is_multi_process(self) -> bool:
    """Whether `join.initialize` joins a runtime (more than one process)."""
    return self.num_processes != 1

  def describe(self) -> str:
    """One line for logs: 'process I of N (coordinator HOST:PORT)'."""
    n = '?' if self.num_processes is None else self.num_processes
    i = '?' if self.process_id is None else self.process_id
    where = self.coordinator_address or f'from {self.cluster or "JAX"}'
    return f'process {i} of {n} (coordinator {where})'


def parse_address(address: str) -> tuple[str, int]:
  """Splits 'HOST:PORT' (IPv6 hosts in brackets, '[::1]:PORT').

  Args:
    address: str.

  Returns:
    (host, port): str without brackets, int in [1, 65535].

  Raises:
    DistributedUsageError: if `address` is not of that form.
  """
  # [0-9], not \d: \d also matches other scripts' digits ('١٢٣٤').
  match = re.fullmatch(
    r'(\[[0-9A-Fa-f:.]+\]|[^\s:\[\]/]+):([0-9]{1,5})', address or ''
  )
  port = int(match.group(2)) if match else 0
  if not match or not 1 <= port <= 65535:
    raise DistributedUsageError(
      f'--coordinator_address={address!r} is not HOST:PORT with a port in '
      f'1..65535 (e.g. 10.0.0.1:1234, or [::1]:1234 for IPv6); use the '
      f'address of the host that runs process 0.'
    )
  return match.group(1).strip('[]'), port


def _int_value(name, value, source):
  if value is None or (isinstance(value, int) and not isinstance(value, bool)):
    return value
  try:
    return int(str(value).strip())
  except ValueError:
    raise DistributedUsageError(
      f'{name} must be an integer, got {value!r} from {source}.'
    ) from None


def _detect_cluster(environ):
  """(name, num_processes, process_id) of a cluster launcher, or None.

  Mirrors the `is_env_present` checks of JAX's `jax/_src/clusters/`
  (Kubernetes: only an indexed Job, not every pod).
  """
  if all(
    k in environ
    for k in (
      'SLURM_JOB_ID',
      'SLURM_STEP_NODELIST',
      'SLURM_NTASKS',
      'SLURM_PROCID',
      'SLURM_LOCALID',
    )
  ):
    return ('slurm', environ['SLURM_NTASKS'], environ['SLURM_PROCID'])
  if 'OMPI_MCA_orte_hnp_uri' in environ:
    return (
      'ompi',
      environ.get('OMPI_COMM_WORLD_SIZE'),
      environ.get('OMPI_COMM_WORLD_RANK'),
    )
  if 'KUBERNETES_SERVICE_HOST' in environ and 'JOB_COMPLETION_INDEX' in environ:
    return ('k8s', None, environ['JOB_COMPLETION_INDEX'])
  return None


def resolve_config(
  num_processes: int | None = None,
  process_id: int | None = None,
  coordinator_address: str | None = None,
  local_device_ids: Sequence[int] | None = None,
  timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
  heartbeat_timeout_seconds: int = DEFAULT_HEARTBEAT_TIMEOUT_SECONDS,
  shutdown_timeout_seconds: int = DEFAULT_SHUTDOWN_TIMEOUT_SECONDS,
  environ: Mapping[str, str] | None = None,
) -> DistributedConfig:
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
  for label, seconds in (
    ('timeout_seconds', timeout_seconds),
    ('heartbeat_timeout_seconds', heartbeat_timeout_seconds),
    ('shutdown_timeout_seconds', shutdown_timeout_seconds),
  ):
    if (
      isinstance(seconds, bool)
      or not isinstance(seconds, (int, float))
      or (not seconds > 0)
    ):
      raise DistributedUsageError(
        f'{label} must be a number > 0, got {seconds!r}.'
      )
  if n is not None and n < 1:
    raise DistributedUsageError(f'--num_processes={n} must be >= 1.')
  if n is None and name is None:
    if i is None and address is None:
      n = 1  # Nothing asks for several processes.
    else:
      raise DistributedUsageError(
        f'--process_id or a coordinator address is set but '
        f'--num_processes is not; {FLAGS_HINT}.'
      )
  if n == 1:
    if i not in (None, 0):
      raise DistributedUsageError(
        f'--process_id={i} but --num_processes=1; the one process is 0.'
      )
    return DistributedConfig(
      1,
      0,
      None,
      None,
      name,
      timeout_seconds,
      heartbeat_timeout_seconds,
      shutdown_timeout_seconds,
    )
  if i is None:
    raise DistributedUsageError(
      f'--num_processes={n} needs --process_id (0..{n - 1}) for this '
      f'process; {FLAGS_HINT}.'
    )
  if i < 0 or (n is not None and i >= n):
    within = f'0..{n - 1} (--num_processes={n})' if n else '0..N-1'
    raise DistributedUsageError(
      f'--process_id={i} is outside {within}; {FLAGS_HINT}.'
    )
  if address is None and name is None:
    raise DistributedUsageError(
      f'--num_processes={n} needs --coordinator_address=HOST:PORT (the '
      f'host of process 0 and a free port there); {FLAGS_HINT}.'
    )
  if address is not None:
    parse_address(address)
  if local_device_ids is not None:
    local_device_ids = tuple(
      _int_value('local_device_ids', d, 'the command line')
      for d in local_device_ids
    )
  return DistributedConfig(
    n,
    i,
    address,
    local_device_ids,
    name,
    timeout_seconds,
    heartbeat_timeout_seconds,
    shutdown_timeout_seconds,
  )
