"""Where the lines of a `train` run go: its log file, the terminal.

The run's full log (absl at INFO, trax's metrics included) goes to
`<output_dir>/train.log` (one file per process in a multi-process run);
the terminal gets warnings only, without the third-party ones known to be
harmless (`noise`), since trax prints its own progress and eval lines
there (less the lines of its own known to be noise, which its log
keeps); the library's notices (`trax_revplus.notices`, e.g. a setting the
device memory budget replaced) are the command's warning lines. A
background thread that dies is one warning line, its traceback in the log.
"""

import contextlib
import logging as std_logging
import os
import sys
import threading
from typing import Any, Iterator

from absl import logging

from trax_revplus import notices
from trax_revplus.cli import noise
from trax_revplus.cli.messages import warning_line
from trax_revplus.multiprocess import training as processes

# The command whose lines these are.
_COMMAND = 'train'


class ThreadErrors:
  """Reports an exception that ends a background thread in one line.

  trax's TensorBoard writers write on a thread of their own; when the disk
  fills up, that thread dies with a traceback before the Loop sees the error
  at its next write. The traceback goes to the log instead.
  """

  def __init__(self):
    self._saved: Any = None

  def __enter__(self) -> 'ThreadErrors':
    self._saved = threading.excepthook
    threading.excepthook = self._report
    return self

  def __exit__(self, *exc_info) -> None:
    threading.excepthook = self._saved

  @staticmethod
  def _report(args: threading.ExceptHookArgs) -> None:
    name = args.thread.name if args.thread is not None else 'a thread'
    exc_info: Any = (args.exc_type, args.exc_value, args.exc_traceback)
    logging.info('thread %s stopped', name, exc_info=exc_info)
    print(
      warning_line(
        _COMMAND,
        f'background thread {name} stopped: '
        f'{args.exc_type.__name__}: '
        f'{args.exc_value}',
      ),
      file=sys.stderr,
      flush=True,
    )


def _print_notice(message: str) -> None:
  """A library notice (`trax_revplus.notices`) as the command's warning
  line; its sender logged it to train.log."""
  print(warning_line(_COMMAND, message), file=sys.stderr, flush=True)


def _print_progress(line: str) -> None:
  """A library progress line (`trax_revplus.notices.progress`, e.g. the
  plan being weighed before the first step) on stdout, beside the step
  lines, and in train.log."""
  logging.info('%s', line)
  print(line, flush=True)


def _drop(message: str) -> None:
  """Processes other than 0 leave notices to process 0's terminal."""
  del message


@contextlib.contextmanager
def run_logging(
  output_dir: str,
  import_messages: str,
  process: int | None = None,
  warnings: tuple[str, ...] = (),
) -> Iterator[str]:
  """Full log to output_dir/train.log; the plugin's warnings on stderr.

  In a multi-process run (`process` not None) each process logs to its own
  file (`training.log_file_name`), every line marked with its index.

  Yields:
    The path of the log file.
  """
  verbosity = logging.get_verbosity()
  logging.set_verbosity(logging.INFO)
  absl_logger = logging.get_absl_logger()
  log_path = os.path.join(output_dir, processes.log_file_name(process or 0))
  to_file = std_logging.FileHandler(log_path)
  to_file.setLevel(std_logging.INFO)
  to_stderr = std_logging.StreamHandler(sys.stderr)
  to_stderr.setLevel(std_logging.WARNING)
  to_stderr.addFilter(noise.DropKnownNoise())
  formatters: tuple[std_logging.Formatter, std_logging.Formatter] = (
    logging.PythonFormatter(),
    noise.CommandLine(_COMMAND),
  )
  handlers: tuple[std_logging.Handler, std_logging.Handler] = (
    to_file,
    to_stderr,
  )
  for handler, formatter in zip(handlers, formatters):
    handler.setFormatter(
      formatter
      if process is None
      else processes.ProcessFormatter(formatter, process)
    )
    absl_logger.addHandler(handler)
  # trax logs every metric at INFO; keep those out of the terminal (where
  # trax also prints the eval lines) and out of the root logger's handlers.
  absl_logger.propagate = False
  warnings_to_stderr = std_logging.StreamHandler(sys.stderr)
  try:
    if import_messages.strip():
      logging.info(
        'Messages printed on stderr while importing trax:\n%s', import_messages
      )
    for warning in warnings:  # Shown on the terminal already.
      logging.info('warning: %s', warning)
    with (
      noise.route_warnings(
        to_file,
        warnings_to_stderr,
        noise.CommandLine(_COMMAND, python_warning=True),
      ),
      ThreadErrors(),
      notices.listening(_print_notice if not process else _drop),
      notices.showing_progress(_print_progress if not process else _drop),
      noise.stdout_without_noise(),
    ):
      yield log_path
  finally:
    absl_logger.propagate = True
    for handler in (to_file, to_stderr):
      absl_logger.removeHandler(handler)
      handler.close()
    # What is logged at INFO after the run (e.g. by a memory log closed at
    # exit) would otherwise reach the terminal after the run's last line.
    logging.set_verbosity(verbosity)
