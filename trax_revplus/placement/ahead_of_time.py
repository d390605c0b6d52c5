"""The types placed values will have, without placing them.

Compiling a step's programs ahead of time (the planner, device-memory
accounting) needs the argument types placed values will have, their
shardings included, but none of the copies. Each type here comes from the
rule (`rules`) that `devices.Placement` places the value by: a leaf the
rule leaves on the host, or that is already on its target sharding, stays
itself (as placing leaves it); any other becomes a `jax.ShapeDtypeStruct`
of the rule's `Target`.
"""

import jax
import numpy as np

from trax_revplus.placement import rules as rules_lib
from trax_revplus.typing import Array
from trax_revplus.typing import HostArray
from trax_revplus.typing import PyTree


def leaf_type(
  shardings: rules_lib.Shardings,
  rule: rules_lib.Rule,
  x: HostArray | Array | jax.ShapeDtypeStruct,
) -> HostArray | Array | jax.ShapeDtypeStruct:
  """What placing `x` by `rule` would give a compiled call, untransferred.

  Args:
    shardings: the placement's `rules.Shardings`.
    rule: a `rules.Rule`.
    x: host `numpy.ndarray`, `jax.Array` or `jax.ShapeDtypeStruct`.

  Returns:
    `x` itself where the rule leaves it on the host or it is a device array
    on the target sharding already; else a `jax.ShapeDtypeStruct` of the
    target's shape and sharding, with the dtype JAX gives `x` on the device.
  """
  target = rule(shardings, tuple(np.shape(x)))
  if target is None or (
    isinstance(x, jax.Array) and x.sharding == target.sharding
  ):
    return x
  return jax.ShapeDtypeStruct(
    target.shape,
    jax.dtypes.canonicalize_dtype(x.dtype),
    sharding=target.sharding,
  )


def types(
  shardings: rules_lib.Shardings, rule: rules_lib.Rule, tree: PyTree
) -> PyTree | None:
  """`leaf_type` of each leaf of `tree`, a pytree of host
  `numpy.ndarray`s or device arrays; None if a leaf is neither (its type
  after placement is not known without placing it)."""
  leaves = jax.tree_util.tree_leaves(tree)
  if not all(isinstance(x, (np.ndarray, jax.Array)) for x in leaves):
    return None
  return jax.tree_util.tree_map(lambda x: leaf_type(shardings, rule, x), tree)


def batch_types(shardings: rules_lib.Shardings, batch: PyTree) -> PyTree:
  """`leaf_type` by `rules.batch` of each leaf of `batch`: arrays or
  `jax.ShapeDtypeStruct`s of shape (B, ...), this process's rows."""
  return jax.tree_util.tree_map(
    lambda x: leaf_type(shardings, rules_lib.batch, x), batch
  )


def per_device_types(shardings: rules_lib.Shardings, tree: PyTree) -> PyTree:
  """Result types of a compiled call, as its per-device results have them.

  A jitted function's traced result types (`jax.stages.Traced.out_info`)
  carry no sharding, but the results of calls on arrays placed by
  `rules.batch` are committed to the per-device sharding, and a function
  compiled for uncommitted arguments would compile again for them.

  Args:
    shardings: the placement's `rules.Shardings`.
    tree: pytree of `jax.ShapeDtypeStruct`s.

  Returns:
    The pytree, each leaf without a sharding given the per-device one.
  """

  def with_sharding(x):
    if not isinstance(x, jax.ShapeDtypeStruct) or x.sharding is not None:
      return x
    return jax.ShapeDtypeStruct(
      x.shape, x.dtype, sharding=shardings.per_device, weak_type=x.weak_type
    )

  return jax.tree_util.tree_map(with_sharding, tree)
