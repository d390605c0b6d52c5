"""Layer state whose shape trax's layers change at their first call.

Some trax layers return their state in another shape than they initialized
it: trax 1.4.1's `ConcatWithPadding`, `ConcatWithPadding2` and
`StripFromConcatenateWithPadding` (trax.models.research.transformer2, in
every `ConfigurableTerraformer`) initialize an int32 scalar and return it
as shape (1,) from their first forward on, in every mode (the reshape marks
"first call done" for predict mode). Handed back as trax returns it, such
state gives every program that takes it a new argument shape at step 2 (a
second compile), and a checkpoint written after a step no longer fits a
freshly initialized model (trax's loader then drops the whole model state).

`conformed` keeps a leaf in the shape the model holds it in where the
layer's new value differs from it only by axes of size 1; `differs_by_unit_axes`
is that test; `named_leaves` names a state's flat leaves by the layer that
holds each, for messages.
"""

from typing import Any, Sequence

import jax
import numpy as np
from trax import fastmath


def _shape(x: Any) -> tuple[int, ...] | None:
  shape = getattr(x, 'shape', None)
  return None if shape is None else tuple(shape)


def differs_by_unit_axes(shape: Sequence[int], other: Sequence[int]) -> bool:
  """Whether two shapes differ, but only by axes of size 1 (e.g. () and
  (1,), or (3,) and (1, 3)): the same values in the same order."""
  shape, other = tuple(shape), tuple(other)
  if shape == other:
    return False
  return tuple(d for d in shape if d != 1) == tuple(d for d in other if d != 1)


def conformed(new_state: Any, state: Any) -> Any:
  """`new_state` with each leaf that differs from `state`'s leaf at its
  place only by axes of size 1 reshaped to that leaf's shape.

  Args:
    new_state: a layer's state as its forward returned it (host or device
      arrays).
    state: the state the layer holds (its shapes are kept).

  Returns:
    `new_state`, reshaped leaves replaced; `new_state` itself where no leaf
    needs it or the two trees differ in structure.
  """
  new_leaves, treedef = jax.tree_util.tree_flatten(new_state)
  leaves, other_treedef = jax.tree_util.tree_flatten(state)
  # jaxlib ships no stub of PyTreeDef: mypy knows no comparison of it.
  if treedef != other_treedef:  # type: ignore[operator]
    return new_state
  changed = False
  out = []
  for new, old in zip(new_leaves, leaves):
    new_shape, old_shape = _shape(new), _shape(old)
    if (
      new_shape is not None
      and old_shape is not None
      and differs_by_unit_axes(new_shape, old_shape)
    ):
      new = new.reshape(old_shape)
      changed = True
    out.append(new)
  return jax.tree_util.tree_unflatten(treedef, out) if changed else new_state


def _names(layer: Any, state: Any, prefix: str) -> list[str]:
  """One name per flat leaf of `state`, `layer`'s state."""
  sublayers: list[Any] = list(getattr(layer, 'sublayers', None) or ())
  one_each = isinstance(state, (tuple, list)) and len(state) == len(sublayers)
  if len(sublayers) == 1 and not one_each:
    # A wrapper holding its one sublayer's state as its own (trax's
    # `Accelerate`).
    return _names(sublayers[0], state, prefix)
  if sublayers and isinstance(state, (tuple, list)):
    if len(state) == len(sublayers):
      names = []
      for k, (sub, sub_state) in enumerate(zip(sublayers, state)):
        names += _names(sub, sub_state, f'{prefix}[{k}]')
      return names
  n_leaves = len(fastmath.tree_flatten(state))
  name = getattr(layer, 'name', type(layer).__name__)
  return [f'{name} at {prefix or "the model"}'] * n_leaves


def named_leaves(layer: Any, state: Any) -> list[tuple[str, Any]]:
  """`state`'s flat leaves, as trax flattens a state for its checkpoints
  (`fastmath.tree_flatten`: dicts by their values' order, None a leaf),
  each with the name of the layer holding it and its place in `layer`.

  Args:
    layer: a trax layer (e.g. the Loop's model), or a list of layers whose
      states `state` lists in order.
    state: that layer's state (or that list of states).

  Returns:
    List of (name, leaf): name e.g. 'ConcatWithPadding at [0][6]', the
    sublayer indices from `layer` down.
  """
  if isinstance(layer, (list, tuple)):
    names: list[str] = []
    for k, (one, one_state) in enumerate(zip(layer, state)):
      names += _names(one, one_state, f'layer {k}')
    leaves = fastmath.tree_flatten(list(state))
  else:
    names = _names(layer, state, '')
    leaves = fastmath.tree_flatten(state)
  if len(names) != len(leaves):  # A layer keeping state apart from sublayers.
    names = [f'state leaf {k}' for k in range(len(leaves))]
  return list(zip(names, leaves))


def signature(x: Any) -> str:
  """'int32[1]' for an array leaf (its dtype and shape), else its type."""
  shape = _shape(x)
  if shape is None:
    return type(x).__name__
  return f'{np.dtype(x.dtype).name}{list(shape)}'
