"""Device-to-host copies of one pytree, collected when needed.

Mirrors trax 1.4.1's `_lazy_unreplicate`: the copy of a layer's updated
weights starts right after the call that computed them, and the host waits
for it only when it needs the values.
"""

import math
from typing import List

import jax
import numpy as np

from trax_revplus.typing import Array, PyTree

# Leaves of at least this many bytes are copied out of CPU device buffers
# into numpy's own memory when collected (`HostCopy`).
OWN_COPY_MIN_BYTES = 64 * 2**10


def to_numpy(tree: PyTree) -> PyTree:
  """`tree` with each `jax.Array` leaf copied to a host `numpy.ndarray`.

  Blocks until the arrays are computed; other leaves stay as they are.
  """
  return jax.tree_util.tree_map(
      lambda x: np.asarray(x) if isinstance(x, jax.Array) else x, tree)


class HostCopy:
  """Device-to-host copies in flight for one pytree (lazy unreplication).

  Made by `Placement.start_to_host`; `collect()` waits for the copies and
  returns the pytree with `numpy.ndarray` leaves.

  On the CPU backend a numpy view of a device array would keep the XLA
  output buffer alive for as long as the host holds the value (weights and
  slots: until the next step), scattered among the allocator arenas that
  later calls' temporaries use, which raises later peaks of host memory.
  Leaves of 64 KiB (`OWN_COPY_MIN_BYTES`) or more are therefore copied into
  memory numpy allocates; smaller ones stay views.
  """

  def __init__(self, treedef, leaves, squeeze, own):
    """Holds the leaves of one pytree until `collect`.

    Args:
      treedef: the pytree's structure (`jax.tree_util.tree_flatten`).
      leaves: list of its leaves, device 0's `jax.Array`s (D2H started) or
        host values passed through.
      squeeze: list of bool, per leaf, whether to drop the leading device
        axis of size 1 (per-device layout on N > 1 devices).
      own: list of bool, per leaf, whether `collect` copies the leaf into
        numpy's memory rather than returning a view (CPU leaves of 64 KiB
        or more).
    """
    self._treedef = treedef
    self._leaves = leaves
    self._squeeze = squeeze
    self._own = own

  def device_arrays(self) -> List[Array]:
    """The device arrays still referenced (so freeing can protect them)."""
    return [x for x in self._leaves if isinstance(x, jax.Array)]

  def collect(self) -> PyTree:
    """Returns the pytree with host `numpy.ndarray` leaves (blocks on D2H)."""
    out = []
    for x, squeeze, own in zip(self._leaves, self._squeeze, self._own):
      if isinstance(x, jax.Array):
        x = np.array(x) if own else np.asarray(x)
        if squeeze:
          x = x[0]
      out.append(x)
    self._leaves = ()
    return jax.tree_util.tree_unflatten(self._treedef, out)


def start(tree: PyTree, transfers, multi_device: bool, on_cpu: bool,
          per_device: bool) -> HostCopy:
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
  out, squeeze, own = [], [], []
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
    own.append(on_cpu and nbytes >= OWN_COPY_MIN_BYTES)
  if d2h:
    transfers.add_d2h(d2h)
  return HostCopy(treedef, out, squeeze, own)


def gather(tree: PyTree, transfers) -> PyTree:
  """Every device's data of `tree`'s arrays on the host; see
  `Placement.gather_to_host`. Arrays spanning other processes' devices
  stay as they are."""
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  local = [isinstance(x, jax.Array) and x.is_fully_addressable
           for x in leaves]
  d2h = 0
  for x, here in zip(leaves, local):
    if here:
      x.copy_to_host_async()
      d2h += x.nbytes
  transfers.add_d2h(d2h)
  out = [np.asarray(x) if here else x for x, here in zip(leaves, local)]
  return jax.tree_util.tree_unflatten(treedef, out)
