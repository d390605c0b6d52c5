"""A checkpoint loaded into the structure it was saved from.

trax's `Loop.load_checkpoint` puts the checkpoint's flat weights and state
(the model's, as `tl.flatten_weights_and_state` flattened them when
saving) back into the structure `weights_and_state_signature` gives, an
abstract initialization of the whole model. Where one layer object stands
at two places (trax's encoder-decoder `Reformer` embeds inputs and targets
with the same `Embedding`, `Dropout` and `PositionalEncoding`), that
signature marks the second place "from cache", while the Loop's model, as
its trainer initialized it, holds the layer's weights and state at both,
and saved both: the signature has one slot fewer, every array after it
lands one layer late, and the eval model's first call fails (`vmap got
inconsistent sizes`). The model's own weights and state before the load
have the structure the checkpoint was flattened from (the same model,
built the same way): `own_structure` makes the load use it.
"""

import contextlib
from typing import Any, Iterator

from trax import fastmath
from trax import shapes
from trax.supervised import training


def _signature(leaf: Any) -> Any:
  """An array's `ShapeDtype`; anything else (trax's markers) as it is."""
  if hasattr(leaf, 'shape') and hasattr(leaf, 'dtype'):
    return shapes.ShapeDtype(leaf.shape, leaf.dtype)
  return leaf


@contextlib.contextmanager
def own_structure(loop: training.Loop) -> Iterator[None]:
  """Meanwhile, the Loop's model gives its weights' and state's structure
  as it holds them as its `weights_and_state_signature` (what trax's
  `load_checkpoint` unflattens the checkpoint into)."""
  model = loop.model
  signature = fastmath.nested_map(_signature, (model.weights, model.state))

  def weights_and_state_signature(input_signature, unsafe=False):
    del input_signature, unsafe
    return signature

  # On this instance alone; a trax layer refuses public attributes through
  # its own __setattr__.
  object.__setattr__(
    model, 'weights_and_state_signature', weights_and_state_signature
  )
  try:
    yield
  finally:
    object.__delattr__(model, 'weights_and_state_signature')
