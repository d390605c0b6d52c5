"""trax and JAX imported lazily, in one place; trax without its stack walks.

Some processes must not import trax or JAX at all: `import trax_revplus`
(tests/test_public_api.py), and the `trax-revplus` command until a command
runs (it answers --help and mistakes in flags at once; trax's import takes
seconds of CPU). None of the parents of `compare` and `launch` may open
JAX's backend (`trax_revplus.backend`). The modules
those processes load, and which use trax or JAX later in their functions,
get them here, never with an `import` inside a function
(tests/test_imports.py):

  JAX      this module's attributes `jax`, `multihost_utils` and
           `compilation_cache` (`_LAZY_JAX`), each imported on its first
           read (`__getattr__`): `jax = trax_import.jax` in a function.
           mypy reads them as the modules themselves (imported here under
           `typing.TYPE_CHECKING`), so their uses are type checked; a JAX
           module not among them is added there, not read through
           `module`.
  trax     `module('trax...')`, which imports trax by `import_trax`. trax
           ships no types, so an attribute would tell mypy nothing more.

Modules only ever loaded after trax import trax and JAX at their top.

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
import importlib
import inspect
import sys
import types
import typing
from typing import Any, Iterator

if typing.TYPE_CHECKING:
  # What mypy reads for the lazy attributes of `_LAZY_JAX`; at run time
  # `__getattr__` imports each on its first read.
  import jax as jax
  from jax.experimental import multihost_utils as multihost_utils
  from jax.experimental.compilation_cache import (
    compilation_cache as compilation_cache,
  )


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
    frames.append(
      inspect.FrameInfo(
        frame,
        frame.f_code.co_filename,
        frame.f_lineno,
        frame.f_code.co_name,
        None,
        None,
      )
    )
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
    importlib.import_module('trax')


# The packages whose modules `module` imports.
_LAZY_PACKAGES = ('jax', 'trax')
# This module's lazy attributes: name -> the JAX module `__getattr__`
# imports (the same names are imported under `typing.TYPE_CHECKING`).
_LAZY_JAX = {
  'jax': 'jax',
  'multihost_utils': 'jax.experimental.multihost_utils',
  'compilation_cache': 'jax.experimental.compilation_cache.compilation_cache',
}


def __getattr__(name: str) -> Any:
  """The JAX module `_LAZY_JAX[name]`, imported now if it is not yet (a
  module attribute read, PEP 562: `trax_import.jax`).

  Raises:
    AttributeError: `name` is not one of `_LAZY_JAX`.
    ImportError: the module or one of its dependencies cannot be imported.
  """
  if name not in _LAZY_JAX:
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
  return importlib.import_module(_LAZY_JAX[name])


def module(name: str) -> types.ModuleType:
  """trax's or JAX's module `name`, imported now if it is not yet.

  A JAX module a function uses is read as this module's attribute instead
  (`_LAZY_JAX`: typed); `module` takes JAX's names for a name known only
  at run time (e.g. a config's configurables).

  Args:
    name: a module of trax or JAX, e.g. 'trax.supervised.training' or
      'jax.experimental.multihost_utils'. trax's modules are imported after
      `import_trax`.

  Returns:
    The module.

  Raises:
    ValueError: `name` is not a module of trax or JAX.
    ImportError: the module or one of its dependencies cannot be imported.
  """
  if name.partition('.')[0] not in _LAZY_PACKAGES:
    raise ValueError(f'{name} is not a module of trax or JAX')
  if name.partition('.')[0] == 'trax':
    import_trax()
  return importlib.import_module(name)
