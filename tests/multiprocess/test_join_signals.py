"""Ctrl-C and SIGTERM while a process waits for the others to join.

A real process is the behaviour (a signal to a process blocked in JAX's
join), so each case starts tests/multiprocess/join_worker.py as process 0
of 2, without process 1, and signals it once its coordinator port accepts
connections (it is then inside the join, waiting). The process must end
with one line and 128 + the signal, however SIGINT was disposed when it
started: a process started in the background of a shell inherits SIGINT
ignored, and then the interpreter installs no handler of its own, so the
signal never reached the join's watchdog and the process waited out the
whole join timeout. Waits are bounded by the join deadline, which is long
(the test fails, slowly, rather than pass by timing out).
"""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import start_seconds
from trax_revplus.multiprocess import launcher

_WORKER = os.path.join(
  os.path.dirname(os.path.abspath(__file__)), 'join_worker.py'
)
_START_SECONDS = start_seconds()
_JOIN_SECONDS = 300


def _ignoring_sigint():
  signal.signal(signal.SIGINT, signal.SIG_IGN)


def _start(sigint_ignored):
  port = launcher.free_port()
  env = dict(
    os.environ,
    PYTHONUNBUFFERED='1',
    XLA_FLAGS='--xla_force_host_platform_device_count=1',
  )
  proc = subprocess.Popen(
    [
      sys.executable,
      _WORKER,
      'psum',
      '--num_processes=2',
      '--process_id=0',
      f'--coordinator_address=127.0.0.1:{port}',
      f'--timeout_seconds={_JOIN_SECONDS}',
    ],
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    env=env,
    start_new_session=True,
    preexec_fn=_ignoring_sigint if sigint_ignored else None,
  )
  deadline = time.monotonic() + _START_SECONDS
  while True:
    try:
      socket.create_connection(('127.0.0.1', port), timeout=5).close()
      return proc
    except OSError:
      if time.monotonic() > deadline or proc.poll() is not None:
        proc.kill()
        pytest.fail(
          f'process 0 did not start serving the coordinator: '
          f'{proc.communicate()}'
        )
      time.sleep(0.2)


@pytest.mark.parametrize(
  'signum,sigint_ignored',
  [(signal.SIGINT, True), (signal.SIGTERM, False)],
  ids=['sigint_inherited_ignored', 'sigterm'],
)
def test_a_signal_while_joining_ends_in_one_line(signum, sigint_ignored):
  proc = _start(sigint_ignored)
  sent = time.monotonic()
  proc.send_signal(signum)
  try:
    _, err = proc.communicate(timeout=_START_SECONDS + _JOIN_SECONDS)
  except subprocess.TimeoutExpired:
    proc.kill()
    pytest.fail('the process did not end')
  name = signal.Signals(signum).name
  assert proc.returncode == 128 + signum, err[-2000:]
  lines = [l for l in err.splitlines() if l.startswith('error: ')]
  assert lines == [
    f'error: interrupted by {name} while joining the other processes.'
  ], err[-2000:]
  # Not the join's deadline: that would say 'not every process joined'.
  assert time.monotonic() - sent < _JOIN_SECONDS
