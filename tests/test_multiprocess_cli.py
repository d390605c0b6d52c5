"""`trax-revplus train` across processes and `trax-revplus launch`.

The flag and subcommand tests run no JAX. The end-to-end test launches a
two-process run of a tiny main job (gin_configs/reformer_char_lm.gin shrunk
as tests/cli_cases.py's TINY_MODEL) and resumes it with one process; its
processes have no fixed deadline (a busy machine is slow, not wrong):
`trax_revplus.launch` ends every process when one fails.
tools/multiprocess_smoke.py runs the full-size job, the resume with two
processes and a killed process.
"""

import os
import subprocess
import sys

import pytest

from trax_revplus import distributed_run
from trax_revplus.cli import errors
from trax_revplus.cli import launch as launch_command
from trax_revplus.cli import parser

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cli_cases import TINY_MODEL  # pylint: disable=g-import-not-at-top,wrong-import-position

_CONFIG = os.path.join(_REPO, 'gin_configs', 'reformer_char_lm.gin')


def test_train_takes_the_multi_process_flags():
  flags = parser.parse(['train', '--config_file=a.gin', '--num_processes=2',
                        '--process_id=1', '--coordinator_address=h:1234',
                        '--join_timeout_seconds=60',
                        '--heartbeat_timeout_seconds=20'])
  config = distributed_run.config_from_flags(flags)
  assert (config.num_processes, config.process_id,
          config.coordinator_address) == (2, 1, 'h:1234')
  assert (config.timeout_seconds, config.heartbeat_timeout_seconds) == (60,
                                                                        20)


def test_train_without_the_flags_is_one_process(monkeypatch):
  for name in ('JAX_COORDINATOR_ADDRESS', 'SLURM_JOB_ID',
               'OMPI_MCA_orte_hnp_uri', 'KUBERNETES_SERVICE_HOST'):
    monkeypatch.delenv(name, raising=False)
  flags = parser.parse(['train', '--config_file=a.gin'])
  assert not distributed_run.config_from_flags(flags).is_multi_process


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


def test_failure_line_names_a_lost_process():
  config = distributed_run.config_from_flags(parser.parse(
      ['train', '--config_file=a.gin', '--num_processes=2', '--process_id=0',
       '--coordinator_address=h:1']))
  line = distributed_run.failure_line(
      RuntimeError('UNKNOWN: Gloo all-reduce failed:\nConnection reset by '
                   'peer'), config)
  assert '\n' not in line
  assert line.startswith('process 0 of 2') and 'lost another process' in line
  assert 'ValueError: bad' in distributed_run.failure_line(
      ValueError('bad'), config)


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


def _env():
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONUNBUFFERED='1')
  env['XLA_FLAGS'] = ' '.join(
      f for f in env.get('XLA_FLAGS', '').split()
      if 'xla_force_host_platform_device_count' not in f)
  return env


def _train_flags(output_dir, steps):
  bindings = TINY_MODEL + ['sequence_length = 32', f'train.steps = {steps}',
                           'train.eval_frequency = 2']
  return ([f'--config_file={_CONFIG}', f'--output_dir={output_dir}',
           '--progress_every_n_steps=1'] +
          [f'--config={b}' for b in bindings])


def _run(args):
  return subprocess.run(
      [sys.executable, '-m', 'trax_revplus.cli'] + args, env=_env(),
      cwd=_REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
      text=True, check=False)


def test_launch_trains_one_checkpoint_set_that_one_process_resumes(
    tmp_path):
  from trax_revplus import checkpoints  # pylint: disable=g-import-not-at-top
  out = str(tmp_path / 'run')
  run = _run(['launch', '--num_processes=2', '--'] + _train_flags(out, 2))
  assert run.returncode == 0, run.stdout[-3000:]
  for i in (0, 1):
    assert f'[process {i}] == summary ==' in run.stdout
  assert 'Deprecat' not in run.stdout, run.stdout
  assert 'Traceback' not in run.stdout
  ok, manifest, reason = checkpoints.verify(out, 'model')
  assert ok, reason
  assert manifest['step'] == 2
  names = os.listdir(out)
  assert sorted(n for n in names if n.endswith('.manifest.json')) == [
      'model.manifest.json', 'model.prev.manifest.json']
  assert 'train.log' in names and 'train.process1.log' in names
  for name in ('train.log', 'train.process1.log'):
    # trax's Loop calls jax.host_count() and jit(..., device=...), which
    # JAX deprecates; activate() binds compat's versions instead.
    assert 'deprecat' not in open(os.path.join(out, name)).read().lower()
  assert all(line.startswith('process 1: ') for line in open(
      os.path.join(out, 'train.process1.log')).read().splitlines()
             if line.strip())

  resumed = _run(['train'] + _train_flags(out, 3))
  assert resumed.returncode == 0, resumed.stdout[-3000:]
  assert '3 (1 in this run)' in resumed.stdout
  assert checkpoints.verify(out, 'model')[1]['step'] == 3
