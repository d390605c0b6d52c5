"""Cotangents of stack items, as trax's reversible layers pass them.

The cotangent of an int/bool stack item (token ids, masks) is an array of
dtype `jax.float0` under JAX and None under trax's TFNP backend; neither is
ever added to anything.
"""

import jax

from trax_revplus.typing import Array


def is_float0_or_none(x: Array | None) -> bool:
  # `None` is the TFNP backend's cotangent of an int/bool value; JAX uses an
  # array of dtype float0. Either way there is nothing to add.
  return x is None or getattr(x, 'dtype', None) == jax.float0


def add_cotangents(x: Array | None, y: Array | None) -> Array | None:
  """Adds two cotangents, ignoring those of int/bool values (float0/None)."""
  if is_float0_or_none(x):
    return y
  if is_float0_or_none(y):
    return x
  assert x is not None and y is not None  # is_float0_or_none was False.
  return x + y
