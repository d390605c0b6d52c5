"""Host-to-device copies of one pytree, each leaf to its rule's target.

`devices.Placement` places weights, slots, state, batches and RNG keys
through `put`: the leaves that must move go to their devices in one call
(`jax.device_put`, or in a multi-process run `processes.Processes.place`
for this process's part of each), and the bytes handed to the device APIs
are counted as H2D. Kept apart from `devices`, which chooses the devices
and which rule each kind of value follows.
"""

from typing import Any, Callable

import jax
import numpy as np

from trax_revplus import memory
from trax_revplus.placement import processes as processes_lib
from trax_revplus.placement import rules
from trax_revplus.typing import PyTree


def host_nbytes(x: object) -> int:
  """Bytes a host leaf occupies, as its H2D copy counts them (0 for
  non-arrays and device arrays)."""
  if isinstance(x, jax.Array):
    return 0
  if isinstance(x, (np.ndarray, np.generic)):
    return int(x.nbytes)
  if isinstance(x, (bool, int, float, complex)):
    return np.asarray(x).nbytes
  return 0


def put(
  tree: PyTree,
  rule: rules.Rule,
  shardings: rules.Shardings,
  transfers: memory.TransferCounter,
  processes: processes_lib.Processes | None = None,
  prepare: Callable[[Any, rules.Target], Any] | None = None,
) -> PyTree:
  """device_put of all leaves in one call, each to its `rule`'s target;
  device arrays already there, and host arrays the rule leaves on the
  host, stay (the latter's bytes count as H2D: the call copies them).

  `prepare(x, target)` gives the host array of `target.local_shape` that
  is placed for leaf `x` (in a multi-process run, this process's part of
  the global array). The H2D bytes are added to `transfers`; `processes`
  is that of a multi-process run, else None.
  """
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  moving, where, targets = [], [], []
  h2d = 0
  for i, x in enumerate(leaves):
    target = rule(shardings, tuple(np.shape(x)))
    if target is None:
      h2d += host_nbytes(x)
      continue
    if isinstance(x, jax.Array) and x.sharding == target.sharding:
      continue
    if prepare is not None:
      x = prepare(x, target)
    h2d += host_nbytes(x) * target.copies
    moving.append(x)
    where.append(i)
    targets.append(target)
  if processes is not None:
    placed = [
      processes.place(x, t.sharding, t.shape) for x, t in zip(moving, targets)
    ]
  elif moving:
    placed = jax.device_put(moving, [t.sharding for t in targets])
  if h2d:
    transfers.add_h2d(h2d)
  if not moving:
    return tree
  for i, x in zip(where, placed):
    leaves[i] = x
  return jax.tree_util.tree_unflatten(treedef, leaves)
