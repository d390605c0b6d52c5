"""trax_revplus.backend: a device another process holds is one line; a
function run in a child process answers, or fails in one line."""

import os

import pytest

from trax_revplus import backend
from trax_revplus import errors

import one_chip_host as one_chip_host_lib

# As JAX reports what a TPU runtime raises when another process holds the
# chip, and libtpu when it cannot take its lockfile.
_TPU_IN_USE = (
  "Unable to initialize backend 'tpu': ABORTED: The TPU is already in use "
  'by process with pid 4242. Not attempting to load libtpu.so in this '
  "process. (set JAX_PLATFORMS='' to automatically choose an available "
  'backend)'
)
_LOCKFILE = (
  'Internal error when accessing libtpu multi-process lockfile. '
  'Run "$ sudo rm /tmp/libtpu_lockfile".'
)


def test_a_busy_tpu_is_one_line_naming_the_holder_and_the_fix():
  error = backend.busy_device_error(RuntimeError(_TPU_IN_USE))
  assert isinstance(error, errors.UserError)
  assert error.exit_code == errors.EXIT_RUNTIME
  assert str(error) == (
    'the TPU is in use by another process (pid 4242): '
    'wait for it to end or stop it; one process per chip'
  )


def test_libtpu_s_lockfile_names_the_process_that_holds_it(tmp_path):
  """libtpu's holder keeps its lockfile open: that process is named."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top

  lockfile = tmp_path / 'libtpu_lockfile'
  lockfile.write_text('')
  message = _LOCKFILE.replace('/tmp/libtpu_lockfile', str(lockfile))
  alone = backend.busy_device_error(RuntimeError(message))
  assert str(alone) == (
    f"the TPU cannot be opened: libtpu's lockfile {lockfile} cannot be "
    f'taken, and no process this user can see holds it open: wait for the '
    f'process that uses the TPU to end, or if none does, remove the file '
    f'(sudo rm {lockfile}); one process per chip'
  )
  holder = subprocess.Popen(
    [
      sys.executable,
      '-c',
      f'f = open({str(lockfile)!r}); print(1, flush=True); input()',
    ],
    stdin=subprocess.PIPE,
    stdout=subprocess.PIPE,
    text=True,
  )
  try:
    holder.stdout.readline()
    held = backend.busy_device_error(RuntimeError(message))
  finally:
    holder.communicate('')
  assert str(held) == (
    f'the TPU is in use by another process (pid '
    f'{holder.pid}): wait for it to end or stop it; one '
    f'process per chip'
  )


def test_a_busy_device_is_found_in_the_error_it_was_raised_from():
  try:
    try:
      raise RuntimeError(_TPU_IN_USE)
    except RuntimeError as e:
      raise ValueError('while building the model') from e
  except ValueError as e:
    assert 'pid 4242' in str(backend.busy_device_error(e))
  assert backend.busy_device_error(RuntimeError('out of memory')) is None
  assert backend.busy_device_error(ValueError('')) is None


def _fails(kind):
  """Raises what `kind` names, in the child of the tests below."""
  if kind == 'user':
    raise errors.UserError('a bad binding; fix it', errors.EXIT_USAGE)
  if kind == 'busy':
    raise RuntimeError(_TPU_IN_USE)
  if kind == 'exit':
    os._exit(3)  # pylint: disable=protected-access
  raise KeyError('unforeseen')


def test_a_function_runs_in_a_child_process_and_answers():
  assert backend.call(f'{__name__}:_echo', [1, 'a'], env=_env()) == [
    [1, 'a'],
    os.getpid(),
  ]


def _echo(value):
  return [value, os.getppid()]


def _env():
  """This process's environment with the tests directory importable."""
  env = dict(os.environ)
  here = os.path.dirname(os.path.abspath(__file__))
  env['PYTHONPATH'] = os.pathsep.join([here, env.get('PYTHONPATH', '')])
  return env


@pytest.mark.parametrize(
  'kind, line, code',
  [
    ('user', 'a bad binding; fix it', errors.EXIT_USAGE),
    (
      'busy',
      'the TPU is in use by another process (pid 4242)',
      errors.EXIT_RUNTIME,
    ),
    ('other', "KeyError: 'unforeseen'", errors.EXIT_RUNTIME),
    (
      'exit',
      'ended in its process without an answer (exit status 3)',
      errors.EXIT_RUNTIME,
    ),
  ],
)
def test_a_function_that_fails_in_its_child_is_one_line(
  kind, line, code, tmp_path
):
  log = tmp_path / 'child.log'
  with pytest.raises(errors.UserError) as error:
    backend.call(f'{__name__}:_fails', kind, env=_env(), log_path=str(log))
  assert line in str(error.value) and '\n' not in str(error.value)
  assert error.value.exit_code == code
  if kind == 'other':  # The traceback is in the log, not in the line.
    assert 'Traceback (most recent call last)' in log.read_text()


def test_a_probe_of_a_busy_chip_is_one_line(one_chip_host):
  with one_chip_host_lib.holding_the_chip(one_chip_host) as pid:
    with pytest.raises(errors.UserError) as error:
      backend.probe(env=one_chip_host)
  assert str(error.value).startswith(
    f'the TPU is in use by another process (pid {pid}): '
  )
  info = backend.probe(env=one_chip_host)
  assert info['platform'] == 'cpu' and info['local_device_count'] >= 1
  assert len(info['devices']) == info['local_device_count']
  assert info['devices'][0] == 'cpu:0'
