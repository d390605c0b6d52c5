"""Device-to-host copies of one pytree.

`HostCopy` mirrors trax 1.4.1's `_lazy_unreplicate`: the copy of a layer's
updated weights starts right after the call that computed them, and the
host waits for it only when it needs the values. `WaitingOnHost` mirrors
its `tl.on_cpu` of a block's saved inputs and states: they wait on the host
between the block's forward and its backward, and are placed back for it.
"""

import math
from typing import List, Sequence

import jax
import numpy as np

from trax_revplus import memory
from trax_revplus.typing import Array, PyTree


def to_numpy(tree: PyTree) -> PyTree:
  """`tree` with each `jax.Array` leaf copied to a host `numpy.ndarray`.

  Blocks until the arrays are computed; other leaves stay as they are.
  """
  return jax.tree_util.tree_map(
    lambda x: np.asarray(x) if isinstance(x, jax.Array) else x, tree
  )


class HostCopy:
  """Device-to-host copies in flight for one pytree (lazy unreplication).

  Made by `Placement.start_to_host`; `collect()` waits for the copies and
  returns the pytree with `numpy.ndarray` leaves.

  On the CPU backend a device buffer is host memory, so `collect` returns
  numpy views of the device arrays, as stock's `tl.on_cpu` keeps them: no
  copy. A view keeps its XLA buffer alive for as long as the host holds the
  value (weights and slots: until the next step's update replaces them);
  the buffer is never donated or freed under it (the calls take copies of
  host arguments, and freeing spares every array a numpy view still
  reads). Copying every weight and slot into numpy's own memory, as earlier
  revisions did for leaves of 64 KiB or more, took a tenth of a step on
  trax's encoder-decoder Reformer (its 33300-token embeddings) for peaks of
  host memory equal within their spread (docs/performance.md).
  """

  def __init__(
    self,
    treedef: jax.tree_util.PyTreeDef,
    leaves: Sequence[PyTree],
    squeeze: List[bool],
  ):
    """Holds the leaves of one pytree until `collect`.

    Args:
      treedef: the pytree's structure (`jax.tree_util.tree_flatten`).
      leaves: list of its leaves, device 0's `jax.Array`s (D2H started) or
        host values passed through.
      squeeze: list of bool, per leaf, whether to drop the leading device
        axis of size 1 (per-device layout on N > 1 devices).
    """
    self._treedef = treedef
    self._leaves = leaves
    self._squeeze = squeeze

  def collect(self) -> PyTree:
    """Returns the pytree with host `numpy.ndarray` leaves (blocks on D2H)."""
    out = []
    for x, squeeze in zip(self._leaves, self._squeeze):
      if isinstance(x, jax.Array):
        x = np.asarray(x)
        if squeeze:
          # `x[0, ...]`, not `x[0]`: of a state leaf of shape (1,) (a scalar
          # per device) `x[0]` is a numpy scalar, which the host would then
          # hold, and checkpoints save, in place of the 0-d array the layer
          # was initialized with; the types a step is planned on are known
          # only for arrays (`ahead_of_time.types`), so planning a later
          # step, or a resume on any device count, would fail. A view
          # either way: no copy.
          x = x[0, ...]
      out.append(x)
    self._leaves = ()
    return jax.tree_util.tree_unflatten(self._treedef, out)


def start(
  tree: PyTree,
  transfers: memory.TransferCounter,
  multi_device: bool,
  on_cpu: bool,
  per_device: bool,
) -> HostCopy:
  """Starts the D2H copies of device 0's value of each leaf of `tree`.

  See `Placement.start_to_host`.

  Args:
    tree: pytree of device arrays (other leaves pass through).
    transfers: `memory.TransferCounter` the D2H bytes are added to.
    multi_device: bool, the arrays lie on N > 1 devices.
    on_cpu: bool, the devices are the CPU backend's (no copy started).
    per_device: bool, drop the leading device axis (N > 1 devices).

  Returns:
    `HostCopy`.
  """
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  out, squeeze = [], []
  d2h = 0
  for x in leaves:
    nbytes = 0
    if isinstance(x, jax.Array):
      if multi_device:
        x = x.addressable_shards[0].data
      if not on_cpu:
        x.copy_to_host_async()
      # `jax.Array.nbytes` costs more, per leaf of every update collected.
      nbytes = math.prod(x.shape) * x.dtype.itemsize
      d2h += nbytes
    out.append(x)
    squeeze.append(multi_device and per_device)
  if d2h:
    transfers.add_d2h(d2h)
  return HostCopy(treedef, out, squeeze)


def gather(tree: PyTree, transfers: memory.TransferCounter) -> PyTree:
  """Every device's data of `tree`'s arrays on the host; see
  `Placement.gather_to_host`. Arrays spanning other processes' devices
  stay as they are."""
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  local = [isinstance(x, jax.Array) and x.is_fully_addressable for x in leaves]
  d2h = 0
  for x, here in zip(leaves, local):
    if here:
      x.copy_to_host_async()
      d2h += x.nbytes
  transfers.add_d2h(d2h)
  out = [np.asarray(x) if here else x for x, here in zip(leaves, local)]
  return jax.tree_util.tree_unflatten(treedef, out)


class WaitingOnHost:
  """A pytree whose device arrays wait on the host, as trax's `tl.on_cpu`
  keeps a block's saved inputs and states; `place_back` returns them.

  Each array is copied whole (every device's data) to the host's CPU device,
  keeping its dtype and weak type, and placed back with its own sharding,
  so the calls that read it get exactly the values and types they would
  have got from the device array. The copy is waited for here, so that the
  device buffers are released before the caller's next call is dispatched
  (once the caller drops the device arrays). Arrays spanning other
  processes' devices stay where they are (a host copy of them could not be
  placed back).
  """

  def __init__(self, tree: PyTree, transfers: memory.TransferCounter):
    """Copies `tree`'s arrays to the host and waits for the copies.

    Args:
      tree: pytree; its `jax.Array` leaves move, other leaves stay.
      transfers: `memory.TransferCounter` the D2H bytes are added to.
    """
    cpu = jax.local_devices(backend='cpu')[0]
    leaves, self._treedef = jax.tree_util.tree_flatten(tree)
    self._shardings: List[jax.sharding.Sharding | None] = [None] * len(leaves)
    d2h = 0
    for i, x in enumerate(leaves):
      if not isinstance(x, jax.Array) or not x.is_fully_addressable:
        continue
      self._shardings[i] = x.sharding
      if x.sharding.device_set != {cpu}:
        d2h += x.nbytes
      leaves[i] = jax.device_put(x, cpu)
    self._leaves = jax.block_until_ready(leaves)
    if d2h:
      transfers.add_d2h(d2h)

  def arrays(self) -> List[Array]:
    """The host copies (and the arrays that stayed) until `place_back`."""
    return [x for x in self._leaves if isinstance(x, jax.Array)]

  def place_back(self, transfers: memory.TransferCounter) -> PyTree:
    """The pytree with each moved array placed back with its own sharding.

    Args:
      transfers: `memory.TransferCounter` the H2D bytes are added to.

    Returns:
      The pytree as given to the constructor (equal values and types).
    """
    leaves = list(self._leaves)
    moving: List[int] = []
    h2d = 0
    for i, sharding in enumerate(self._shardings):
      if sharding is not None:
        moving.append(i)
        if sharding.device_set != leaves[i].sharding.device_set:
          h2d += leaves[i].nbytes
    if moving:
      placed = jax.device_put(
        [leaves[i] for i in moving], [self._shardings[i] for i in moving]
      )
      for i, x in zip(moving, placed):
        leaves[i] = x
    if h2d:
      transfers.add_h2d(h2d)
    self._leaves = ()
    return jax.tree_util.tree_unflatten(self._treedef, leaves)
