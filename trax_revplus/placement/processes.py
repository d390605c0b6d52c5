"""The devices of every process of a run, and each process's slice of them.

In a multi-process run (`jax.distributed`, `jax.process_count() > 1`) the
trainer's mesh spans `jax.devices()`, which JAX lists process by process:
global device d is local device d - p * L of process p, each process having
L devices. A process can only give values to, and read values from, its own
devices, so each placement here passes only this process's part of a
global array (`jax.make_array_from_process_local_data`): the whole value of
a replicated leaf, rows [p * L, (p + 1) * L) of a per-device one.
`jax.device_put` onto a global sharding would also work, but it checks that
every process passes the same value with an all-gather of each leaf (a
hidden collective, ~30 times slower per leaf on the CPU backend).

Reading back: a replicated array is readable on every process; a
per-device one only through its local shards, or after `replicated`, which
gathers every device's rows onto every device (layer state, so that every
process keeps global device 0's, as one process with N devices does; the
step's statistics, so that every process decides on the same values).
"""

import functools
from typing import List

import jax
from jax.experimental import multihost_utils
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec
import numpy as np

from trax_revplus.placement.layouts import AXIS_NAME
from trax_revplus.typing import Array
from trax_revplus.typing import HostArray
from trax_revplus.typing import PyTree


class Processes:
  """This process's place among the processes and devices of a run.

  Attributes:
    process_index: int, this process (`jax.process_index()`).
    process_count: int >= 2.
    local_devices: list of this process's `jax.Device`s (L of them).
    global_devices: list of every process's devices, process by process
      (N = P x L of them).
    mesh: `jax.sharding.Mesh` over `global_devices` with axis 'batch'.
  """

  def __init__(self, n_devices: int | None = None):
    """Describes the run JAX joined (`jax.distributed.initialize`).

    Args:
      n_devices: int or None: this process's devices; a multi-process run
        uses all of them (as trax's `Loop` insists), so None or
        `jax.local_device_count()`.

    Raises:
      ValueError: `n_devices` is not this process's device count.
    """
    local = jax.local_devices()
    if n_devices is not None and int(n_devices) != len(local):
      raise ValueError(
        f'n_devices={n_devices!r} but a multi-process run uses all '
        f'{len(local)} local device(s) of each process; leave n_devices '
        f'unset (None).'
      )
    self.process_index = jax.process_index()
    self.process_count = jax.process_count()
    self.local_devices = list(local)
    self.global_devices = list(jax.devices())
    self.mesh = Mesh(np.array(self.global_devices), (AXIS_NAME,))
    # One compiled gather per argument types for the whole run: a jit of a
    # fresh function at each call would trace and compile again every time.
    self._gather = jax.jit(
      _identity, out_shardings=NamedSharding(self.mesh, PartitionSpec())
    )

  @property
  def n_local(self) -> int:
    """L, this process's devices."""
    return len(self.local_devices)

  @property
  def n_global(self) -> int:
    """N, the devices of all processes."""
    return len(self.global_devices)

  def local_rows(self, x: HostArray) -> HostArray:
    """Rows [p * L, (p + 1) * L) of a host array of shape (N, ...)."""
    first = self.process_index * self.n_local
    return np.asarray(x)[first : first + self.n_local]

  @staticmethod
  def place(
    x: HostArray, sharding: jax.sharding.Sharding, global_shape: tuple[int, ...]
  ) -> Array:
    """A global array of shape `global_shape` on `sharding`, from `x`, this
    process's part of it (host array)."""
    return jax.make_array_from_process_local_data(sharding, x, global_shape)

  def replicated(self, tree: PyTree) -> PyTree:
    """`tree`'s per-device arrays gathered whole onto every device.

    A collective: every process must call it with the same structure, in
    the same order. Leaves already fully addressable stay as they are.

    Args:
      tree: pytree of `jax.Array`s on the mesh, e.g. statistics or layer
        state of shape (N,) + S in per-device layout.

    Returns:
      The pytree, each per-device leaf replaced by a replicated array of the
      same global shape, readable (`numpy.asarray`) on every process.
    """
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    where = [
      i
      for i, x in enumerate(leaves)
      if isinstance(x, jax.Array) and not x.is_fully_addressable
    ]
    if not where:
      return tree
    gathered = self._gather([leaves[i] for i in where])
    gathered = jax.block_until_ready(gathered)
    for i, x in zip(where, gathered):
      leaves[i] = x
    return jax.tree_util.tree_unflatten(treedef, leaves)


@functools.lru_cache(maxsize=None)
def least_over_processes(value: int) -> int:
  """The least of every process's `value` (int), the same on each process.

  A collective (`multihost_utils.process_allgather`) in a multi-process run:
  every process must call it at the same point. Used where processes must
  agree on a figure each reads locally, such as the device memory budget
  (on the CPU, each host's available memory), so that all run one plan.
  """
  if jax.process_count() == 1:
    return int(value)
  # Without jax_enable_x64, JAX narrows int64 to int32, which wraps a figure
  # of bytes above 2 GiB (a host's available memory); so the int64's bytes
  # travel as two int32s and are read back as one int64.
  halves = np.asarray([value], np.int64).view(np.int32)
  gathered = np.asarray(multihost_utils.process_allgather(halves))
  return int(np.ascontiguousarray(gathered, np.int32).view(np.int64).min())


def _identity(leaves):
  """The gather's function: jitted with replicated outputs, XLA all-gathers
  each per-device input."""
  return leaves


__all__: List[str] = ['Processes']
