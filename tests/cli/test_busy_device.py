"""A command on a device another process holds (a TPU chip belongs to one
process): one line naming the holder and the fix, exit status 1, no
traceback, nothing written. `train` and `compare` on a simulated one-chip
host (tests/one_chip/); the error as JAX raises it, in this process, for
any command."""

import subprocess

import pytest

from trax_revplus import cli
from trax_revplus import errors

import one_chip_host as one_chip_host_lib
from cli_cases import cli_command
from cli_cases import MAIN
from cli_cases import REPO
from cli_cases import TINY_MODEL


# `train` opens the device itself; `compare` through its check's process;
# any other command where JAX first opens it (the test below).
@pytest.mark.parametrize('command', ['train', 'compare'])
def test_a_command_on_a_busy_device_is_one_line(
  command, tmp_path, one_chip_host
):
  output_dir = tmp_path / 'run'
  args = (
    cli_command()
    + [command, f'--config_file={MAIN}']
    + [f'--config={b}' for b in TINY_MODEL + ['train.steps = 1']]
  )
  args.append(f'--output_dir={output_dir}')
  with one_chip_host_lib.holding_the_chip(one_chip_host) as pid:
    proc = subprocess.run(
      args,
      env=one_chip_host,
      cwd=REPO,
      capture_output=True,
      text=True,
      check=False,
    )
  assert proc.returncode == errors.EXIT_RUNTIME, proc.stderr[-3000:]
  lines = proc.stderr.strip().splitlines()
  assert lines == [
    f'trax-revplus {command}: error: the TPU is in use by another process '
    f'(pid {pid}): wait for it to end or stop it; one process per chip'
  ], proc.stderr[-3000:]
  if command == 'train':  # Before the output dir is made.
    assert not output_dir.exists()


def test_any_command_that_finds_the_device_busy_is_one_line(
  monkeypatch, capsys
):
  """Wherever a command first opens JAX's backend (`estimate` where it
  reads the platform), JAX's error, as a TPU host raises it, is one line."""

  def busy(unused_flags):
    try:
      raise RuntimeError(
        'ABORTED: The TPU is already in use by process '
        'with pid 77. Not attempting to load libtpu.so in '
        'this process.'
      )
    except RuntimeError:
      raise RuntimeError(  # noqa: B904
        "Unable to initialize backend 'tpu': ABORTED: The "
        'TPU is already in use by process with pid 77.'
      )  # pylint: disable=raise-missing-from

  monkeypatch.setattr(cli, '_command', lambda name: busy)
  code = cli.main(['trax-revplus', 'estimate', f'--config_file={MAIN}'])
  _, err = capsys.readouterr()
  assert code == errors.EXIT_RUNTIME
  assert err == (
    'trax-revplus estimate: error: the TPU is in use by another '
    'process (pid 77): wait for it to end or stop it; one process '
    'per chip\n'
  )
