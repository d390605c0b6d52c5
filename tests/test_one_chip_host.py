"""The simulated one-chip host the tests use (tests/one_chip/): while one
process holds JAX's backend, another that opens it fails as on a TPU host;
once the first has ended, it opens."""

import subprocess
import sys

import pytest

import one_chip_host as one_chip_host_lib


def _open_backend(env):
  return subprocess.run(
    [sys.executable, '-c', 'import jax; print(jax.devices())'],
    env=env,
    capture_output=True,
    text=True,
    check=False,
  )


@pytest.mark.parametrize('message', ['lockfile', 'pid'])
def test_a_second_process_fails_while_the_first_holds_the_backend(
  message, tmp_path
):
  lock = tmp_path / 'one_chip.lock'
  env = one_chip_host_lib.env(lock, message=message)
  with one_chip_host_lib.holding_the_chip(env) as pid:
    proc = _open_backend(env)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    # JAX's own line, as a TPU host gives it, but for the platform's name.
    assert last.startswith(
      "RuntimeError: Unable to initialize backend 'cpu': ABORTED: "
    ), last
    if message == 'pid':
      assert f'{one_chip_host_lib.BUSY_PID_TEXT} {pid}.' in last
    else:
      assert f'{one_chip_host_lib.BUSY_TEXT}. Run "$ sudo rm {lock}".' in last
    # Without the simulation a process opens its own CPU backend.
    del env[one_chip_host_lib.LOCK_ENV]
    assert _open_backend(env).returncode == 0
  proc = _open_backend(one_chip_host_lib.env(lock, message=message))
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert 'CpuDevice' in proc.stdout
