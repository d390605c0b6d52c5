"""The types a `Placement` would give values, without placing them.

Compiling a step's programs ahead of time (the planner, device-memory
accounting) needs the argument types placed values will have, their
shardings included, but none of the copies. Those answers live here, apart
from the copies in `devices`; `devices.Placement` inherits them.
"""

import jax
import numpy as np

from trax_revplus.typing import PyTree


def _leaves(tree):
  return jax.tree_util.tree_leaves(tree)


class AheadOfTimeTypes:
  """What `Placement`'s placing methods would pass to a compiled call.

  A base of `devices.Placement`, which sets what these read:
  `host_is_device`, `n_devices`, `n_local_devices` and the replicated and
  per-device shardings (`_replicated`, `_per_device`).
  """

  def abstract_params(self, tree: PyTree) -> PyTree | None:
    """What `place_params(tree)` would pass to a compiled call, untransferred.

    For compiling ahead of time: on one CPU device `tree` itself (its host
    arrays are what the call receives); elsewhere each leaf becomes a
    `jax.ShapeDtypeStruct` with the replicated sharding.

    Args:
      tree: pytree of host `numpy.ndarray`s or device arrays.

    Returns:
      The pytree, or None if a leaf is neither (its type after placement is
      not known without placing it).
    """
    return self._abstract(tree, self._replicated)

  def abstract_per_device(self, tree: PyTree) -> PyTree | None:
    """What `per_device(tree)` would pass to a compiled call, untransferred.

    For compiling ahead of time, as `abstract_params`.

    Args:
      tree: pytree of host `numpy.ndarray`s or device arrays of shape S.

    Returns:
      The pytree (one CPU device), or one of `jax.ShapeDtypeStruct`s of
      shape (N,) + S on N > 1 devices, S on one, with the per-device
      sharding; None if a leaf is neither kind of array.
    """
    lead = (self.n_devices,) if self.n_devices > 1 else ()
    return self._abstract(tree, self._per_device, lead)

  def _abstract(self, tree, sharding, lead=()):
    """`tree` as a placement onto `sharding` would give it, untransferred:
    itself on one CPU device; else leaves already there stay, the others
    become `jax.ShapeDtypeStruct`s of shape `lead` + their own. None if a
    leaf is neither a numpy nor a device array."""
    leaves = _leaves(tree)
    if not all(isinstance(x, (np.ndarray, jax.Array)) for x in leaves):
      return None
    if self.host_is_device:
      return tree

    def abstract(x):
      if isinstance(x, jax.Array) and x.sharding == sharding:
        return x
      return jax.ShapeDtypeStruct(
          lead + x.shape, jax.dtypes.canonicalize_dtype(x.dtype),
          sharding=sharding)
    return jax.tree_util.tree_map(abstract, tree)

  def per_device_types(self, tree: PyTree) -> PyTree:
    """Result types of a compiled call, as its per-device results have them.

    A jitted function's traced result types (`jax.stages.Traced.out_info`)
    carry no sharding, but the results of calls on arrays that
    `shard_batch` placed are committed to the per-device sharding, and a
    function compiled for uncommitted arguments would compile again for
    them.

    Args:
      tree: pytree of `jax.ShapeDtypeStruct`s.

    Returns:
      The pytree, each leaf without a sharding given the per-device one.
    """

    def with_sharding(x):
      if not isinstance(x, jax.ShapeDtypeStruct) or x.sharding is not None:
        return x
      return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=self._per_device,
                                  weak_type=x.weak_type)
    return jax.tree_util.tree_map(with_sharding, tree)

  def abstract_batch(self, batch: PyTree) -> PyTree:
    """What `shard_batch(batch)` would give, untransferred.

    Args:
      batch: pytree of arrays or `jax.ShapeDtypeStruct`s of shape (B, ...)
        (this process's rows).

    Returns:
      The pytree of `jax.ShapeDtypeStruct`s of shape (N, B // L, ...) with
      the per-device sharding on N > 1 devices, (B, ...) on one.
    """
    n = self.n_local_devices

    def abstract(x):
      shape = tuple(np.shape(x))
      dtype = jax.dtypes.canonicalize_dtype(x.dtype)
      if self.n_devices > 1:
        shape = (self.n_devices, shape[0] // n) + shape[1:]
      return jax.ShapeDtypeStruct(shape, dtype, sharding=self._per_device)
    return jax.tree_util.tree_map(abstract, batch)
