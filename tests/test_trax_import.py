"""trax_import: trax imported without its stack walks, with the same layers."""

import inspect
import subprocess
import sys

import pytest
from trax import layers as tl

from trax_revplus import trax_import


def _both_stacks():
  # One line, so that both see this frame at the same line.
  return trax_import.frames_without_source(), inspect.stack(context=0)


def test_frames_match_inspect_stack_without_source_lines():
  ours, python = _both_stacks()
  assert len(ours) == len(python) > 2
  for a, b in zip(ours, python):
    assert a.frame is b.frame
    assert (a.filename, a.lineno, a.function) == (
      b.filename,
      b.lineno,
      b.function,
    )
    assert a.code_context is None and a.index is None
  assert ours[0].function == '_both_stacks'


def _decorated_layer_message():
  @tl.assert_shape('ab->ab')
  def make():
    return tl.Relu()

  return make().sublayers[0]._message  # pylint: disable=protected-access


def test_assert_shape_messages_are_trax_own():
  python = _decorated_layer_message()
  with trax_import.stack_without_source():
    ours = _decorated_layer_message()
  assert ours == python
  assert python.startswith(f'Defined at {__file__}:')


def test_inspect_stack_is_restored_after_the_block_even_on_error():
  saved = inspect.stack
  with pytest.raises(RuntimeError):
    with trax_import.stack_without_source():
      assert inspect.stack is trax_import.frames_without_source
      raise RuntimeError('stop')
  assert inspect.stack is saved


def test_module_imports_trax_and_jax_modules_only():
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  from trax.supervised import callbacks  # pylint: disable=g-import-not-at-top

  assert (
    trax_import.module('jax.experimental.multihost_utils') is multihost_utils
  )
  assert trax_import.module('trax.supervised.callbacks') is callbacks
  for name in ('numpy', 'trax_revplus.swap', 'jaxtyping'):
    with pytest.raises(ValueError, match=name):
      trax_import.module(name)


def test_jax_attributes_are_the_modules_imported_on_first_read():
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  from jax.experimental.compilation_cache import compilation_cache  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top

  assert trax_import.jax is jax
  assert trax_import.multihost_utils is multihost_utils
  assert trax_import.compilation_cache is compilation_cache
  assert not hasattr(trax_import, 'numpy')
  code = (
    'import sys; from trax_revplus import trax_import; '
    "assert 'jax' not in sys.modules; "
    'jax = trax_import.jax; '
    "assert sys.modules['jax'] is jax"
  )
  subprocess.run([sys.executable, '-c', code], check=True)


def test_module_imports_trax_without_stack_walks():
  code = (
    'import inspect, sys; from trax_revplus import trax_import; '
    'calls = []; stack = inspect.stack; '
    'inspect.stack = lambda *a: calls.append(1) or stack(*a); '
    "trax_import.module('trax.layers'); "
    "assert 'trax' in sys.modules and not calls, len(calls)"
  )
  subprocess.run([sys.executable, '-c', code], check=True)
