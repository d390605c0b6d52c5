"""Starts the N processes of a multi-process run on this host (loopback).

For trying a multi-process run on one machine and for tests. `trax-revplus
launch` starts `trax-revplus train` through `launch`; any other command
that takes the three flags below can be started as

    python -m trax_revplus.multiprocess.launcher --num_processes=2 -- \\
        python my_program.py ...

`launch` starts the command N times, each with `--num_processes=N --process_id=I
--coordinator_address=127.0.0.1:PORT` appended (PORT a free port), and

  * forwards each process's output line by line, prefixed `[process I]`
    (stdout to stdout, stderr to stderr), and, given a `log_dir`, writes
    all of it to `log_dir/launch.process<I>.log` too;
  * once a process has failed, forwards nothing more of the others: what
    they print while they stop (their own error lines, a JAX abort's stack
    trace) goes to their log files only. The lines of the process named as
    the cause are printed, then the launcher's one line. Whether another
    process has failed is asked of the kernel as each line is read, so a
    line printed after a failure (which it may be a consequence of) is
    never forwarded, however busy the machine;
  * when a process fails (a non-zero exit status or a signal), sends SIGTERM
    to the others, SIGKILL to those still running `stop_grace_seconds`
    later, and raises `ProcessFailedError`, whose one-line message names the
    process that failed first and how it ended; a process that ended with
    `EXIT_LOST_PROCESS` (it failed because another one had) is named only
    when no other process failed, since two processes can end within the
    same instant and be seen in either order;
  * forwards SIGINT and SIGTERM it receives to every process (each runs in
    a session of its own, so a Ctrl-C in the terminal reaches them once,
    through here); a second signal is forwarded too.

On Linux each process also gets SIGKILL if the launcher itself dies.
"""

import argparse
import ctypes
import ctypes.util
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO, Mapping, Sequence

from trax_revplus.errors import EXIT_LOST_PROCESS
from trax_revplus.errors import EXIT_RUNTIME
from trax_revplus.multiprocess import forwarding
from trax_revplus.multiprocess.launch_flags import add_launch_flags
from trax_revplus.multiprocess.launch_flags import check_launch
from trax_revplus.multiprocess.launch_flags import DEFAULT_STOP_GRACE_SECONDS
from trax_revplus.multiprocess.launch_flags import default_max_processes
from trax_revplus.multiprocess.errors import LaunchError
from trax_revplus.multiprocess.errors import LaunchInterruptedError
from trax_revplus.multiprocess.errors import LaunchUsageError
from trax_revplus.multiprocess.errors import ProcessFailedError

_POLL_SECONDS = 0.1
_DRAIN_SECONDS = 10
_PR_SET_PDEATHSIG = 1


def describe_exit(returncode: int) -> str:
  """'exited with status 3' or 'was killed by SIGKILL' for a returncode."""
  if returncode >= 0:
    return f'exited with status {returncode}'
  try:
    name = signal.Signals(-returncode).name
  except ValueError:
    name = f'signal {-returncode}'
  return f'was killed by {name}'


def free_port(host: str = '127.0.0.1') -> int:
  """A TCP port free at the moment on every address of this host (int).

  The port is released before returning; another program may take it
  before the coordinator binds it (process 0 then reports the port in use).
  """
  del host  # The coordinator binds every address ('[::]:PORT').
  for family, address in ((socket.AF_INET6, '::'), (socket.AF_INET, '')):
    try:
      with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.bind((address, 0))
        return probe.getsockname()[1]
    except OSError:
      continue
  raise LaunchError('no free TCP port on this host for the coordinator.')


def launch_log_file_name(process_id: int) -> str:
  """'launch.process<I>.log': all that process I printed."""
  return f'launch.process{process_id}.log'


def process_flags(
  num_processes: int, process_id: int, coordinator_address: str
) -> list[str]:
  """The flags appended to the command of process `process_id` (list)."""
  return [
    f'--num_processes={num_processes}',
    f'--process_id={process_id}',
    f'--coordinator_address={coordinator_address}',
  ]


def _parent_death_signal():
  """preexec_fn giving the child SIGKILL when this process dies (Linux)."""
  if not sys.platform.startswith('linux'):
    return None
  try:
    prctl = ctypes.CDLL(
      ctypes.util.find_library('c') or 'libc.so.6', use_errno=True
    ).prctl
  except (OSError, AttributeError):
    return None
  # Resolved here, in the parent: the child only calls it.
  return lambda: prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def launch(
  command: Sequence[str],
  num_processes: int,
  *,
  host: str = '127.0.0.1',
  port: int | None = None,
  env: Mapping[str, str] | None = None,
  stop_grace_seconds: float = DEFAULT_STOP_GRACE_SECONDS,
  stdout: IO[str] | None = None,
  stderr: IO[str] | None = None,
  log_dir: str | None = None,
  max_processes: int | None = None,
) -> int:
  """Runs `command` as processes 0..N-1 of one run and waits for them.

  Args:
    command: the program and its arguments (sequence of str); each process
      gets `process_flags(...)` appended.
    num_processes: int >= 1, N.
    host: str, the coordinator host the processes are told (this host).
    port: int or None (`free_port()`).
    env: environment of the processes (mapping), `os.environ` if None;
      `PYTHONUNBUFFERED=1` is added so Python output arrives line by line.
    stop_grace_seconds: float > 0, how long the others get after SIGTERM,
      once one process failed, before SIGKILL.
    stdout: text stream for the processes' stdout (`sys.stdout` if None).
    stderr: text stream for their stderr (`sys.stderr` if None).
    log_dir: str or None, an existing directory for each process's full
      output (`launch_log_file_name`).
    max_processes: int or None, the most processes to start (None: no
      limit); see `default_max_processes`.

  Returns:
    0, when every process exited with status 0.

  Raises:
    LaunchUsageError: N < 1 or above `max_processes`, `stop_grace_seconds`
      not a positive number, or `command` is empty.
    ProcessFailedError: a process failed; the others were stopped.
    LaunchInterruptedError: SIGINT or SIGTERM reached the launcher (from
      the main thread only) and, forwarded, ended the processes.
    OSError: the command cannot be started.
  """
  command = list(command)
  if not command:
    raise LaunchUsageError('no command to launch; give it after --.')
  check_launch(num_processes, stop_grace_seconds, max_processes)
  stdout = stdout or sys.stdout
  stderr = stderr or sys.stderr
  address = f'{host}:{port or free_port(host)}'
  child_env = dict(os.environ if env is None else env)
  child_env.setdefault('PYTHONUNBUFFERED', '1')
  procs: list[subprocess.Popen] = []
  forwarders: list[forwarding.LineForwarder] = []
  log_files: list[IO[str] | None] = []
  received: list[int] = []
  output = forwarding.LineOutput(procs, log_files, received)

  def forward_signal(signum, unused_frame):
    received.append(signum)
    for proc in procs:
      if proc.poll() is None:
        _send(proc, signum)

  on_main = threading.current_thread() is threading.main_thread()
  previous = {}
  if on_main:
    for signum in (signal.SIGINT, signal.SIGTERM):
      previous[signum] = signal.signal(signum, forward_signal)
  try:
    preexec = _parent_death_signal()
    for i in range(num_processes):
      log_files.append(
        None
        if log_dir is None
        else open(  # pylint: disable=consider-using-with
          os.path.join(log_dir, launch_log_file_name(i)), 'w', encoding='utf-8'
        )
      )
      proc = subprocess.Popen(
        command + process_flags(num_processes, i, address),
        env=child_env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=preexec,
      )
      procs.append(proc)
      if received:  # A signal came while starting: the new one gets it too.
        _send(proc, received[0])
      for pipe, stream in ((proc.stdout, stdout), (proc.stderr, stderr)):
        assert pipe is not None  # Both are subprocess.PIPE.
        forwarder = forwarding.LineForwarder(
          pipe, stream, f'[process {i}] ', output, i
        )
        forwarder.start()
        forwarders.append(forwarder)
    failed = _wait(procs, received, stop_grace_seconds)
  finally:
    for proc in procs:  # Only after an exception: none is left otherwise.
      if proc.poll() is None:
        _send(proc, signal.SIGKILL)
        proc.wait()
    for forwarder in forwarders:
      # Ends with the process's pipe; a process it started may hold the pipe
      # open longer, so do not wait for that indefinitely.
      forwarder.join(timeout=_DRAIN_SECONDS)
    for signum, handler in previous.items():
      if handler is not None:  # None: not installed from Python.
        signal.signal(signum, handler)
    with output.lock:
      for k, log in enumerate(log_files):
        if log is not None:
          log.close()
          log_files[k] = None
  ends = ', '.join(
    f'process {i} {describe_exit(p.returncode)}' for i, p in enumerate(procs)
  )
  if received:
    name = signal.Signals(received[0]).name
    raise LaunchInterruptedError(
      f'interrupted by {name}, forwarded to the {num_processes} '
      f'processes: {ends}.',
      received[0],
    )
  if failed is not None:
    output.release(failed)
    others = ', '.join(
      f'process {i} {describe_exit(p.returncode)}'
      for i, p in enumerate(procs)
      if i != failed
    )
    rc = procs[failed].returncode
    logs = (
      ''
      if log_dir is None
      else f' (all output of each: {os.path.join(log_dir, "launch.process")}'
      f'<I>.log)'
    )
    raise ProcessFailedError(
      f'process {failed} {describe_exit(rc)}; stopped the others'
      f'{": " + others if others else ""}{logs}.',
      failed,
      rc,
    )
  return 0


def _send(proc, signum):
  try:
    proc.send_signal(signum)
  except ProcessLookupError:
    pass


def _wait(procs, received, stop_grace_seconds):
  """Waits for every process; stops the rest once one fails.

  One thread per process waits for it, so the order in which processes end
  is known even when they end within the same instant (a process that dies
  and a peer whose next collective fails at once).

  Returns:
    The index of the process that failed first, or None when none did;
    one that ended with `EXIT_LOST_PROCESS` only when every failed one did.
  """
  ended: queue.Queue[tuple[int, int]] = queue.Queue()
  i: int | None
  for i, proc in enumerate(procs):
    threading.Thread(
      target=lambda i=i, p=proc: ended.put((i, p.wait())), daemon=True
    ).start()
  failures = []
  kill_at = None
  running = len(procs)
  while running:
    try:
      # Short waits: signal handlers run on this thread between them.
      i, returncode = ended.get(timeout=_POLL_SECONDS)
      running -= 1
    except queue.Empty:
      i, returncode = None, 0
    if returncode != 0:
      failures.append((i, returncode))
      if len(failures) == 1 and not received:
        # After a forwarded signal the others are already stopping (the
        # chief may be writing its checkpoint): no second signal then.
        for proc in procs:
          if proc.poll() is None:
            _send(proc, signal.SIGTERM)
        kill_at = time.monotonic() + stop_grace_seconds
    if kill_at is not None and time.monotonic() >= kill_at:
      for proc in procs:
        if proc.poll() is None:
          _send(proc, signal.SIGKILL)
      kill_at = None
  causes = [i for i, rc in failures if rc != EXIT_LOST_PROCESS]
  return (causes or [i for i, _ in failures] or [None])[0]


def build_parser() -> argparse.ArgumentParser:
  """The flags of `main`: those of `add_launch_flags`, and --log_dir."""
  parser = argparse.ArgumentParser(
    prog='python -m trax_revplus.multiprocess.launcher',
    description='Start N processes of a multi-process run on this host.',
  )
  add_launch_flags(parser)
  parser.add_argument(
    '--log_dir',
    metavar='DIR',
    help="An existing directory for each process's full output "
    '(launch.process<I>.log).',
  )
  return parser


def main(argv: Sequence[str] | None = None) -> int:
  """Runs `python -m trax_revplus.multiprocess.launcher --num_processes=N --
  COMMAND...`; returns its exit status."""
  argv = sys.argv[1:] if argv is None else list(argv)
  parser = build_parser()
  if '--' in argv:
    split = argv.index('--')
    argv, command = argv[:split], argv[split + 1 :]
  else:
    command = []
  try:
    args = parser.parse_args(argv)
  except SystemExit as e:  # A bad flag (status 2, argparse's line) or --help.
    assert isinstance(e.code, int)  # argparse exits with 2 or 0.
    return e.code
  try:
    return launch(
      command,
      args.num_processes,
      stop_grace_seconds=args.stop_grace_seconds,
      log_dir=args.log_dir,
      max_processes=(args.max_local_processes or default_max_processes()),
    )
  except LaunchError as e:
    print(f'{parser.prog}: error: {e}', file=sys.stderr, flush=True)
    return e.exit_code
  except OSError as e:
    print(
      f'{parser.prog}: error: cannot start {command[0]!r}: {e.strerror or e}',
      file=sys.stderr,
      flush=True,
    )
    return EXIT_RUNTIME


if __name__ == '__main__':
  sys.exit(main())
