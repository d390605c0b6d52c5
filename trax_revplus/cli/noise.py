"""Third-party warnings known to be harmless: train.log only, not the terminal.

`KNOWN_NOISE` is the one list of them, each with the reason it is safe to
keep off the terminal. `train` routes Python warnings (`warnings.warn`)
through logging for the length of a run (`route_warnings`): every warning
goes to `<output_dir>/train.log`; on the terminal, only warnings not in the
list, each on one line. Lines trax prints on stdout that it also logs
(its `training._log`) leave the terminal when they are in the list
(`stdout_without_noise`). Notices that TensorFlow and gym print on stderr
while trax is imported never reach the terminal
(`gin_config.import_trax_quietly` captures them for the log), so their
entries here document them.
"""

import contextlib
import dataclasses
import io
import logging as std_logging
import re
import sys
import threading
from typing import Iterator, TextIO

from trax_revplus.cli import messages


@dataclasses.dataclass(frozen=True)
class KnownNoise:
  """A harmless third-party message.

  Attributes:
    pattern: regular expression searched in the message.
    source: who prints it, and when.
    reason: why it does not concern a trax_revplus user.
  """

  pattern: str
  source: str
  reason: str


KNOWN_NOISE = (
  KnownNoise(
    r'Did not save checkpoint as we are not chief',
    "trax 1.4.1's Loop (its `_log`, on stdout), in every process of a "
    'multi-process run but process 0, at each checkpoint step',
    'process 0 saves the checkpoint for the run; the others have nothing '
    'to save.',
  ),
  KnownNoise(
    r'jax\.process_count has been renamed',
    'JAX (DeprecationWarning / UserWarning), each time trax 1.4.1 calls '
    'the old alias, e.g. when a Loop is built or a checkpoint saved',
    'trax calls a JAX name JAX has renamed; the alias still returns the '
    'same value.',
  ),
  KnownNoise(
    r'backend and device argument on jit is deprecated',
    'JAX (DeprecationWarning), when stock trax 1.4.1 runs '
    '(--implementation=stock): its Loop evaluates through '
    'jit(..., backend=...)',
    'stock trax calls a JAX argument JAX has deprecated; with '
    'trax_revplus active that call is replaced (compat.accelerate).',
  ),
  KnownNoise(
    r'GzipFile was opened for writing, but this will change',
    'Python (FutureWarning), from trax.layers.np_to_file and '
    'trax.supervised.training.pickle_to_file at every checkpoint save',
    'trax opens gzip.GzipFile(fileobj=...) without mode=; the files '
    'written are the same, and trax_revplus verifies them.',
  ),
  KnownNoise(
    r'Some donated buffers were not usable',
    'JAX (UserWarning), when a jitted trax function donates inputs that '
    'no output can reuse',
    'a memory saving not taken, reported by the memory log where it '
    'matters; results are unaffected.',
  ),
  KnownNoise(
    r'Gym has been unmaintained|Please upgrade to Gymnasium|Users of this '
    r'version of Gym|migration guide at https://gymnasium',
    'gym, on stderr while trax (trax.rl) is imported',
    'trax imports gym for its RL code; training supervised models never '
    'uses it.',
  ),
  KnownNoise(
    r'Could not find cuda drivers',
    'TensorFlow, on stderr while trax is imported',
    'TensorFlow looks for a GPU for itself; JAX, not TensorFlow, places '
    'the computation, and its devices are in the summary.',
  ),
  KnownNoise(
    r'oneDNN custom operations are on|All log messages before '
    r'absl::InitializeLog\(\) is called',
    'TensorFlow, on stderr while trax is imported',
    "TensorFlow's start-up notices about its own CPU kernels and logging;"
    ' trax_revplus runs no TensorFlow kernels.',
  ),
  KnownNoise(
    r'^Did not manage to match shapes in model for all checkpoint '
    r'weights\.$|^  (?:Not inserted|Inserted) tensor of shape \(|'
    r'^  Tensor in that place has shape: \(',
    "trax (stdout, and its log), when a checkpoint's weights do not fit "
    'the model that loads it: one line per weight of the model, '
    'hundreds on a large one',
    'the run stops with one line saying that the checkpoint does not fit '
    'the model and what to do; train.log keeps the lines.',
  ),
)

_KNOWN = re.compile('|'.join(f'(?:{n.pattern})' for n in KNOWN_NOISE))


def is_known_noise(message: str) -> bool:
  """Whether `message` is one of `KNOWN_NOISE`."""
  return bool(_KNOWN.search(message))


class DropKnownNoise(std_logging.Filter):
  """A logging filter that drops records whose message is known noise."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    return not is_known_noise(record.getMessage())


def one_line_warning(record: std_logging.LogRecord) -> str:
  """A captured Python warning as one line, `Category: message (path:line)`.

  `warnings.formatwarning` gives `path:line: Category: message` and then
  the source line.
  """
  text = record.getMessage().strip().splitlines()
  first = text[0] if text else ''
  match = re.match(r'^(.*?):(\d+): (\w+): (.*)$', first)
  if match:
    path, line, category, message = match.groups()
    return f'{category}: {message} ({path}:{line})'
  return first


class OneLineWarning(std_logging.Formatter):
  """Formats a captured Python warning as `warning: ` and one line
  (`one_line_warning`)."""

  def format(self, record: std_logging.LogRecord) -> str:
    return f'warning: {one_line_warning(record)}'


class CommandLine(std_logging.Formatter):
  """A record on the terminal as the command's own line, one line:
  `trax-revplus <command>: warning: <message>` (`error:` at ERROR and
  above); a captured Python warning's message as `one_line_warning` puts
  it."""

  def __init__(self, command: str, python_warning: bool = False):
    """Args:
    command: str, the command's name, e.g. 'train'.
    python_warning: bool, the records are captured Python warnings.
    """
    super().__init__()
    self._command = command
    self._python_warning = python_warning

  def format(self, record: std_logging.LogRecord) -> str:
    if self._python_warning:
      return messages.warning_line(self._command, one_line_warning(record))
    if record.levelno >= std_logging.ERROR:
      return messages.error_line(self._command, record.getMessage())
    return messages.warning_line(self._command, record.getMessage())


@contextlib.contextmanager
def route_warnings(
  log_handler: std_logging.Handler,
  terminal: std_logging.Handler,
  formatter: std_logging.Formatter | None = None,
) -> Iterator[None]:
  """Routes Python warnings to `log_handler`, and the unknown to `terminal`.

  While entered, `warnings.warn` goes through logging
  (`logging.captureWarnings`) to the 'py.warnings' logger, whose records
  reach `log_handler` (all of them) and `terminal` (one line each, known
  noise dropped) only.

  Args:
    log_handler: e.g. the handler writing train.log.
    terminal: a handler writing to stderr, for this logger alone (its filter
      and formatter are set here).
    formatter: the terminal's one-line format; `OneLineWarning` if None.
  """
  terminal.addFilter(DropKnownNoise())
  terminal.setFormatter(formatter or OneLineWarning())
  logger = std_logging.getLogger('py.warnings')
  saved = (logger.propagate, logger.level)
  logger.propagate = False
  logger.setLevel(std_logging.WARNING)
  logger.addHandler(log_handler)
  logger.addHandler(terminal)
  std_logging.captureWarnings(True)
  try:
    yield
  finally:
    std_logging.captureWarnings(False)
    logger.removeHandler(log_handler)
    logger.removeHandler(terminal)
    logger.propagate, level = saved
    logger.setLevel(level)


class _LinesWithoutNoise(io.TextIOBase):
  """A text stream writing to `stream` the lines it gets, less known noise.

  A line is held until it ends (trax's `print` writes a line and its
  newline apart); `flush` passes on a line not ended yet.
  """

  def __init__(self, stream: TextIO):
    super().__init__()
    self._stream = stream
    self._pending = ''
    self._lock = threading.Lock()

  def writable(self) -> bool:
    return True

  def write(self, text: str) -> int:
    with self._lock:
      lines = (self._pending + text).split('\n')
      self._pending = lines.pop()
      kept = [line + '\n' for line in lines if not is_known_noise(line)]
      if kept:
        self._stream.write(''.join(kept))
    return len(text)

  def flush(self) -> None:
    with self._lock:
      if self._pending:
        if not is_known_noise(self._pending):
          self._stream.write(self._pending)
        self._pending = ''
      self._stream.flush()

  # What callers may ask of sys.stdout, as the stream it wraps answers.

  def isatty(self) -> bool:
    return self._stream.isatty()

  def fileno(self) -> int:
    return self._stream.fileno()

  @property
  def encoding(self) -> str | None:  # type: ignore[override]  # read-only
    return getattr(self._stream, 'encoding', None)


@contextlib.contextmanager
def stdout_without_noise() -> Iterator[None]:
  """Keeps the known-noise lines written to `sys.stdout` off it meanwhile.

  For lines that reach the log too (trax's `_log` logs what it prints).
  """
  stream = sys.stdout
  sys.stdout = filtered = _LinesWithoutNoise(stream)
  try:
    yield
  finally:
    filtered.flush()
    if sys.stdout is filtered:
      sys.stdout = stream
