"""Importing trax 1.4.1 without its import-time stack walks.

trax's `@assert_shape` decorator (`trax/layers/assert_shape.py`) runs once
per decorated layer while trax's modules are imported, and each run calls
`inspect.stack()` only to name its caller's file and line. `inspect.stack()`
reads the source context of every frame on the stack; an import's stack is
deep and half of it is frozen `importlib` frames, for which `inspect` looks
the module up by scanning `sys.modules` (thousands of TensorFlow modules).
That is most of trax's import time: about 20 of 25 CPU-seconds.

`import_trax` imports trax with `inspect.stack` answering as
`inspect.stack(context=0)` does (frame, file, line and function, no source
lines), computed from the frames alone. trax's decorator reads only
`inspect.stack()[1][0]`, the caller's frame, so the layers it builds are the
same, messages included. Outside the import, `inspect.stack` is Python's.
"""

import contextlib
import inspect
import sys
import types
from typing import Iterator


def frames_without_source(context: int = 1) -> list[inspect.FrameInfo]:
  """The caller's stack, as `inspect.stack(context=0)` returns it.

  Args:
    context: Accepted for `inspect.stack`'s signature and not read: no
      source lines are returned.

  Returns:
    One `inspect.FrameInfo` per frame, innermost (the caller) first, with
    `filename` the code's `co_filename`, `lineno` the frame's current line,
    and `code_context`, `index` (and on Python 3.11+ `positions`) None.
  """
  del context
  frames = []
  frame: types.FrameType | None = sys._getframe(1)  # pylint: disable=protected-access
  while frame is not None:
    frames.append(inspect.FrameInfo(frame, frame.f_code.co_filename,
                                    frame.f_lineno, frame.f_code.co_name,
                                    None, None))
    frame = frame.f_back
  return frames


@contextlib.contextmanager
def stack_without_source() -> Iterator[None]:
  """Within the block, `inspect.stack` is `frames_without_source`."""
  saved = inspect.stack
  inspect.stack = frames_without_source
  try:
    yield
  finally:
    inspect.stack = saved


def import_trax() -> None:
  """Imports trax (and TensorFlow, which it imports) if not imported yet.

  Raises:
    ImportError: trax or one of its dependencies cannot be imported.
  """
  if 'trax' in sys.modules:
    return
  with stack_without_source():
    import trax  # noqa: F401  # pylint: disable=g-import-not-at-top,unused-import
