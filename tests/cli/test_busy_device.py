"""A command on a device another process holds (a TPU chip belongs to one
process), on a simulated one-chip host (tests/one_chip/): one line naming
the holder and the fix, exit status 1, no traceback, nothing written."""

import subprocess

import pytest

from trax_revplus import errors

import one_chip_host as one_chip_host_lib
from cli_cases import cli_command
from cli_cases import MAIN
from cli_cases import REPO
from cli_cases import TINY_MODEL


@pytest.mark.parametrize('command', ['train', 'estimate', 'compare'])
def test_a_command_on_a_busy_device_is_one_line(command, tmp_path,
                                                one_chip_host):
  output_dir = tmp_path / 'run'
  args = cli_command() + [command, f'--config_file={MAIN}'] + [
      f'--config={b}' for b in TINY_MODEL + ['train.steps = 1']]
  if command != 'estimate':
    args.append(f'--output_dir={output_dir}')
  with one_chip_host_lib.holding_the_chip(one_chip_host) as pid:
    proc = subprocess.run(args, env=one_chip_host, cwd=REPO,
                          capture_output=True, text=True, check=False)
  assert proc.returncode == errors.EXIT_RUNTIME, proc.stderr[-3000:]
  lines = proc.stderr.strip().splitlines()
  assert lines == [
      f'trax-revplus {command}: error: the TPU is in use by another process '
      f'(pid {pid}): wait for it to end or stop it; one process per chip'
  ], proc.stderr[-3000:]
  if command == 'train':  # Before the output dir is made.
    assert not output_dir.exists()
