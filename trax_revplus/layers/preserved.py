"""Tracing trax layers outside their own call, leaving them as found.

trax's `Layer.pure_fn` sets a layer's weights, state and RNG (and, through
the setters, every sublayer's) to its arguments while it runs, and puts the
old ones back only when the forward returns: an exception raised inside it
leaves the tracers of a `jax.eval_shape` or `jit` trace in the layer tree.
Where the trainer keeps its host weights in the layers themselves, the next
step then reads a leaked tracer (`jax.errors.UnexpectedTracerError`).
"""

import contextlib
from typing import Iterator

from trax import layers as tl


def _tree(layers):
  """Every layer of `layers`' trees once (a shared sublayer appears once)."""
  seen = {}
  todo = list(layers)
  while todo:
    layer = todo.pop()
    if id(layer) in seen:
      continue
    seen[id(layer)] = layer
    todo.extend(layer.sublayers or ())
  return list(seen.values())


@contextlib.contextmanager
def preserved(*layers: tl.Layer) -> Iterator[None]:
  """Restores every attribute of `layers` and of all their sublayers on exit.

  Each layer's attributes are put back exactly (the same objects), whether
  the body returned or raised, so a trace that fails half-way through a
  layer leaves no tracer behind.

  Args:
    *layers: trax layers (`tl.Layer`) about to be traced or called.

  Yields:
    None.
  """
  saved = [(layer, dict(vars(layer))) for layer in _tree(layers)]
  try:
    yield
  finally:
    for layer, attributes in saved:
      current = vars(layer)
      current.clear()
      current.update(attributes)
