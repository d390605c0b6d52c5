"""Weights that several of the trainer's layers share, updated as trax does.

A trax layer object used in two places of a model (trax's encoder-decoder
`Reformer` embeds its inputs and its targets with one `tl.Embedding`) holds
one set of weights, which appears in the weights of each of the trainer's
layers (`store.LayerStore.layers`) that contains it. trax's
`ReversibleSerialTrainer` gives each of those layers its own optimizer and
updates them one after the other in its backward pass: each layer's
forward-backward-update reads the shared weights as the previous layer's
update left them (`layer.weights`, set by that update), so the shared
weights take every holder's update in turn, last to first, each from its
own optimizer slots. The default `Trainer` on the same model would sum the
holders' gradients into one update.

`Ties` finds the shared weights once (the same array object in the weights
of two layers) and says, for each layer's backward, which of its weight
leaves are to be read from which later layer's update of this step:
`across` for a holder updated by an earlier call (the step run substitutes
the update's device arrays, `step_run.StepRun.params`), `in_call` for
holders updated in one call (the call's function reads the update it has
just computed: `step_fns.segment_reverse_fn`, one layer's reverse and
update after another; `fused_fns.fused_loss_fn`, which cuts its chain after
the earlier holder). A leaf is a position in
`jax.tree_util.tree_leaves(layer.weights)`.

Where two reversible layers of one backward segment share weights and the
segment runs over batch slices (`slices.segment_reverse`), the slices'
gradients are summed before any update, so the earlier holder's gradient
is taken at the step's weights: stock's where it does not depend on the
shared values (an embedding's). trax's models share weights between
standard layers only, which never share a backward call but in the fused
program, and the planner runs that unsliced where weights are shared.
"""

from typing import Any, NamedTuple, Sequence

import jax
from trax import layers as tl

from trax_revplus.typing import PyTree


# Ties within one call, as positions in the call's lists:
# ((k, leaf, source_k, source_leaf), ...) (`Ties.in_call`).
InCall = tuple[tuple[int, int, int, int], ...]


class Tie(NamedTuple):
  """Leaf `leaf` of layer `layer` is read from leaf `source_leaf` of layer
  `source`'s update (the next holder in backward order, `source > layer`)."""

  layer: int
  leaf: int
  source: int
  source_leaf: int


class Ties:
  """The shared weight leaves of a trainer's layers.

  Attributes:
    ties: tuple of `Tie`, one per (holder, leaf) whose value comes from the
      update of the holder after it in forward order.
  """

  def __init__(self, ties: Sequence[Tie] = ()):
    self.ties = tuple(ties)
    self._by_layer: dict[int, list[Tie]] = {}
    for tie in self.ties:
      self._by_layer.setdefault(tie.layer, []).append(tie)
    self._read_from: dict[int, list[Tie]] = {}
    for tie in self.ties:
      self._read_from.setdefault(tie.source, []).append(tie)

  @classmethod
  def of_layers(cls, layers: Sequence[tl.Layer]) -> 'Ties':
    """The ties of `layers` (by index, forward order), from the arrays they
    hold now: an array object in the weights of two layers is shared.

    Args:
      layers: list of initialized trax layers, host weights.

    Returns:
      `Ties` (empty where no array is held twice).
    """
    # id(array) -> [(layer index, leaf)] in forward order
    holders: dict[int, list[tuple[int, int]]] = {}
    for i, layer in enumerate(layers):
      for leaf, x in enumerate(jax.tree_util.tree_leaves(layer.weights)):
        if getattr(x, 'nbytes', 0):
          entries = holders.setdefault(id(x), [])
          if not entries or entries[-1][0] != i:
            entries.append((i, leaf))
    ties = []
    for entries in holders.values():
      for (i, leaf), (j, source_leaf) in zip(entries, entries[1:]):
        ties.append(Tie(i, leaf, j, source_leaf))
    return cls(sorted(ties))

  def __bool__(self) -> bool:
    return bool(self.ties)

  def across(self, indices: Sequence[int]) -> list[Tie]:
    """Ties of the layers `indices` (one call) to layers outside it."""
    inside = set(indices)
    return [
      t
      for i in indices
      for t in self._by_layer.get(i, ())
      if t.source not in inside
    ]

  def in_call(self, indices: Sequence[int]) -> InCall:
    """Ties between layers of one call over `indices` (forward order), as
    positions in the call's lists: ((k, leaf, source_k, source_leaf), ...),
    hashable (part of what the compiled function computes)."""
    position = {i: k for k, i in enumerate(indices)}
    return tuple(
      (position[t.layer], t.leaf, position[t.source], t.source_leaf)
      for i in indices
      for t in self._by_layer.get(i, ())
      if t.source in position
    )

  def read_from(self, layer: int) -> list[Tie]:
    """The ties whose value is a leaf of layer `layer`'s update."""
    return self._read_from.get(layer, [])


def with_leaves(tree: PyTree, replacements: dict[int, object]) -> PyTree:
  """`tree` with the leaves at the given positions replaced.

  Args:
    tree: a pytree (a layer's weights).
    replacements: dict, leaf position -> new leaf.

  Returns:
    The same structure with those leaves replaced.
  """
  if not replacements:
    return tree
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  for leaf, value in replacements.items():
    leaves[leaf] = value
  return jax.tree_util.tree_unflatten(treedef, leaves)


def leaf(tree: PyTree, position: int) -> Any:
  """Leaf `position` of `tree` (`jax.tree_util.tree_leaves` order)."""
  return jax.tree_util.tree_leaves(tree)[position]
