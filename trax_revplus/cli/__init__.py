"""The `trax-revplus` command: train, compare, estimate, plot-memory, launch.

One argparse parser with a subcommand each (`parser`); each command lives
in a module of its own (`train`, `compare`, `estimate`, `launch`,
`plot_memory`); the one-line form of errors in `messages`, the exit
statuses and the error base class in `trax_revplus.errors`. Only the
standard library is imported here, so `--help` and mistakes in flags or
paths answer before trax's import (seconds of CPU). Run as `trax-revplus ...` or
`python -m trax_revplus.cli ...`.
"""

import importlib
import os
import signal
import sys
import threading
from typing import Any, Sequence

from trax_revplus import backend
from trax_revplus import import_signals
from trax_revplus.cli import parser
from trax_revplus.cli.gin_config import import_trax_quietly
from trax_revplus.cli.gin_config import parse_configs
from trax_revplus.cli.messages import error_line
from trax_revplus.cli.messages import PROG
from trax_revplus.errors import EXIT_OK
from trax_revplus.errors import EXIT_RUNTIME
from trax_revplus.errors import EXIT_USAGE
from trax_revplus.errors import signal_exit_status
from trax_revplus.errors import UserError

__all__ = [
  'main',
  'run',
  'parse_configs',
  'import_trax_quietly',
  'UserError',
  'PROG',
  'EXIT_OK',
  'EXIT_RUNTIME',
  'EXIT_USAGE',
]


def _command(name: str):
  """The `run(flags)` of command `name` (one of `parser.COMMANDS`),
  imported when it runs: --help and mistakes in flags are answered with
  the standard library alone."""
  module = importlib.import_module(f'{__name__}.{name.replace("-", "_")}')
  return module.run


class _Stopped(BaseException):
  """SIGINT or SIGTERM reached a command that has no handler of its own.

  A BaseException, as KeyboardInterrupt is: code that reports any
  Exception (trax wraps one raised while a layer initializes into a
  `LayerError`; `estimate` reports a trainer it cannot account) must not
  turn a stop into an error message or swallow it.
  """

  def __init__(self, signum: int):
    super().__init__(signum)
    self.signum = signum


def _stop(signum: int, unused_frame) -> None:
  if not import_signals.defer(signum):  # Else raised again after it.
    raise _Stopped(signum)


def _handle_signals() -> dict[int, Any]:
  """Makes SIGINT and SIGTERM end any command in one line (`_Stopped`).

  Installed first thing, whatever the signals' dispositions were (SIGINT
  is inherited ignored by a process started in the background of a
  shell); a command that handles them itself (`train`, `launch`) installs
  its own handlers over these for its run.

  Returns:
    The previous handlers, by signal (empty off the main thread).
  """
  if threading.current_thread() is not threading.main_thread():
    return {}
  return {
    signum: signal.signal(signum, _stop)
    for signum in (signal.SIGINT, signal.SIGTERM)
  }


def main(argv: Sequence[str]) -> int:
  """Runs `trax-revplus` on `argv` (argv[0] is the program name).

  Returns:
    The exit status: 0 success, 1 runtime error, 2 usage error, 128 + N
    for a command stopped by signal N. User errors are printed as one
    line on stderr, the last line the command prints, and so is a device
    another process holds (`backend.busy_device_error`), wherever the
    command first opened JAX's backend; unexpected crashes propagate.
  """
  previous = _handle_signals()
  args = list(argv[1:])
  command = args[0] if args and args[0] in parser.COMMANDS else None
  try:
    if not args:
      sys.stderr.write(parser.OVERVIEW)
      return EXIT_USAGE
    flags = parser.parse(args)
    if isinstance(flags, int):
      return flags
    return _command(flags.command)(flags)
  except UserError as e:
    print(error_line(command, str(e)), file=sys.stderr, flush=True)
    return e.exit_code
  except Exception as e:  # pylint: disable=broad-except
    busy = backend.busy_device_error(e)
    if busy is None:
      raise
    print(error_line(command, str(busy)), file=sys.stderr, flush=True)
    return busy.exit_code
  except (_Stopped, KeyboardInterrupt) as e:
    signum = getattr(e, 'signum', signal.SIGINT)
    print(
      error_line(command, f'interrupted by {signal.Signals(signum).name}'),
      file=sys.stderr,
      flush=True,
    )
    return signal_exit_status(signum)
  finally:
    for signum, handler in previous.items():
      if handler is not None:  # None: not installed from Python.
        signal.signal(signum, handler)


def run() -> None:
  """Console-script entry point: `trax-revplus ...`.

  A command that ends while programs still compile on helper threads (a
  signal while planning) leaves at once, its output flushed, without
  Python's finalization: it would wait for the compiler, or abort the
  process when stopping a thread inside it.
  """
  code = main(sys.argv)
  threads = sys.modules.get('trax_revplus.device_memory.compile_threads')
  if threads is not None and threads.compiles_in_flight():
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # pylint: disable=protected-access
  sys.exit(code)
