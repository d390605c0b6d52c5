"""How a call's rows and its layers' states split into batch slices.

`state_rows` says how each leaf of a layer's state splits with the rows
(the rules in `slices`' docstring); `Rows` and `States` split a call's
per-row arrays and states into k slices for `lax.scan` and put the
slices' new states back together. Separate from `slices`, which builds the
sliced step functions, because the loss program, micro-batches and the
evaluation split rows and states by the same rules.
"""

from typing import Any, Sequence

import jax
from jax import numpy as jnp
import numpy as np
from trax import layers as tl

from trax_revplus.trainer._step.slice_loop import FLOAT0
from trax_revplus.trainer._step.slice_loop import is_float0
from trax_revplus.trainer._step.slice_loop import merge
from trax_revplus.trax_door import layers as layer_door
from trax_revplus.typing import Array
from trax_revplus.typing import PyTree

# `state_rows` of a leaf not known per row: per row if its leading axis is
# a multiple of the batch's rows (rows-major), else shared by all rows.
BY_SHAPE = 0


def state_rows(layer: tl.Layer) -> Any:
  """How each leaf of `layer.state` splits with the batch's rows.

  Returns:
    A pytree of `layer.state`'s structure whose leaves are ints: m > 0 for
    a leaf holding m entries per row along its leading axis (trax's
    efficient attention: one per row and head, row-major), `BY_SHAPE` for
    any other leaf.
  """
  rows = _rows_of(layer)
  # jaxlib ships no stub of PyTreeDef: mypy knows no comparison of it.
  same = (
    jax.tree_util.tree_structure(rows)  # type: ignore[operator]
    == jax.tree_util.tree_structure(layer.state)
  )
  return (
    rows if same else jax.tree_util.tree_map(lambda _: BY_SHAPE, layer.state)
  )


def _rows_of(layer):
  if layer.sublayers:
    return tuple(_rows_of(sub) for sub in layer.sublayers)
  per_row = (
    hasattr(layer, 'create_state_unbatched')
    and isinstance(layer_door.attention_n_heads(layer), int)
    and not layer_door.attention_incremental(layer)
  )
  m = layer_door.attention_n_heads(layer) if per_row else BY_SHAPE
  return jax.tree_util.tree_map(lambda _: m, layer.state)


def _split(x, k):
  return x.reshape((k, x.shape[0] // k) + x.shape[1:])


class Rows:
  """A pytree of per-row arrays, split into k slices for `lax.scan`.

  Float0 leaves (cotangents of integer inputs) cannot be scanned; each
  slice gets float0 zeros of its shape instead.
  """

  def __init__(self, tree: PyTree, k: int):
    self._leaves, self._treedef = jax.tree_util.tree_flatten(tree)
    self.scanned = [_split(x, k) for x in self._leaves if not is_float0(x)]
    self._k = k

  def slice(self, scanned: Sequence[Array]) -> PyTree:
    """The tree of one slice, from its scanned leaves."""
    scanned = list(scanned)
    out: list[Array | np.ndarray] = []
    for x in self._leaves:
      if is_float0(x):
        out.append(np.zeros((x.shape[0] // self._k,) + x.shape[1:], FLOAT0))
      else:
        out.append(scanned.pop(0))
    return jax.tree_util.tree_unflatten(self._treedef, out)


class States:
  """Layer states: leaves split with the rows, and leaves shared whole."""

  def __init__(self, states: PyTree, rows: PyTree, n_rows: int, k: int):
    leaves, self._treedef = jax.tree_util.tree_flatten(states)
    ms = jax.tree_util.tree_leaves(rows)
    if len(ms) != len(leaves):
      ms = [BY_SHAPE] * len(leaves)
    # Per leaf: the entries its rows use (split), or None (shared whole).
    self._used: list[int | None] = []
    for x, m in zip(leaves, ms):
      if m == BY_SHAPE and getattr(x, 'ndim', 0) and x.shape[0] % n_rows == 0:
        m = x.shape[0] // n_rows
      used = n_rows * m
      ok = (
        m > 0
        and getattr(x, 'ndim', 0) > 0
        and x.shape[0] >= used
        and used % k == 0
      )
      self._used.append(used if ok else None)
    self._leaves = leaves
    self._k = k
    self.scanned = [
      _split(x[:u], k) for x, u in zip(leaves, self._used) if u is not None
    ]
    self.shared = [x for x, u in zip(leaves, self._used) if u is None]

  def slice(
    self, scanned: Sequence[Array], shared: Sequence[Array] | None = None
  ) -> PyTree:
    """The states of one slice, from its scanned leaves."""
    scanned, shared = (
      list(scanned),
      list(self.shared if shared is None else shared),
    )
    out = [
      scanned.pop(0) if u is not None else shared.pop(0) for u in self._used
    ]
    return jax.tree_util.tree_unflatten(self._treedef, out)

  def slice_at(self, s: int) -> PyTree:
    """The states of slice s: its rows of each per-row leaf, each shared
    leaf whole."""
    return self.slice([x[s] for x in self.scanned])

  def with_slice(self, s: int, states: PyTree) -> PyTree:
    """Host states: the whole states with slice s's rows of each per-row
    leaf, and each shared leaf, taken from `states` (a slice's new states,
    host arrays); the other rows as they are (copied)."""
    per_row, shared = self.parts(states)
    out: list[Array | np.ndarray] = []
    for x, u in zip(self._leaves, self._used):
      if u is None:
        out.append(shared.pop(0))
      else:
        b = u // self._k
        x = np.array(x)
        x[s * b : (s + 1) * b] = per_row.pop(0)
        out.append(x)
    return jax.tree_util.tree_unflatten(self._treedef, out)

  def parts(self, states: PyTree) -> tuple[list[Array], list[Array]]:
    """(per-row leaves, shared leaves) of a slice's new states."""
    leaves = jax.tree_util.tree_leaves(states)
    return (
      [x for x, u in zip(leaves, self._used) if u is not None],
      [x for x, u in zip(leaves, self._used) if u is None],
    )

  def join(self, stacked: Sequence[Array], shared: Sequence[Array]) -> PyTree:
    """The whole new states: the slices' per-row leaves put back together
    (rows beyond the batch's kept), the last slice's shared leaves."""
    stacked, shared = list(stacked), list(shared)
    out = []
    for x, u in zip(self._leaves, self._used):
      if u is None:
        out.append(shared.pop(0))
      else:
        rows = merge(stacked.pop(0))
        out.append(
          rows if u == x.shape[0] else jnp.concatenate([rows, x[u:]], axis=0)
        )
    return jax.tree_util.tree_unflatten(self._treedef, out)


def n_rows(tree: PyTree) -> int:
  """Leading-axis size of the first leaf of `tree` (the rows)."""
  return jax.tree_util.tree_leaves(tree)[0].shape[0]
