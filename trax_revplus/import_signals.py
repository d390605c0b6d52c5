"""SIGINT and SIGTERM that arrive while trax is imported act once it is.

Our handlers stop a command by raising an exception from the handler.
Raised in the middle of an import, that exception unwinds through the
module initialization of C extensions (TensorFlow's, jaxlib's, protobuf's)
that do not expect to fail half way, and the process can die of a
segmentation fault instead of printing its one line. Inside
`signals_wait_for_imports()` a handler that calls `defer(signum)` first
records the signal and returns; when the block ends, the signal is raised
again (`signal.raise_signal`), so that the handler then in place acts on it
as it would have. A second signal during the block is not deferred: asked
twice, a command stops at once, and the first is not raised again.

Only the standard library is imported here: the command line installs its
handlers before anything heavy is imported.
"""

import contextlib
import signal
import threading
from typing import Iterator

_state = threading.local()


def defer(signum: int) -> bool:
  """Records `signum` for the end of the block, if one is running.

  Called first thing by a signal handler.

  Args:
    signum: int, the signal the handler received.

  Returns:
    True if the signal was recorded and the handler should return without
    acting; False outside `signals_wait_for_imports()` and for a second
    signal inside it.
  """
  if not getattr(_state, 'active', False):
    return False
  if _state.pending is not None:
    # Asked twice: the handler acts now, and nothing is left to raise.
    _state.pending = None
    _state.active = False
    return False
  _state.pending = signum
  return True


@contextlib.contextmanager
def signals_wait_for_imports() -> Iterator[None]:
  """Within the block, handlers that call `defer` wait until it ends.

  Enter it around an import of trax (or of anything that imports
  TensorFlow or JAX), in the main thread. Not reentrant: an inner block
  acts as part of the outer one.

  Yields:
    None. A signal deferred during the block is raised again when the
    block ends, whether it ended normally or with an exception (the
    handler's own exception then replaces the block's).
  """
  if getattr(_state, 'entered', False):
    yield
    return
  _state.entered, _state.active, _state.pending = True, True, None
  try:
    yield
  finally:
    pending = _state.pending
    _state.entered, _state.active, _state.pending = False, False, None
    if pending is not None:
      signal.raise_signal(pending)
