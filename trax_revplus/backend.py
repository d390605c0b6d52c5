"""JAX's backend: opened only by a process that runs on the device.

On a TPU host a chip belongs to one process: a second process that opens
JAX's backend fails ("Unable to initialize backend 'tpu': ABORTED: The TPU
is already in use by process with pid N ..."). So a process of ours that
starts others which need the device (`compare`, `launch`, the benchmark)
never opens the backend itself: what it needs to know of the device, or
to check with the device's figures, it asks of a short-lived child process
(`call`, `probe`), and the runs that need the device run one after
another. A process that runs on the device opens the backend with
`open_backend`, which reports a device another process holds in one line
(`BusyDeviceError`).

JAX is imported only where the backend opens (in the child, or by
`open_backend`, through `trax_import.module`): the parents that use `call`
need none of it.
"""

import importlib
import json
import os
import re
import subprocess
import sys
import traceback
from typing import Any, Mapping

from trax_revplus import trax_import
from trax_revplus.errors import EXIT_RUNTIME
from trax_revplus.errors import one_line
from trax_revplus.errors import UserError

# Marks the line a child writes its answer on, among what else it prints.
_ANSWER = 'TRAX_REVPLUS_CHILD_ANSWER '
# What a TPU runtime says when another process holds the chip: the pid in
# its message ("... in use by process with pid 1234. ..."), or, as libtpu
# with JAX 0.10 on a v5e host does, that it cannot take its lockfile, which
# the holder keeps open ("Internal error when accessing libtpu
# multi-process lockfile. Run "$ sudo rm /tmp/libtpu_lockfile".").
_IN_USE = re.compile(r'TPU is already in use by process(?: with pid)? (\d+)')
_LOCKFILE = re.compile(
  r'libtpu multi-process lockfile(?:\. Run "\$ sudo rm ([^"]+)")?'
)
_DEFAULT_LOCKFILE = '/tmp/libtpu_lockfile'
_ONE_PER_CHIP = 'one process per chip'


class BusyDeviceError(UserError):
  """The device is held by another process (exit status 1)."""

  exit_code = EXIT_RUNTIME


def busy_device_error(error: BaseException | None) -> BusyDeviceError | None:
  """`error` as one line when it says another process holds the device.

  Args:
    error: any exception; its message and those of the exceptions it was
      raised from or during (JAX raises "Unable to initialize backend ..."
      while handling the runtime's error) are read.

  Returns:
    A `BusyDeviceError` naming the holder's pid (from the runtime's
    message, or the process that keeps libtpu's lockfile open) and the
    fix; None for any other error.
  """
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    text = str(error)
    match = _IN_USE.search(text)
    if match:
      return _in_use([int(match.group(1))])
    match = _LOCKFILE.search(text)
    if match:
      path = match.group(1) or _DEFAULT_LOCKFILE
      holders = _holders(path)
      if holders:
        return _in_use(holders)
      return BusyDeviceError(
        f"the TPU cannot be opened: libtpu's lockfile {path} cannot be "
        f'taken, and no process this user can see holds it open: wait '
        f'for the process that uses the TPU to end, or if none does, '
        f'remove the file (sudo rm {path}); {_ONE_PER_CHIP}'
      )
    error = error.__cause__ or error.__context__
  return None


def _in_use(pids: list[int]) -> BusyDeviceError:
  which = (
    f'pid {pids[0]}'
    if len(pids) == 1
    else 'pids ' + ', '.join(str(p) for p in pids)
  )
  return BusyDeviceError(
    f'the TPU is in use by another process ({which}): '
    f'wait for it to end or stop it; {_ONE_PER_CHIP}'
  )


def _holders(path: str) -> list[int]:
  """The pids of the other processes that have the file `path` open, of
  those this process may read."""
  # Imported here: the CLI imports this module before anything else, and
  # only a busy device needs psutil.
  import psutil  # pylint: disable=g-import-not-at-top

  path = os.path.realpath(path)  # As /proc names open files.
  pids = []
  for process in psutil.process_iter():
    if process.pid == os.getpid():
      continue
    try:
      if any(f.path == path for f in process.open_files()):
        pids.append(process.pid)
    except (psutil.Error, OSError):  # Gone, or another user's.
      continue
  return sorted(pids)


def open_backend() -> None:
  """Opens JAX's backend in this process (nothing if it is open).

  Raises:
    BusyDeviceError: another process holds the device.
    Whatever else JAX raises when the backend cannot start.
  """
  jax = trax_import.jax
  try:
    jax.devices()
  except Exception as e:  # pylint: disable=broad-except
    busy = busy_device_error(e)
    if busy is None:
      raise
    raise busy from None


def describe() -> dict[str, Any]:
  """This process's backend, opened: {'platform': str, e.g. 'cpu' or 'tpu',
  'local_device_count': int, 'devices': [str] (every device of the run)}.

  Raises:
    BusyDeviceError: another process holds the device.
  """
  jax = trax_import.jax
  open_backend()
  local = jax.local_devices()
  return {
    'platform': local[0].platform,
    'local_device_count': len(local),
    'devices': [str(d) for d in jax.devices()],
  }


def probe(env: Mapping[str, str] | None = None) -> dict[str, Any]:
  """`describe()` as a short-lived child process sees it; this process
  opens no backend.

  Args:
    env: the child's environment; None: this process's.

  Raises:
    UserError: the child could not open the backend (a
      `BusyDeviceError`'s line, exit status 1) or failed.
  """
  return call(f'{__name__}:describe', env=env)


def call(
  function: str,
  *args: Any,
  env: Mapping[str, str] | None = None,
  log_path: str | None = None,
) -> Any:
  """Runs `function(*args)` in a fresh Python process; returns its result.

  For a process that must not open JAX's backend (see the module
  docstring): whatever the function opens ends with its process.

  Args:
    function: 'module:name' of a function of ours, importable in the child.
    *args: its arguments, JSON-serializable; so must its result be.
    env: the child's environment; None: this process's.
    log_path: where the child's output (stdout, then stderr) is written;
      None: nowhere.

  Returns:
    The function's result, through JSON.

  Raises:
    UserError: the function raised one (its message and exit status), or
      the device is busy (`BusyDeviceError`'s line, exit status 1), or it
      raised anything else or its process died: one line, exit status 1
      (the traceback is in `log_path`'s file).
  """
  command = [
    sys.executable,
    '-m',
    __name__,
    json.dumps({'function': function, 'args': list(args)}),
  ]
  # Ctrl-C and compare's SIGTERM reach the parent, which ends the child
  # (subprocess.run kills it while it unwinds).
  proc = subprocess.run(
    command,
    stdin=subprocess.DEVNULL,
    capture_output=True,
    text=True,
    errors='replace',
    env=None if env is None else dict(env),
    check=False,
  )
  if log_path is not None:
    with open(log_path, 'w', encoding='utf-8') as f:
      f.write(proc.stdout + proc.stderr)
  answers = [
    line[len(_ANSWER) :]
    for line in proc.stdout.splitlines()
    if line.startswith(_ANSWER)
  ]
  if not answers:
    lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
    where = f'; its output is in {log_path}' if log_path else ''
    raise UserError(
      f'{function} ended in its process without an answer (exit status '
      f'{proc.returncode}): {lines[-1] if lines else "no output"}{where}',
      EXIT_RUNTIME,
    )
  answer = json.loads(answers[-1])
  if 'error' in answer:
    raise UserError(answer['error'], answer['exit_code'])
  return answer['result']


def _answer(request: dict[str, Any]) -> dict[str, Any]:
  """The child's side of `call`: the function's result or its error."""
  module_name, _, name = request['function'].partition(':')
  try:
    function = getattr(importlib.import_module(module_name), name)
    return {'result': function(*request['args'])}
  except UserError as e:
    return {'error': str(e), 'exit_code': e.exit_code}
  except Exception as e:  # pylint: disable=broad-except
    busy = busy_device_error(e)
    if busy is not None:
      return {'error': str(busy), 'exit_code': busy.exit_code}
    traceback.print_exc()  # Into the log; the parent prints one line.
    return {
      'error': one_line(e, typed=True, max_chars=300),
      'exit_code': EXIT_RUNTIME,
    }


if __name__ == '__main__':
  print(_ANSWER + json.dumps(_answer(json.loads(sys.argv[1]))), flush=True)
