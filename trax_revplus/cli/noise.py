"""Third-party warnings known to be harmless: train.log only, not the terminal.

`KNOWN_NOISE` is the one list of them, each with the reason it is safe to
keep off the terminal. `train` routes Python warnings (`warnings.warn`)
through logging for the length of a run (`route_warnings`): every warning
goes to `<output_dir>/train.log`; on the terminal, only warnings not in the
list, each on one line. Notices that TensorFlow and gym print on stderr
while trax is imported never reach the terminal
(`gin_config.import_trax_quietly` captures them for the log), so their
entries here document them.
"""

import contextlib
import dataclasses
import logging as std_logging
import re
from typing import Iterator


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
        r'jax\.process_count has been renamed',
        'JAX (DeprecationWarning / UserWarning), each time trax 1.4.1 calls '
        'the old alias, e.g. when a Loop is built or a checkpoint saved',
        'trax calls a JAX name JAX has renamed; the alias still returns the '
        'same value.'),
    KnownNoise(
        r'backend and device argument on jit is deprecated',
        'JAX (DeprecationWarning), when stock trax 1.4.1 runs '
        '(--implementation=stock): its Loop evaluates through '
        'jit(..., backend=...)',
        'stock trax calls a JAX argument JAX has deprecated; with '
        'trax_revplus active that call is replaced (compat.accelerate).'),
    KnownNoise(
        r'GzipFile was opened for writing, but this will change',
        'Python (FutureWarning), from trax.layers.np_to_file and '
        'trax.supervised.training.pickle_to_file at every checkpoint save',
        'trax opens gzip.GzipFile(fileobj=...) without mode=; the files '
        'written are the same, and trax_revplus verifies them.'),
    KnownNoise(
        r'Some donated buffers were not usable',
        'JAX (UserWarning), when a jitted trax function donates inputs that '
        'no output can reuse',
        'a memory saving not taken, reported by the memory log where it '
        'matters; results are unaffected.'),
    KnownNoise(
        r'Gym has been unmaintained|Please upgrade to Gymnasium|Users of this '
        r'version of Gym|migration guide at https://gymnasium',
        'gym, on stderr while trax (trax.rl) is imported',
        'trax imports gym for its RL code; training supervised models never '
        'uses it.'),
    KnownNoise(
        r'Could not find cuda drivers',
        'TensorFlow, on stderr while trax is imported',
        'TensorFlow looks for a GPU for itself; JAX, not TensorFlow, places '
        'the computation, and its devices are in the summary.'),
    KnownNoise(
        r'oneDNN custom operations are on|All log messages before '
        r'absl::InitializeLog\(\) is called',
        'TensorFlow, on stderr while trax is imported',
        "TensorFlow's start-up notices about its own CPU kernels and logging;"
        ' trax_revplus runs no TensorFlow kernels.'),
)

_KNOWN = re.compile('|'.join(f'(?:{n.pattern})' for n in KNOWN_NOISE))


def is_known_noise(message: str) -> bool:
  """Whether `message` is one of `KNOWN_NOISE`."""
  return bool(_KNOWN.search(message))


class DropKnownNoise(std_logging.Filter):
  """A logging filter that drops records whose message is known noise."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    return not is_known_noise(record.getMessage())


class OneLineWarning(std_logging.Formatter):
  """Formats a captured Python warning as one line.

  `warnings.formatwarning` gives `path:line: Category: message` and then
  the source line; the terminal gets `warning: Category: message (path:line)`.
  """

  def format(self, record: std_logging.LogRecord) -> str:
    text = record.getMessage().strip().splitlines()
    first = text[0] if text else ''
    match = re.match(r'^(.*?):(\d+): (\w+): (.*)$', first)
    if match:
      path, line, category, message = match.groups()
      return f'warning: {category}: {message} ({path}:{line})'
    return f'warning: {first}'


@contextlib.contextmanager
def route_warnings(log_handler: std_logging.Handler,
                   terminal: std_logging.Handler) -> Iterator[None]:
  """Routes Python warnings to `log_handler`, and the unknown to `terminal`.

  While entered, `warnings.warn` goes through logging
  (`logging.captureWarnings`) to the 'py.warnings' logger, whose records
  reach `log_handler` (all of them) and `terminal` (one line each, known
  noise dropped) only.

  Args:
    log_handler: e.g. the handler writing train.log.
    terminal: a handler writing to stderr, for this logger alone (its filter
      and formatter are set here).
  """
  terminal.addFilter(DropKnownNoise())
  terminal.setFormatter(OneLineWarning())
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
