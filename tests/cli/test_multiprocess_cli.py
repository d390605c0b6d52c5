"""`trax-revplus train` across processes and `trax-revplus launch`: flags,
subcommands and one-line errors, without starting a multi-process run.

Real processes on loopback: tests/multiprocess/ (launch and join
behaviour: test_launcher.py, test_join.py); equal weights of 2 processes
and one: tools/multiprocess_training_smoke.py; the main job end to end (a
two-process launch, its checkpoint resumed with one and with two
processes, a killed process): tools/multiprocess_smoke.py (`--tiny` for a
1-layer model).
"""

import os

import pytest

from trax_revplus import errors
from trax_revplus.cli import distributed_flags as join
from trax_revplus.cli import launch as launch_command
from trax_revplus.cli import parser
from trax_revplus.multiprocess import ending

_REPO = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
_CONFIG = os.path.join(_REPO, 'gin_configs', 'reformer_char_lm.gin')


def test_train_takes_the_multi_process_flags():
  flags = parser.parse(
    [
      'train',
      '--config_file=a.gin',
      '--num_processes=2',
      '--process_id=1',
      '--coordinator_address=h:1234',
      '--join_timeout_seconds=60',
      '--heartbeat_timeout_seconds=20',
    ]
  )
  config = join.config_from_flags(flags)
  assert (
    config.num_processes,
    config.process_id,
    config.coordinator_address,
  ) == (2, 1, 'h:1234')
  assert (config.timeout_seconds, config.heartbeat_timeout_seconds) == (60, 20)


def test_train_without_the_flags_is_one_process(monkeypatch):
  for name in (
    'JAX_COORDINATOR_ADDRESS',
    'SLURM_JOB_ID',
    'OMPI_MCA_orte_hnp_uri',
    'KUBERNETES_SERVICE_HOST',
  ):
    monkeypatch.delenv(name, raising=False)
  flags = parser.parse(['train', '--config_file=a.gin'])
  assert not join.config_from_flags(flags).is_multi_process


@pytest.mark.parametrize(
  'args, fragment',
  [
    (['launch', '--num_processes=2'], 'after --'),
    (['launch', '--num_processes=2', '--'], 'after --'),
    (['launch', '--', '--config_file=a.gin'], '--num_processes'),
    (
      ['launch', '--num_processes=0', '--', '--config_file=a.gin'],
      'positive integer',
    ),
  ],
)
def test_launch_usage_errors(args, fragment):
  with pytest.raises(errors.UserError) as error:
    parser.parse(args)
  assert fragment in str(error.value)
  assert error.value.exit_code == errors.EXIT_USAGE


def test_launch_passes_the_flags_after_the_separator():
  flags = parser.parse(
    [
      'launch',
      '--num_processes=3',
      '--',
      '--config_file=a.gin',
      '--config=x = 1',
    ]
  )
  assert flags.num_processes == 3
  assert flags.train_args == ['--config_file=a.gin', '--config=x = 1']
  assert launch_command.train_command(flags.train_args)[-3:] == [
    'train',
    '--config_file=a.gin',
    '--config=x = 1',
  ]


@pytest.mark.parametrize(
  'flag', ['--process_id=0', '--num_processes=2', '--coordinator_address=h:1']
)
def test_launch_refuses_the_flags_it_sets(flag):
  flags = parser.parse(
    ['launch', '--num_processes=2', '--', '--config_file=a.gin', flag]
  )
  with pytest.raises(errors.UserError) as error:
    launch_command.run(flags)
  assert 'set by launch' in str(error.value)


def test_failure_names_a_lost_process_and_gives_it_its_own_status():
  config = join.config_from_flags(
    parser.parse(
      [
        'train',
        '--config_file=a.gin',
        '--num_processes=2',
        '--process_id=0',
        '--coordinator_address=h:1',
      ]
    )
  )
  line, code = ending.failure(
    RuntimeError('UNKNOWN: Gloo all-reduce failed:\nConnection reset by peer'),
    config,
  )
  assert '\n' not in line
  assert line.startswith('process 0 of 2') and 'lost another process' in line
  assert code == errors.EXIT_LOST_PROCESS
  line, code = ending.failure(ValueError('bad'), config)
  assert 'ValueError: bad' in line and code == errors.EXIT_RUNTIME


@pytest.mark.parametrize(
  'flags, fragment',
  [
    (['--num_processes=2'], '--process_id'),
    (
      ['--num_processes=2', '--process_id=2', '--coordinator_address=h:1'],
      'outside 0..1',
    ),
    (
      ['--num_processes=2', '--process_id=0', '--coordinator_address=h'],
      'HOST:PORT',
    ),
  ],
)
def test_train_refuses_bad_process_flags_in_one_line(
  tmp_path, capsys, flags, fragment
):
  from trax_revplus import cli  # pylint: disable=g-import-not-at-top

  status = cli.main(
    [
      'trax-revplus',
      'train',
      f'--config_file={_CONFIG}',
      f'--output_dir={tmp_path / "run"}',
    ]
    + flags
  )
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


@pytest.fixture(name='launched')
def fixture_launched(monkeypatch):
  """Replaces the launch of processes: records what would be started."""
  from trax_revplus.multiprocess import launcher  # pylint: disable=g-import-not-at-top

  calls = []

  def launch(command, num_processes, **kwargs):
    calls.append((command, num_processes, kwargs))
    return 0

  monkeypatch.setattr(launcher, 'launch', launch)
  return calls


def _cli(capsys, *args):
  from trax_revplus import cli  # pylint: disable=g-import-not-at-top

  code = cli.main(['trax-revplus', *args])
  out, err = capsys.readouterr()
  return code, out, err


@pytest.mark.parametrize(
  'args,text',
  [
    (
      ['--num_processes=1000'],
      '--num_processes=1000 is more than the 8 '
      'processes a local launch starts on this host',
    ),
    (
      ['--num_processes=9', '--max_local_processes=8'],
      '--num_processes=9 is more than the 8 processes',
    ),
    (
      ['--num_processes=2', '--stop_grace_seconds=-1'],
      'argument --stop_grace_seconds: must be a positive number of seconds, '
      'got -1',
    ),
    (
      ['--num_processes=2', '--stop_grace_seconds=nan'],
      'argument --stop_grace_seconds: must be a positive number of seconds',
    ),
  ],
  ids=['too_many', 'above_the_flag', 'negative_grace', 'nan_grace'],
)
def test_launch_refuses_numbers_out_of_range_before_starting(
  args, text, tmp_path, capsys, launched, monkeypatch
):
  monkeypatch.setattr(os, 'cpu_count', lambda: 2)
  code, out, err = _cli(
    capsys,
    'launch',
    *args,
    '--',
    f'--config_file={_CONFIG}',
    f'--output_dir={tmp_path / "run"}',
  )
  assert code == errors.EXIT_USAGE
  assert err.startswith('trax-revplus launch: error: ')
  assert len(err.splitlines()) == 1 and text in err, err
  assert not out and not launched
  assert not (tmp_path / 'run').exists()


def test_launch_checks_the_train_flags_before_starting(
  tmp_path, capsys, launched
):
  code, _, err = _cli(
    capsys,
    'launch',
    '--num_processes=2',
    '--',
    f'--config_file={_CONFIG}',
    '--config_fil=x.gin',
  )
  assert code == errors.EXIT_USAGE
  assert err == (
    'trax-revplus launch: error: unknown flag --config_fil (in '
    '--config_fil=x.gin; see trax-revplus train --help)\n'
  )
  assert not launched


def test_launch_checks_the_config_files_before_starting(
  tmp_path, capsys, launched
):
  missing = tmp_path / 'nope.gin'
  code, _, err = _cli(
    capsys,
    'launch',
    '--num_processes=2',
    '--',
    f'--config_file={missing}',
    f'--output_dir={tmp_path / "run"}',
  )
  assert code == errors.EXIT_USAGE
  assert err == (
    f'trax-revplus launch: error: config file not found: {missing}\n'
  )
  assert not launched and not (tmp_path / 'run').exists()


def test_launch_gives_every_process_one_output_dir(
  tmp_path, capsys, launched, monkeypatch
):
  monkeypatch.setenv('HOME', str(tmp_path))
  code, _, err = _cli(
    capsys, 'launch', '--num_processes=2', '--', f'--config_file={_CONFIG}'
  )
  assert code == 0, err
  [(command, num_processes, kwargs)] = launched
  dirs = [a.split('=', 1)[1] for a in command if a.startswith('--output_dir=')]
  assert len(dirs) == 1 and num_processes == 2
  [made] = list((tmp_path / 'trax').iterdir())
  assert made.name.startswith('reformer_char_lm_')
  assert os.path.expanduser(dirs[0]) == str(made)
  assert kwargs['log_dir'] == str(made)
  assert kwargs['max_processes'] >= 4


# `trax-revplus launch` on a simulated one-chip host, its process a
# stand-in that opens JAX's backend: it can only where launch's own process
# holds none.
_LAUNCH_PARENT = """
import sys
from trax_revplus import cli
from trax_revplus.cli import launch
launch.train_command = lambda args: [
    sys.executable, '-c', 'import jax; jax.devices()']
sys.exit(cli.main(['trax-revplus', 'launch'] + sys.argv[1:]))
"""


def test_launch_s_own_process_holds_no_backend(tmp_path, one_chip_host):
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top

  proc = subprocess.run(
    [
      sys.executable,
      '-c',
      _LAUNCH_PARENT,
      '--num_processes=1',
      '--',
      f'--config_file={_CONFIG}',
      f'--output_dir={tmp_path / "run"}',
    ],
    env=one_chip_host,
    capture_output=True,
    text=True,
    check=False,
  )
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
