"""trax_revplus.multiprocess.join: joining jax.distributed, and failing.

What is refused before JAX is asked to join (a coordinator address that
cannot be served or reached) is checked in this process; bad values are
`config.resolve_config`'s, checked in test_config.py. Everything else starts
real processes on loopback (tests/multiprocess/join_worker.py), each with
the CPU backend and gloo. Every wait is bounded by a budget for starting a
Python process that imports JAX on a slow, busy machine, plus the join
deadline under test; a process that outlives it is killed and the test
fails (a hang, which these paths must never do).
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from unittest import mock

import pytest

from trax_revplus.errors import EXIT_LOST_PROCESS
from trax_revplus.multiprocess import config as config_lib
from trax_revplus.multiprocess import errors
from trax_revplus.multiprocess import join
from trax_revplus.multiprocess import launcher
from conftest import start_seconds

_WORKER = os.path.join(
  os.path.dirname(os.path.abspath(__file__)), 'join_worker.py'
)
# Seconds a process may take to start and import JAX on a busy 2-core
# machine, on top of any deadline a test sets.
_START_SECONDS = start_seconds()
# A join deadline long enough never to expire in a run that should succeed.
_PATIENT_JOIN_SECONDS = 300


class _Processes:
  """Worker processes started together; `wait()` bounds every one."""

  def __init__(self, argvs, env=None):
    self.started = time.monotonic()
    self.procs = [
      subprocess.Popen(
        [sys.executable, _WORKER] + list(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
      )
      for argv in argvs
    ]

  def wait(self, seconds):
    """[(returncode, stdout, stderr, seconds to exit)] of every process."""
    results = []
    try:
      for proc in self.procs:
        remaining = max(1.0, self.started + seconds - time.monotonic())
        out, err = proc.communicate(timeout=remaining)
        results.append(
          (proc.returncode, out, err, time.monotonic() - self.started)
        )
    except subprocess.TimeoutExpired:
      self.kill()
      pytest.fail(f'a worker process did not exit within {seconds:g} s (hung)')
    return results

  def kill(self):
    for proc in self.procs:
      if proc.poll() is None:
        proc.kill()
        proc.communicate()


def _env(devices_per_process=1):
  env = dict(os.environ)
  env['XLA_FLAGS'] = (
    f'--xla_force_host_platform_device_count={devices_per_process}'
  )
  env['PYTHONUNBUFFERED'] = '1'
  return env


def _flags(n, i, address, timeout_seconds=_PATIENT_JOIN_SECONDS):
  return [
    f'--num_processes={n}',
    f'--process_id={i}',
    f'--coordinator_address={address}',
    f'--timeout_seconds={timeout_seconds}',
  ]


def _address():
  return f'127.0.0.1:{launcher.free_port()}'


def _error_lines(stderr):
  """Our one-line errors, and any sign of a JAX abort, in stderr."""
  lines = [l for l in stderr.splitlines() if l.startswith('error: ')]
  aborted = 'Check failure stack trace' in stderr or 'Terminating process' in (
    stderr
  )
  return lines, aborted


def _assert_one_line_error(result, exit_code, *fragments):
  returncode, _, stderr, _ = result
  lines, aborted = _error_lines(stderr)
  assert returncode == exit_code, stderr[-2000:]
  assert not aborted, stderr[-2000:]
  assert len(lines) == 1, stderr[-2000:]
  for fragment in fragments:
    assert fragment in lines[0], lines[0]


@pytest.mark.parametrize('devices_per_process', [1, 2])
def test_two_processes_join_and_psum_across_them(devices_per_process):
  address = _address()
  procs = _Processes(
    [['psum'] + _flags(2, i, address) for i in range(2)],
    env=_env(devices_per_process),
  )
  results = procs.wait(_START_SECONDS + _PATIENT_JOIN_SECONDS)
  n = 2 * devices_per_process
  for i, (returncode, out, err, _) in enumerate(results):
    assert returncode == 0, err[-2000:]
    report = json.loads(out.strip().splitlines()[-1])
    assert report['process_index'] == i
    assert report['process_count'] == 2
    assert report['device_count'] == n
    assert report['local_device_count'] == devices_per_process
    # Device d contributes d + 1: the sum over every device of both.
    assert report['psum'] == n * (n + 1) / 2
    # Every process agrees on the least, exactly, beyond int32's range.
    assert report['least_large'] == (5 << 32) + 7 - 3
    assert report['least_signed'] == -(3 << 31)


def test_a_process_that_never_joins_times_out_in_one_line():
  timeout = 4
  procs = _Processes([['psum'] + _flags(2, 0, _address(), timeout)], env=_env())
  [result] = procs.wait(_START_SECONDS + timeout)
  _assert_one_line_error(
    result, 1, 'process 0 of 2', f'not every process joined within {timeout} s'
  )


def _assert_refused_before_jax(config, *fragments):
  """`join.initialize(config)` raises a one-line error before JAX is touched.

  Raised before JAX is configured for collectives or asked to join: at once,
  with nothing to undo in the calling process.
  """
  import jax  # pylint: disable=g-import-not-at-top

  with (
    mock.patch.object(jax.config, 'update') as update,
    mock.patch.object(jax.distributed, 'initialize') as initialize,
    pytest.raises(errors.DistributedRuntimeError) as info,
  ):
    join.initialize(config)
  message = str(info.value)
  assert info.value.exit_code == 1
  assert '\n' not in message
  for fragment in fragments:
    assert fragment in message, message
  update.assert_not_called()
  initialize.assert_not_called()


def test_coordinator_port_in_use_fails_at_once_in_one_line():
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
    holder.bind(('127.0.0.1', 0))
    holder.listen()
    port = holder.getsockname()[1]
    # Process 0 checks the port before joining.
    config = config_lib.resolve_config(2, 0, f'127.0.0.1:{port}', environ={})
    _assert_refused_before_jax(config, f'port {port}', 'already in use')


def test_unresolvable_coordinator_host_fails_at_once_in_one_line():
  config = config_lib.resolve_config(
    2, 1, 'no-such-host.invalid:1234', environ={}
  )
  _assert_refused_before_jax(config, "'no-such-host.invalid' does not resolve")


@pytest.mark.slow
def test_processes_disagreeing_on_the_count_fail_in_one_line_each():
  # Process 1 believes in 3 processes; process 0 started a run of 2.
  address = _address()
  procs = _Processes(
    [['psum'] + _flags(2, 0, address), ['psum'] + _flags(3, 1, address)],
    env=_env(),
  )
  first, second = procs.wait(_START_SECONDS + _PATIENT_JOIN_SECONDS)
  _assert_one_line_error(
    second, 2, 'process 1 of 3', 'process 0 started the run for 2 processes'
  )
  # Process 0 waited for it at the first collective and gave up, in one
  # line, before JAX's heartbeat timeout (100 s) would abort it.
  _assert_one_line_error(
    first, 1, 'process 0 of 2', 'collective over all devices'
  )


def test_two_processes_with_the_same_id_fail_in_one_line_each():
  timeout = 6
  address = _address()
  procs = _Processes(
    [['psum'] + _flags(3, i, address, timeout) for i in (0, 1, 1)], env=_env()
  )
  results = procs.wait(_START_SECONDS + timeout)
  # The coordinator rejects the earlier of the two processes 1, and JAX
  # aborts it (SIGABRT): its stack trace is condensed to one line.
  rejected = [r for r in results if r[0] == -signal.SIGABRT]
  assert len(rejected) == 1, [r[2][-1000:] for r in results]
  _assert_one_line_error(
    rejected[0],
    -signal.SIGABRT,
    'process 1 of 3',
    'JAX ended this process',
    'same --process_id',
  )
  # The others wait for a process 1 that never comes, up to the deadline.
  for result in results:
    if result is not rejected[0]:
      _assert_one_line_error(
        result, 1, f'within {timeout} s', 'its own --process_id'
      )


def test_joining_after_jax_started_is_refused_in_one_line():
  procs = _Processes([['backend-first'] + _flags(2, 0, _address())], env=_env())
  [result] = procs.wait(_START_SECONDS)
  _assert_one_line_error(result, 1, 'a JAX backend was initialised before')


def test_ctrl_c_while_waiting_to_join_ends_in_one_line():
  port = launcher.free_port()
  procs = _Processes([['psum'] + _flags(2, 0, f'127.0.0.1:{port}')], env=_env())
  # Process 0 serves the coordinator from inside the join: once its port
  # accepts connections, the process is waiting there for process 1.
  deadline = time.monotonic() + _START_SECONDS
  while True:
    try:
      socket.create_connection(('127.0.0.1', port), timeout=5).close()
      break
    except OSError:
      if time.monotonic() > deadline or procs.procs[0].poll() is not None:
        procs.kill()
        pytest.fail('process 0 did not start serving the coordinator')
      time.sleep(0.2)
  procs.procs[0].send_signal(signal.SIGINT)
  [result] = procs.wait(_START_SECONDS)
  _assert_one_line_error(result, 130, 'interrupted by SIGINT while joining')


def test_a_process_that_dies_after_joining_fails_the_others_in_one_line():
  address = _address()
  procs = _Processes(
    [['exit-early'] + _flags(2, i, address) for i in range(2)], env=_env()
  )
  survivor, dead = procs.wait(_START_SECONDS + _PATIENT_JOIN_SECONDS)
  assert dead[0] == 3, dead[2][-2000:]
  _assert_one_line_error(survivor, EXIT_LOST_PROCESS, 'a collective failed')
