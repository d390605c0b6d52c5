"""trax_revplus.multiprocess.config: a process's place in the run, checked."""

import pytest

from trax_revplus.multiprocess import errors
from trax_revplus.multiprocess.config import parse_address
from trax_revplus.multiprocess.config import resolve_config


def test_no_flags_and_no_cluster_is_one_process():
  config = resolve_config(environ={})
  assert not config.is_multi_process
  assert (config.num_processes, config.process_id) == (1, 0)


def test_explicit_values_make_a_multi_process_config():
  config = resolve_config(2, 1, '10.0.0.1:1234', environ={})
  assert config.is_multi_process
  assert (
    config.num_processes,
    config.process_id,
    config.coordinator_address,
  ) == (2, 1, '10.0.0.1:1234')
  assert config.cluster is None


@pytest.mark.parametrize(
  'kwargs,message',
  [
    ({'num_processes': 2, 'coordinator_address': 'h:1'}, '--process_id'),
    ({'num_processes': 2, 'process_id': 0}, '--coordinator_address'),
    ({'process_id': 1, 'coordinator_address': 'h:1'}, '--num_processes'),
    ({'num_processes': 0}, '--num_processes=0 must be >= 1'),
    (
      {'num_processes': 2, 'process_id': 2, 'coordinator_address': 'h:1'},
      '--process_id=2 is outside 0..1',
    ),
    (
      {'num_processes': 2, 'process_id': -1, 'coordinator_address': 'h:1'},
      'outside',
    ),
    ({'num_processes': 1, 'process_id': 1}, '--process_id=1'),
    ({'num_processes': 'two'}, 'must be an integer'),
    (
      {
        'num_processes': 2,
        'process_id': 0,
        'coordinator_address': 'h:1',
        'timeout_seconds': 0,
      },
      'timeout_seconds',
    ),
  ],
)
def test_bad_values_are_usage_errors_naming_the_flag(kwargs, message):
  with pytest.raises(errors.DistributedUsageError) as info:
    resolve_config(environ={}, **kwargs)
  assert message in str(info.value)
  assert info.value.exit_code == 2
  assert '\n' not in str(info.value)


@pytest.mark.parametrize(
  'address',
  [
    'localhost',
    'localhost:',
    ':1234',
    'host:0',
    'host:65536',
    'a b:12',
    'http://host:12',
    'host:12:13',
  ],
)
def test_malformed_coordinator_addresses_are_usage_errors(address):
  with pytest.raises(errors.DistributedUsageError, match='HOST:PORT'):
    resolve_config(2, 0, address, environ={})


def test_address_forms_parse():
  assert parse_address('10.0.0.1:1234') == ('10.0.0.1', 1234)
  assert parse_address('node-7.cluster:80') == ('node-7.cluster', 80)
  assert parse_address('[::1]:65535') == ('::1', 65535)


def test_jax_coordinator_address_variable_gives_the_address():
  config = resolve_config(
    2, 0, environ={'JAX_COORDINATOR_ADDRESS': '10.1.1.1:99'}
  )
  assert config.coordinator_address == '10.1.1.1:99'
  config = resolve_config(
    2, 0, 'h:5', environ={'JAX_COORDINATOR_ADDRESS': '10.1.1.1:99'}
  )
  assert config.coordinator_address == 'h:5'  # The flag wins.


_SLURM = {
  'SLURM_JOB_ID': '77',
  'SLURM_STEP_NODELIST': 'node[001-004]',
  'SLURM_NTASKS': '4',
  'SLURM_PROCID': '3',
  'SLURM_LOCALID': '0',
}


def test_slurm_environment_gives_count_and_index_jax_the_address():
  config = resolve_config(environ=_SLURM)
  assert (
    config.num_processes,
    config.process_id,
    config.cluster,
    config.coordinator_address,
  ) == (4, 3, 'slurm', None)
  assert config.is_multi_process
  # A flag given still wins over the environment.
  assert resolve_config(process_id=1, environ=_SLURM).process_id == 1
  # One task: a single process, nothing to join.
  single = resolve_config(
    environ=dict(_SLURM, SLURM_NTASKS='1', SLURM_PROCID='0')
  )
  assert not single.is_multi_process
  # An allocation without a job step (no srun) is not a launcher.
  partial = {k: v for k, v in _SLURM.items() if k != 'SLURM_STEP_NODELIST'}
  assert not resolve_config(environ=partial).is_multi_process


def test_open_mpi_and_kubernetes_environments():
  ompi = {
    'OMPI_MCA_orte_hnp_uri': '1531576320.0;tcp://10.0.0.1:34911',
    'OMPI_COMM_WORLD_SIZE': '2',
    'OMPI_COMM_WORLD_RANK': '1',
  }
  config = resolve_config(environ=ompi)
  assert (config.num_processes, config.process_id, config.cluster) == (
    2,
    1,
    'ompi',
  )
  k8s = {'KUBERNETES_SERVICE_HOST': '10.96.0.1', 'JOB_COMPLETION_INDEX': '5'}
  config = resolve_config(environ=k8s)
  assert (config.num_processes, config.process_id, config.cluster) == (
    None,
    5,
    'k8s',
  )
  assert config.is_multi_process
  # Any pod has KUBERNETES_SERVICE_HOST; only an indexed Job is a launcher.
  pod = {'KUBERNETES_SERVICE_HOST': '10.96.0.1'}
  assert not resolve_config(environ=pod).is_multi_process
