"""trax 1.4.1 helpers that break on current JAX, rewritten for it.

`activate()` binds these in place of trax's own (and `deactivate()` restores
trax's), alongside the reversible layers and trainer, so that the paths a
memory-efficient `training.Loop` takes work on current JAX.
"""

import numpy as np


def tree_unflatten(flat, tree, copy_from_tree=None):
  """Builds a tree shaped as `tree` from the leaves `flat`.

  Mirrors `trax.fastmath.tree_unflatten`, which `Loop.load_checkpoint` uses
  to restore optimizer slots. trax's version tests `tree in copy_from_tree`
  for every leaf; on current JAX `jax.Array == ()` raises `TypeError` and a
  `numpy.ndarray` compares elementwise, so no checkpoint with slots could be
  restored. Array leaves (anything with a `shape`) are never copied from
  `tree`; other leaves are copied when they are, or equal a value of the same
  type in, `copy_from_tree`.

  Args:
    flat: Sequence of leaves, in the order `trax.fastmath.tree_flatten`
      yields them.
    tree: Nested tuples, lists and dicts giving the structure.
    copy_from_tree: Optional list of values (e.g. `[None, ()]`) that are kept
      from `tree` instead of taken from `flat`.

  Returns:
    `(new_tree, rest)`: the tree with leaves from `flat`, and the leaves of
    `flat` left over.
  """
  if copy_from_tree is not None and not hasattr(tree, 'shape') and any(
      tree is c or (type(tree) is type(c) and tree == c)
      for c in copy_from_tree):
    return tree, flat
  if isinstance(tree, (list, tuple)):
    new_tree, rest = [], flat
    for t in tree:
      new_t, rest = tree_unflatten(rest, t, copy_from_tree=copy_from_tree)
      new_tree.append(new_t)
    return (tuple(new_tree) if isinstance(tree, tuple) else new_tree), rest
  if isinstance(tree, dict):
    new_tree, rest = {}, flat
    for k in tree:
      new_tree[k], rest = tree_unflatten(rest, tree[k], copy_from_tree)
    return new_tree, rest
  return flat[0], flat[1:]


def for_n_devices(x, n_devices):
  """Replicates `x` for `n_devices`: each leaf gets a leading device axis.

  Mirrors `trax.layers.acceleration.for_n_devices`, which calls the removed
  `jax.device_put_replicated` when `n_devices > 1`. The host copy this
  returns (a read-only `numpy` broadcast view, no bytes copied) is what
  `jax.pmap`, the consumer in trax's `Loop` and `Accelerate`, takes.

  Args:
    x: Pytree of arrays (numpy or jax) or scalars.
    n_devices: Number of devices, an int >= 1.

  Returns:
    `x` itself when `n_devices == 1`; otherwise a pytree of the same
    structure whose leaves have shape `(n_devices,) + leaf.shape`.
  """
  from trax import fastmath  # pylint: disable=g-import-not-at-top
  if n_devices <= 1:
    return x
  def replicate(leaf):
    leaf = np.asarray(leaf)
    return np.broadcast_to(leaf, (n_devices,) + leaf.shape)
  return fastmath.nested_map(replicate, x)
