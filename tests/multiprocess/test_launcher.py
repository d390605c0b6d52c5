"""trax_revplus.multiprocess.launcher: N local processes, output and end.

The processes are small Python programs (no JAX) except in the last tests,
which launch real two-process JAX runs (tests/multiprocess/join_worker.py)
on loopback. Waits are bounded by a budget for starting processes on a slow,
busy machine; the behaviour under test (stopping the others) must finish
well inside it.
"""

import io
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from trax_revplus.errors import EXIT_LOST_PROCESS
from trax_revplus.multiprocess import errors
from trax_revplus.multiprocess import launch_flags
from trax_revplus.multiprocess import launcher as launcher_lib
from conftest import start_seconds

_WORKER = os.path.join(
  os.path.dirname(os.path.abspath(__file__)), 'join_worker.py'
)
_REPO = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
# The launcher as a command, as `python -m` runs it.
_LAUNCHER = [sys.executable, '-m', 'trax_revplus.multiprocess.launcher']
# Seconds to start a few Python processes (or JAX ones) on a busy machine.
_START_SECONDS = start_seconds()
# How long a process sleeps when others are meant to stop it: long enough to
# fail the test (not hang it) if they do not.
_FOREVER_SECONDS = 2 * _START_SECONDS

# Helpers every child program starts with: its process id from the flags
# the launcher appends, and a way to tell the test it is ready.
_PRELUDE = textwrap.dedent("""
    import os, signal, sys, time
    flags = dict(a[2:].split('=', 1) for a in sys.argv[1:])
    i = int(flags['process_id'])
    def ready(directory):
      open(os.path.join(directory, f'ready{i}'), 'w').close()
    def wait_ready(directory, n):
      while not all(os.path.exists(os.path.join(directory, f'ready{j}'))
                    for j in range(n)):
        time.sleep(0.05)
""")


def _child(body):
  return [sys.executable, '-c', _PRELUDE + textwrap.dedent(body)]


def _launch(command, n, **kwargs):
  out, err = io.StringIO(), io.StringIO()
  started = time.monotonic()
  try:
    launcher_lib.launch(command, n, stdout=out, stderr=err, **kwargs)
    error = None
  except errors.LaunchError as e:
    error = e
  return error, out.getvalue(), err.getvalue(), time.monotonic() - started


def test_output_is_forwarded_line_by_line_with_the_process_prefix():
  error, out, err, _ = _launch(
    _child("""
      print('argv', sys.argv[1:])
      print('second line of', i)
      print('to stderr from', i, file=sys.stderr)
      """),
    3,
  )
  assert error is None, err
  for i in range(3):
    assert f'[process {i}] second line of {i}' in out.splitlines()
    assert f'[process {i}] to stderr from {i}' in err.splitlines()
  argvs = [l for l in out.splitlines() if ' argv ' in l]
  assert len(argvs) == 3
  addresses = set(re.findall(r"--coordinator_address=(127\.0\.0\.1:\d+)'", out))
  assert len(addresses) == 1
  for i in range(3):
    [line] = [l for l in argvs if l.startswith(f'[process {i}] ')]
    assert f"'--num_processes=3', '--process_id={i}'" in line


def test_a_failing_process_stops_the_others_and_is_named(tmp_path):
  error, _, err, seconds = _launch(
    _child(f"""
      ready({str(tmp_path)!r})
      if i == 1:
        wait_ready({str(tmp_path)!r}, 3)
        sys.exit(3)
      time.sleep({_FOREVER_SECONDS})
      """),
    3,
  )
  assert isinstance(error, errors.ProcessFailedError), err
  assert (error.process_id, error.returncode, error.exit_code) == (1, 3, 3)
  assert str(error) == (
    'process 1 exited with status 3; stopped the others: '
    'process 0 was killed by SIGTERM, process 2 was '
    'killed by SIGTERM.'
  )
  assert seconds < _START_SECONDS


def test_a_process_that_lost_another_is_not_named_as_the_cause(tmp_path):
  # Process 0 is seen to end first, with the status of a process that
  # failed because another did (as when two end within one instant and are
  # seen in the wrong order); process 1, the cause, ends once the launcher
  # stops it.
  error, _, err, _ = _launch(
    _child(f"""
      signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))
      ready({str(tmp_path)!r})
      wait_ready({str(tmp_path)!r}, 2)
      if i == 0:
        sys.exit({EXIT_LOST_PROCESS})
      time.sleep({_FOREVER_SECONDS})
      """),
    2,
  )
  assert isinstance(error, errors.ProcessFailedError), err
  assert (error.process_id, error.exit_code) == (1, 3)
  assert str(error) == (
    'process 1 exited with status 3; stopped the others: '
    f'process 0 exited with status '
    f'{EXIT_LOST_PROCESS}.'
  )


def test_a_process_ignoring_sigterm_is_killed_after_the_grace(tmp_path):
  error, _, err, seconds = _launch(
    _child(f"""
      if i == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        ready({str(tmp_path)!r})
        time.sleep({_FOREVER_SECONDS})
      wait_ready({str(tmp_path)!r}, 1)
      sys.exit(1)
      """),
    2,
    stop_grace_seconds=1,
  )
  assert isinstance(error, errors.ProcessFailedError), err
  assert str(error) == (
    'process 1 exited with status 1; stopped the others: '
    'process 0 was killed by SIGKILL.'
  )
  assert seconds < _START_SECONDS


def test_a_process_killed_by_a_signal_is_named(tmp_path):
  error, _, err, _ = _launch(
    _child(f"""
      ready({str(tmp_path)!r})
      if i == 1:
        wait_ready({str(tmp_path)!r}, 2)
        os.kill(os.getpid(), signal.SIGKILL)
      time.sleep({_FOREVER_SECONDS})
      """),
    2,
  )
  assert isinstance(error, errors.ProcessFailedError), err
  assert error.process_id == 1
  assert error.exit_code == 128 + signal.SIGKILL
  assert str(error).startswith('process 1 was killed by SIGKILL;')


def test_processes_that_all_succeed_return_0():
  error, _, err, _ = _launch(_child('print(i)'), 2)
  assert error is None, err


@pytest.mark.parametrize('signum', [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_launcher_is_forwarded_to_every_process(
  tmp_path, signum
):
  command = _child(f"""
      def stop(signum, frame):
        print('got', signal.Signals(signum).name, flush=True)
        sys.exit(128 + signum)
      signal.signal(signal.SIGTERM, stop)
      signal.signal(signal.SIGINT, stop)
      ready({str(tmp_path)!r})
      time.sleep({_FOREVER_SECONDS})
      """)
  launcher = subprocess.Popen(
    _LAUNCHER + ['--num_processes=2', '--'] + command,
    cwd=_REPO,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  deadline = time.monotonic() + _START_SECONDS
  while not all((tmp_path / f'ready{i}').exists() for i in range(2)):
    if time.monotonic() > deadline or launcher.poll() is not None:
      launcher.kill()
      pytest.fail(f'processes not ready: {launcher.communicate()}')
    time.sleep(0.05)
  launcher.send_signal(signum)
  try:
    out, err = launcher.communicate(timeout=_START_SECONDS)
  except subprocess.TimeoutExpired:
    launcher.kill()
    pytest.fail('the launcher did not end after the signal')
  name = signal.Signals(signum).name
  assert launcher.returncode == 128 + signum, err
  for i in range(2):
    assert f'[process {i}] got {name}' in out.splitlines()
  [line] = [l for l in err.splitlines() if 'error:' in l]
  assert line.endswith(
    f'error: interrupted by {name}, forwarded to the 2 processes: '
    f'process 0 exited with status {128 + signum}, process 1 exited with '
    f'status {128 + signum}.'
  )


@pytest.mark.skipif(
  not sys.platform.startswith('linux'),
  reason='the parent-death signal is Linux only',
)
def test_processes_die_with_the_launcher(tmp_path):
  command = _child(f"""
      with open(os.path.join({str(tmp_path)!r}, f'pid{{i}}'), 'w') as f:
        f.write(str(os.getpid()))
      ready({str(tmp_path)!r})
      time.sleep({_FOREVER_SECONDS})
      """)
  launcher = subprocess.Popen(
    _LAUNCHER + ['--num_processes=2', '--'] + command,
    cwd=_REPO,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
  )
  deadline = time.monotonic() + _START_SECONDS
  while not all((tmp_path / f'ready{i}').exists() for i in range(2)):
    if time.monotonic() > deadline or launcher.poll() is not None:
      launcher.kill()
      pytest.fail('processes not ready')
    time.sleep(0.05)
  pids = [int((tmp_path / f'pid{i}').read_text()) for i in range(2)]
  launcher.kill()  # SIGKILL: no chance to stop them itself.
  launcher.wait()
  deadline = time.monotonic() + _START_SECONDS
  alive = pids
  while alive and time.monotonic() < deadline:
    alive = [pid for pid in alive if _running(pid)]
    time.sleep(0.05)
  for pid in alive:
    os.kill(pid, signal.SIGKILL)
  assert not alive


def _running(pid):
  """Whether `pid` runs (not gone, not a zombie awaiting its parent)."""
  try:
    with open(f'/proc/{pid}/stat') as f:
      return f.read().split(') ', 1)[1][0] != 'Z'
  except OSError:
    return False


def test_usage_errors_exit_2():
  with pytest.raises(errors.LaunchUsageError):
    launcher_lib.launch([], 2)
  with pytest.raises(errors.LaunchUsageError):
    launcher_lib.launch(['true'], 0)
  assert launcher_lib.main(['--num_processes=2']) == 2
  assert launcher_lib.main(['--num_processes=0', '--', 'true']) == 2
  assert (
    launcher_lib.main(['--num_processes=1', '--', '/nonexistent/program']) == 1
  )


@pytest.mark.parametrize(
  'module', ['trax_revplus.multiprocess.launcher', 'trax_revplus.launch']
)  # The old path.
def test_both_module_paths_run_the_launcher(module):
  proc = subprocess.run(
    [sys.executable, '-m', module, '--num_processes=2', '--']
    + _child('print(f"hello from {i}")'),
    cwd=_REPO,
    capture_output=True,
    text=True,
    timeout=2 * _START_SECONDS,
  )
  assert proc.returncode == 0, proc.stderr
  assert sorted(proc.stdout.splitlines()) == [
    '[process 0] hello from 0',
    '[process 1] hello from 1',
  ]


def _launch_workers(mode, extra=()):
  proc = subprocess.run(
    _LAUNCHER
    + ['--num_processes=2', '--', sys.executable, _WORKER, mode]
    + list(extra),
    cwd=_REPO,
    capture_output=True,
    text=True,
    timeout=2 * _START_SECONDS,
    env=dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=1'),
  )
  return proc


def test_launch_runs_a_two_process_jax_job():
  proc = _launch_workers('psum')
  assert proc.returncode == 0, proc.stderr[-3000:]
  for i in range(2):
    [line] = [
      l for l in proc.stdout.splitlines() if l.startswith(f'[process {i}] {{')
    ]
    report = json.loads(line[len(f'[process {i}] ') :])
    assert (
      report['process_index'],
      report['process_count'],
      report['psum'],
    ) == (i, 2, 3.0)


def test_launch_ends_a_jax_job_whose_process_dies():
  proc = _launch_workers('exit-early')
  assert proc.returncode == 3, proc.stderr[-3000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert 'error: process 1 exited with status 3; stopped the others: ' in last
  # Process 0 either failed its collective itself (the lost-process status,
  # so not named even when seen to end first) or was stopped by the
  # launcher first: by SIGTERM's default action after joining, or, when
  # the SIGTERM came while it was still in the join's first collective, by
  # the join's handler (128 + SIGTERM).
  assert re.search(
    r'process 0 (exited with status (4|143)|was killed by '
    r'SIGTERM)',
    last,
  ), last
  assert 'Check failure stack trace' not in proc.stderr


def test_after_a_failure_the_terminal_shows_only_the_failed_process(tmp_path):
  # Process 1 fails; process 0 prints only after process 1 has ended (as a
  # peer's abort would), and once more when the launcher stops it. Those
  # lines go to process 0's log file, not to the terminal.
  logs = tmp_path / 'logs'
  logs.mkdir()
  error, out, err, _ = _launch(
    _child(f"""
      def ended(pid):
        try:
          with open(f'/proc/{{pid}}/stat') as f:
            return f.read().split(') ', 1)[1][0] == 'Z'
        except OSError:
          return True
      ready({str(tmp_path)!r})
      if i == 1:
        wait_ready({str(tmp_path)!r}, 2)
        with open(os.path.join({str(tmp_path)!r}, 'pid1'), 'w') as f:
          f.write(str(os.getpid()))
        print('process 1 starting', flush=True)
        print('error: process 1 cannot go on', file=sys.stderr, flush=True)
        sys.exit(2)
      def stop(signum, frame):
        print('interrupted by SIGTERM', file=sys.stderr, flush=True)
        sys.exit(143)
      signal.signal(signal.SIGTERM, stop)
      # The launcher's SIGTERM waits until the line after the failure.
      signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
      print('process 0 starting', flush=True)
      pid_file = os.path.join({str(tmp_path)!r}, 'pid1')
      while not os.path.exists(pid_file) or not open(pid_file).read():
        time.sleep(0.05)
      while not ended(int(open(pid_file).read())):
        time.sleep(0.05)
      print('F0101 Check failure stack trace: after the failure',
            file=sys.stderr, flush=True)
      signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTERM])
      time.sleep({_FOREVER_SECONDS})
      """),
    2,
    log_dir=str(logs),
  )
  assert isinstance(error, errors.ProcessFailedError), err
  assert error.process_id == 1 and error.exit_code == 2
  assert str(error) == (
    f'process 1 exited with status 2; stopped the others: process 0 exited '
    f'with status 143 (all output of each: {logs}/launch.process<I>.log).'
  )
  assert err.splitlines() == ['[process 1] error: process 1 cannot go on']
  assert sorted(out.splitlines()) == [
    '[process 0] process 0 starting',
    '[process 1] process 1 starting',
  ]
  assert (logs / 'launch.process0.log').read_text().splitlines() == [
    'process 0 starting',
    'F0101 Check failure stack trace: after the failure',
    'interrupted by SIGTERM',
  ]
  # Its stdout and stderr come through two pipes, read apart: lines
  # written at once may reach the log in either order.
  assert sorted((logs / 'launch.process1.log').read_text().splitlines()) == [
    'error: process 1 cannot go on',
    'process 1 starting',
  ]


@pytest.mark.parametrize(
  'kwargs,fragment',
  [
    (
      dict(num_processes=9, max_processes=8),
      '--num_processes=9 is more than the 8 processes',
    ),
    (
      dict(num_processes=2, stop_grace_seconds=0),
      '--stop_grace_seconds=0 must be a positive number',
    ),
    (
      dict(num_processes=2, stop_grace_seconds=-1.0),
      '--stop_grace_seconds=-1.0 must be a positive number',
    ),
    (
      dict(num_processes=2, stop_grace_seconds=float('inf')),
      '--stop_grace_seconds=inf must be a positive number',
    ),
  ],
  ids=['too_many', 'no_grace', 'negative_grace', 'endless_grace'],
)
def test_launch_numbers_out_of_range_are_usage_errors(kwargs, fragment):
  num_processes = kwargs.pop('num_processes')
  with pytest.raises(errors.LaunchUsageError) as error:
    launcher_lib.launch(['true'], num_processes, **kwargs)
  assert fragment in str(error.value)
  assert error.value.exit_code == 2


def test_the_default_limit_follows_the_cpu_count(monkeypatch):
  monkeypatch.setattr(os, 'cpu_count', lambda: 2)
  assert launch_flags.default_max_processes() == 8
  assert launcher_lib.main(['--num_processes=9', '--', 'true']) == 2


@pytest.mark.parametrize(
  'flags',
  [
    ['--num_processes=2'],
    [
      '--num_processes=2',
      '--stop_grace_seconds=2.5',
      '--max_local_processes=8',
    ],
    ['--num_processes=0'],
    ['--num_processes=x'],
    ['--num_processes=2', '--stop_grace_seconds=0'],
    ['--num_processes=2', '--stop_grace_seconds=inf'],
    ['--num_processes=2', '--max_local_processes=0'],
    ['--num_processes=2', '--num_processes=3'],
  ],
  ids=[
    'default',
    'all',
    'zero',
    'not_int',
    'no_grace',
    'inf_grace',
    'no_max',
    'contradiction',
  ],
)
def test_the_launch_flags_read_alike_in_both_commands(flags):
  """`trax-revplus launch` and `python -m ...launcher` read the launch
  flags alike: the same values and defaults, the same values refused."""
  from trax_revplus.cli import parser  # pylint: disable=g-import-not-at-top
  from trax_revplus.errors import UserError  # pylint: disable=g-import-not-at-top

  names = ('num_processes', 'stop_grace_seconds', 'max_local_processes')
  try:
    cli = parser.parse(['launch', *flags, '--', '--config_file=a.gin'])
  except UserError:
    cli = None
  try:
    module = launcher_lib.build_parser().parse_args(flags)
  except SystemExit:
    module = None
  if cli is None or module is None:
    assert cli is None and module is None, (cli, module)
    return
  got = [(getattr(cli, n), type(getattr(cli, n))) for n in names]
  assert got == [(getattr(module, n), type(getattr(module, n))) for n in names]
