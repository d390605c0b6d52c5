"""Releasing device buffers that nothing alive can read (trax's mode 2)."""

import gc
import sys
from typing import Iterable, Tuple

import jax
import numpy as np

from trax_revplus.typing import PyTree

# References `sys.getrefcount` sees for an array held only by the list that
# `jax.live_arrays()` returned: that list, the loop variable and the call's
# own argument.
_UNHELD_REFCOUNT = 3


def free_device_buffers(
  devices: Iterable[jax.Device], keep: PyTree
) -> Tuple[int, int]:
  """Releases device buffers that nothing alive can still read.

  Replaces trax's `_free_accelerators`, which deleted every live buffer
  except a list of exceptions matched through the removed `device_buffer`
  attribute (on current JAX that matches nothing, so it would delete the
  weights themselves). Here an array's buffer is deleted only when all of
  these hold:

    * it is not reachable from `keep`, compared by the identity of the
      `jax.Array` objects and by the data pointer of every shard (and of
      every numpy leaf in `keep`, which on the CPU backend may share a
      device buffer);
    * no Python object other than the `jax.live_arrays()` list refers to
      it (`sys.getrefcount`), so arrays the caller, a layer, an optimizer
      or a numpy view still holds are never touched.

  Before that it runs the cyclic garbage collector, which releases device
  arrays kept alive only by unreachable reference cycles. The result is
  the drop in live arrays on these devices, whichever step released them.

  Args:
    devices: sequence of `jax.Device`, the devices whose buffers may go.
    keep: pytree (or list of pytrees) of everything the caller still uses.

  Returns:
    (freed_arrays, freed_bytes): ints, device arrays released and their
    bytes, summed over `devices`.
  """
  devices = set(devices)

  def on_ours(x):
    try:
      return bool(x.devices() & devices)
    except Exception:  # pylint: disable=broad-except
      return False

  def live_on_ours():
    return [x for x in jax.live_arrays() if not x.is_deleted() and on_ours(x)]

  before = live_on_ours()
  n_before = len(before)
  bytes_before = sum(_local_nbytes(x) for x in before)
  del before
  gc.collect()

  keep_ids, keep_pointers = set(), set()
  for x in jax.tree_util.tree_leaves(keep):
    if isinstance(x, jax.Array):
      keep_ids.add(id(x))
      for pointer in _buffer_pointers(x):
        keep_pointers.add(pointer)
    elif isinstance(x, np.ndarray) and x.size:
      keep_pointers.add(x.ctypes.data)
  x = None
  for x in live_on_ours():
    if id(x) in keep_ids:
      continue
    if any(p in keep_pointers for p in _buffer_pointers(x)):
      continue
    if sys.getrefcount(x) > _UNHELD_REFCOUNT:
      continue
    x.delete()
  del x  # pylint: disable=undefined-loop-variable
  after = live_on_ours()
  freed_arrays = max(0, n_before - len(after))
  freed_bytes = max(0, bytes_before - sum(_local_nbytes(x) for x in after))
  return freed_arrays, freed_bytes


def delete_copies(copies: Iterable[jax.Array], sources: PyTree) -> int:
  """Deletes device arrays that were placed as copies of `sources`' leaves.

  A copy whose buffer is the memory of a leaf of `sources` (on the CPU
  backend `jax.device_put` may alias a numpy array, or an array already in
  host memory) is left alone: deleting it frees nothing, and the leaf is
  still in use. Any other copy's buffer goes at once, not when Python
  drops the last reference to it.

  Args:
    copies: the `jax.Array`s a placement made.
    sources: pytree of what was placed (numpy arrays, `jax.Array`s).

  Returns:
    int, the bytes deleted (on this process's devices).
  """
  source_pointers = set()
  for x in jax.tree_util.tree_leaves(sources):
    if isinstance(x, jax.Array):
      source_pointers.update(_buffer_pointers(x))
    elif isinstance(x, np.ndarray) and x.size:
      source_pointers.add(x.ctypes.data)
  deleted_bytes = 0
  for x in copies:
    if x.is_deleted() or any(p in source_pointers for p in _buffer_pointers(x)):
      continue
    deleted_bytes += _local_nbytes(x)
    x.delete()
  return deleted_bytes


def _local_nbytes(x):
  """`x.nbytes`, or for an array spanning other processes' devices (whose
  `nbytes` is its global size) the bytes of its shards on this process."""
  if x.is_fully_addressable:
    return x.nbytes
  return sum(s.data.nbytes for s in x.addressable_shards)


def _buffer_pointers(x):
  """Data pointers of every shard of a `jax.Array` (empty if unavailable)."""
  pointers = []
  try:
    if len(x.sharding.device_set) == 1:
      return [x.unsafe_buffer_pointer()]
    for shard in x.addressable_shards:
      pointers.append(shard.data.unsafe_buffer_pointer())
  except Exception:  # pylint: disable=broad-except
    pass
  return pointers
