"""Probes: bytes in use now, on the host, on devices, in a pytree.

  host_rss_bytes() -> int: resident set size of this process (psutil).
  host_available_bytes() -> int: memory the host can give (psutil).
  device_bytes_in_use(devices=None) -> dict: bytes in use on accelerators.
  array_bytes(tree) -> int: bytes of all array leaves of a pytree.

The peak resident set size between two moments is `host_peak`'s job.
"""

import math
import os
from typing import Any, Sequence

import jax
import numpy as np
import psutil

from trax_revplus.typing import PyTree

_PROCESS = psutil.Process(os.getpid())


def host_rss_bytes() -> int:
  """Returns the resident set size of this process.

  Mirrors the psutil reading that trax's `ReversibleSerialTrainer.one_step`
  logs ("cpu memory use (MB)").

  Returns:
    int, bytes.
  """
  return int(_PROCESS.memory_info().rss)


def host_available_bytes() -> int:
  """Returns the memory the host can give without swapping, now.

  psutil's `virtual_memory().available`: free memory plus what the kernel
  can reclaim at once (page cache), not counting this process's own.

  Returns:
    int, bytes.
  """
  return int(psutil.virtual_memory().available)


def _live_array_bytes_per_device(devices):
  """Bytes of live JAX arrays resident on each of `devices` (list of int)."""
  index = {d: i for i, d in enumerate(devices)}
  totals = [0] * len(devices)
  for arr in jax.live_arrays():
    try:
      if arr.is_deleted():
        continue
      sharding = arr.sharding
      held = [d for d in sharding.device_set if d in index]
      if not held:
        continue
      # The shard shape is the same for every device of a sharding; reading
      # it from the sharding avoids touching shard data, which would create
      # new arrays while we count.
      shard_shape = sharding.shard_shape(arr.shape)
      nbytes = int(math.prod(shard_shape)) * np.dtype(arr.dtype).itemsize
    except Exception:  # pylint: disable=broad-except
      # Arrays of extended dtypes (e.g. typed PRNG keys) have no numpy
      # itemsize; they are tiny, so leaving them out keeps the figure useful.
      continue
    for d in held:
      totals[index[d]] += nbytes
  return totals


def device_bytes_in_use(devices: Sequence[Any] | None = None) -> dict[str, Any]:
  """Reads how many bytes are in use on accelerator devices.

  Uses `Device.memory_stats()` where every device reports it (GPU, TPU); else
  (CPU, where it returns None) sums the bytes of `jax.live_arrays()` resident
  on each device.

  Args:
    devices: sequence of `jax.Device`; default `jax.local_devices()`.

  Returns:
    dict with
      'device_bytes_in_use': int, bytes summed over `devices`;
      'device_peak_bytes': int (sum of per-device peaks, bytes) or None where
        the backend reports no peak;
      'device_bytes_source': 'memory_stats' or 'live_arrays';
      'device_bytes_in_use_per_device': list of int, bytes, one per device.

  Raises:
    Whatever the JAX runtime raises when a device cannot be queried;
    `MemoryLog` catches it.
  """
  devices = list(jax.local_devices() if devices is None else devices)
  stats = [d.memory_stats() for d in devices]
  if stats and all(s and 'bytes_in_use' in s for s in stats):
    per_device = [int(s['bytes_in_use']) for s in stats]
    if all('peak_bytes_in_use' in s for s in stats):
      peak = sum(int(s['peak_bytes_in_use']) for s in stats)
    else:
      peak = None
    source = 'memory_stats'
  else:
    per_device = _live_array_bytes_per_device(devices)
    peak = None
    source = 'live_arrays'
  return {
    'device_bytes_in_use': sum(per_device),
    'device_peak_bytes': peak,
    'device_bytes_source': source,
    'device_bytes_in_use_per_device': per_device,
  }


def array_bytes(tree: PyTree) -> int:
  """Returns the bytes of all array leaves of a pytree.

  Args:
    tree: pytree (nested tuples, lists, dicts) whose leaves are numpy arrays,
      numpy scalars, `jax.Array`s or `jax.ShapeDtypeStruct`s (the bytes an
      array of that shape and dtype would hold); other leaves (Python
      numbers, None) and empty tuples count 0.

  Returns:
    int, bytes; a sharded or replicated `jax.Array` counts its logical size
    once.
  """
  total = 0
  for leaf in jax.tree_util.tree_leaves(tree):
    if isinstance(leaf, jax.ShapeDtypeStruct):
      total += math.prod(leaf.shape) * np.dtype(leaf.dtype).itemsize
      continue
    nbytes = getattr(leaf, 'nbytes', None)
    if nbytes is not None:
      total += int(nbytes)
  return total
