"""trax_import: trax imported without its stack walks, with the same layers."""

import inspect

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
    assert (a.filename, a.lineno, a.function) == (b.filename, b.lineno,
                                                  b.function)
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
