"""`trax-revplus train` across processes and `trax-revplus launch`: flags,
subcommands and one-line errors, without starting a multi-process run.

Real processes on loopback: tests/multiprocess/ (equal weights:
test_training_matches_one_process.py; launch and join behaviour:
test_launcher.py, test_join.py); the main job end to end (a two-process
launch, its checkpoint resumed with one and with two processes, a killed
process): tools/multiprocess_smoke.py (`--tiny` for a 1-layer model).
"""

import os

import pytest

from trax_revplus import errors
from trax_revplus.cli import join
from trax_revplus.cli import launch as launch_command
from trax_revplus.cli import parser
from trax_revplus.multiprocess import ending

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
_CONFIG = os.path.join(_REPO, 'gin_configs', 'reformer_char_lm.gin')


def test_train_takes_the_multi_process_flags():
  flags = parser.parse(['train', '--config_file=a.gin', '--num_processes=2',
                        '--process_id=1', '--coordinator_address=h:1234',
                        '--join_timeout_seconds=60',
                        '--heartbeat_timeout_seconds=20'])
  config = join.config_from_flags(flags)
  assert (config.num_processes, config.process_id,
          config.coordinator_address) == (2, 1, 'h:1234')
  assert (config.timeout_seconds, config.heartbeat_timeout_seconds) == (60,
                                                                        20)


def test_train_without_the_flags_is_one_process(monkeypatch):
  for name in ('JAX_COORDINATOR_ADDRESS', 'SLURM_JOB_ID',
               'OMPI_MCA_orte_hnp_uri', 'KUBERNETES_SERVICE_HOST'):
    monkeypatch.delenv(name, raising=False)
  flags = parser.parse(['train', '--config_file=a.gin'])
  assert not join.config_from_flags(flags).is_multi_process


@pytest.mark.parametrize('args, fragment', [
    (['launch', '--num_processes=2'], 'after --'),
    (['launch', '--num_processes=2', '--'], 'after --'),
    (['launch', '--', '--config_file=a.gin'], '--num_processes'),
    (['launch', '--num_processes=0', '--', '--config_file=a.gin'],
     'positive integer'),
])
def test_launch_usage_errors(args, fragment):
  with pytest.raises(errors.UserError) as error:
    parser.parse(args)
  assert fragment in str(error.value)
  assert error.value.exit_code == errors.EXIT_USAGE


def test_launch_passes_the_flags_after_the_separator():
  flags = parser.parse(['launch', '--num_processes=3', '--',
                        '--config_file=a.gin', '--config=x = 1'])
  assert flags.num_processes == 3
  assert flags.train_args == ['--config_file=a.gin', '--config=x = 1']
  assert launch_command.train_command(flags.train_args)[-3:] == [
      'train', '--config_file=a.gin', '--config=x = 1']


@pytest.mark.parametrize('flag', ['--process_id=0', '--num_processes=2',
                                  '--coordinator_address=h:1'])
def test_launch_refuses_the_flags_it_sets(flag):
  flags = parser.parse(['launch', '--num_processes=2', '--',
                        '--config_file=a.gin', flag])
  with pytest.raises(errors.UserError) as error:
    launch_command.run(flags)
  assert 'set by launch' in str(error.value)


def test_failure_names_a_lost_process_and_gives_it_its_own_status():
  config = join.config_from_flags(parser.parse(
      ['train', '--config_file=a.gin', '--num_processes=2', '--process_id=0',
       '--coordinator_address=h:1']))
  line, code = ending.failure(
      RuntimeError('UNKNOWN: Gloo all-reduce failed:\nConnection reset by '
                   'peer'), config)
  assert '\n' not in line
  assert line.startswith('process 0 of 2') and 'lost another process' in line
  assert code == errors.EXIT_LOST_PROCESS
  line, code = ending.failure(ValueError('bad'), config)
  assert 'ValueError: bad' in line and code == errors.EXIT_RUNTIME


@pytest.mark.parametrize('flags, fragment', [
    (['--num_processes=2'], '--process_id'),
    (['--num_processes=2', '--process_id=2', '--coordinator_address=h:1'],
     'outside 0..1'),
    (['--num_processes=2', '--process_id=0', '--coordinator_address=h'],
     'HOST:PORT'),
])
def test_train_refuses_bad_process_flags_in_one_line(tmp_path, capsys, flags,
                                                     fragment):
  from trax_revplus import cli  # pylint: disable=g-import-not-at-top
  status = cli.main(['trax-revplus', 'train', f'--config_file={_CONFIG}',
                     f'--output_dir={tmp_path / "run"}'] + flags)
  err = capsys.readouterr().err.strip()
  assert status == errors.EXIT_USAGE
  assert len(err.splitlines()) == 1 and fragment in err, err
  assert err.startswith('trax-revplus train: error: ')


def test_activate_binds_on_cpu_to_this_process_cpu_device():
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from trax import layers as tl  # pylint: disable=g-import-not-at-top
  import trax_revplus  # pylint: disable=g-import-not-at-top
  from trax_revplus import compat  # pylint: disable=g-import-not-at-top
  was_active = trax_revplus.is_active()
  trax_revplus.activate()
  try:
    assert tl.on_cpu is compat.on_cpu
    placed = tl.on_cpu({'x': np.ones(3)})['x']
    assert placed.devices() == {jax.local_devices(backend='cpu')[0]}
  finally:
    if not was_active:
      trax_revplus.deactivate()
  assert was_active or tl.on_cpu is not compat.on_cpu
