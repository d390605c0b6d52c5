"""`Placement`: the devices of this process and the copies to and from them.

See the package docstring (`trax_revplus.placement`) for the layouts. Each
value is placed by its rule (`rules`), and the types placed values will have,
for compiling ahead of time, come from the same rules (`ahead_of_time`).
"""

from typing import Any, Callable, List, Sequence, Tuple

import jax
from jax.sharding import Mesh
import numpy as np

from trax_revplus import memory
from trax_revplus import validation
from trax_revplus.placement import ahead_of_time
from trax_revplus.placement import freeing
from trax_revplus.placement import host_copy
from trax_revplus.placement import layouts
from trax_revplus.placement import processes as processes_lib
from trax_revplus.placement import rules
from trax_revplus.placement import to_device
from trax_revplus.placement.layouts import AXIS_NAME
from trax_revplus.typing import Array, HostArray, PRNGKey, PyTree


class Placement:
  """Puts pytrees on N devices, brings them back, frees device memory.

  The N devices are the first `n_devices` of this process, or in a
  multi-process run (`jax.process_count() > 1`) all devices of all
  processes: each process then places and reads only its own part of each
  array (`processes.Processes`), and a per-device value read on the host is
  global device 0's on every process.

  Attributes:
    devices: list of this process's `jax.Device`s used (L of them).
    n_devices: int, N: devices of the mesh, all processes together.
    n_local_devices: int, L (N in a single-process run).
    processes: `processes.Processes` in a multi-process run, else None.
    platform: str, e.g. 'cpu', 'gpu', 'tpu'.
    mesh: `jax.sharding.Mesh` over `devices` with axis 'batch' (N > 1), or
      None.
    shardings: `rules.Shardings`, what the placement rules read.
    transfers: `memory.TransferCounter` that every H2D and D2H copy issued
      here is added to (bytes handed to the device APIs; on the CPU backend
      the runtime may alias instead of copying).
    sync_collectives: bool, whether callers must wait for every program with
      cross-device collectives before dispatching the next one. True on the
      CPU backend with N > 1: its devices share one host thread pool, and two
      queued programs with all-reduces can each hold a thread the other
      needs, which deadlocks (observed with 2 host cores and forced host
      devices).
  """

  def __init__(
    self,
    n_devices: int | None = None,
    transfer_counter: memory.TransferCounter | None = None,
  ):
    """Creates a placement over the first `n_devices` local devices.

    Args:
      n_devices: int >= 1 or None (all local devices).
      transfer_counter: `memory.TransferCounter` or None (a new one).

    Raises:
      ValueError: `n_devices` is < 1 or more than the local devices; in a
        multi-process run, not None nor the local device count.
    """
    self.transfers = transfer_counter or memory.TransferCounter()
    self.processes: processes_lib.Processes | None = None
    if jax.process_count() > 1:
      self._init_processes(n_devices)
      return
    local = jax.local_devices()
    n = len(local) if n_devices is None else int(n_devices)
    if n < 1 or n > len(local):
      raise ValueError(
        f'n_devices={n_devices!r} but this process has {len(local)} local '
        f'device(s) ({local[0].platform}); pass n_devices between 1 and '
        f'{len(local)}, or on CPU set XLA_FLAGS='
        f'--xla_force_host_platform_device_count={n} before importing jax.'
      )
    self.devices = list(local[:n])
    self.n_devices = self.n_local_devices = n
    self.platform = self.devices[0].platform
    self.sync_collectives = self.platform == 'cpu' and n > 1
    self.host_is_device = self.platform == 'cpu' and n == 1
    self.mesh = Mesh(np.array(self.devices), (AXIS_NAME,)) if n > 1 else None
    self.shardings = rules.shardings(
      self.devices, self.mesh, n, self.host_is_device
    )

  def _init_processes(self, n_devices):
    """The mesh over every process's devices (see `processes`)."""
    self.processes = processes_lib.Processes(n_devices)
    self.devices = self.processes.local_devices
    self.n_local_devices = len(self.devices)
    self.n_devices = self.processes.n_global
    self.platform = self.devices[0].platform
    # With one device per process, still a mesh (and shard_map): the
    # gradients are averaged over the processes.
    self.sync_collectives = self.platform == 'cpu'
    self.host_is_device = False
    self.mesh = self.processes.mesh
    self.shardings = rules.shardings(
      self.devices, self.mesh, self.n_devices, self.host_is_device
    )

  def _put(self, tree, rule, prepare=None):
    """`to_device.put` to this placement's devices, counted here."""
    return to_device.put(
      tree, rule, self.shardings, self.transfers, self.processes, prepare
    )

  def memory_limit_bytes(self) -> int | None:
    """The bytes each device's allocator may hand out, where the backend
    reports it: the least over this process's devices of
    `memory_stats()['bytes_limit']` (GPU, TPU); None where it does not
    (CPU)."""
    limits = []
    for device in self.devices:
      try:
        stats = device.memory_stats()
      except Exception:  # pylint: disable=broad-except
        stats = None  # A backend without memory statistics.
      limit = (stats or {}).get('bytes_limit')
      if not limit:
        return None
      limits.append(int(limit))
    return min(limits) if limits else None

  def replicate(self, tree: PyTree) -> PyTree:
    """Places `tree` whole on every device (weights, slots, opt params).

    Mirrors trax's `tl.on_accelerator` (1 device) and `tl.for_n_devices`
    (N devices), without the leading device axis on N devices.

    Args:
      tree: pytree of host arrays (numpy or Python scalars) or device arrays.

    Returns:
      The pytree with `jax.Array` leaves, same shapes and dtypes.
    """
    return self._put(tree, rules.replicated)

  def place_params(self, tree: PyTree) -> PyTree:
    """Readies host weights, slots or state for a compiled call.

    Like `replicate`, except on one CPU device (`host_is_device`), where
    the host arrays are returned unchanged: the compiled call copies them
    into its own buffers, so donating those never touches the host arrays.
    H2D bytes are counted either way.

    Args:
      tree: pytree of host arrays (numpy or Python scalars) or device arrays.

    Returns:
      The pytree, ready to pass to a function compiled for these devices.
    """
    return self._put(tree, rules.params)

  def per_device(self, tree: PyTree) -> PyTree:
    """Places a copy of a host value on each device in per-device layout.

    Used for layer state, which trax replicates with `tl.for_n_devices` and
    which may then diverge between devices.

    Args:
      tree: pytree of arrays of shape S.

    Returns:
      The pytree with leaves of shape (N,) + S on N > 1 devices, S on one
      (host arrays unchanged on one CPU device, see `place_params`).
    """
    if self.n_devices == 1:
      return self._put(tree, rules.per_device)
    return self._put(
      tree,
      rules.per_device,
      prepare=lambda x, target: np.broadcast_to(
        np.asarray(x), target.local_shape
      ),
    )

  def shard_batch(self, batch: PyTree) -> PyTree:
    """Splits a host batch over devices along its leading (batch) axis.

    Mirrors trax's `tl.reshape_by_device`.

    Args:
      batch: pytree of arrays of shape (B, ...).

    In a multi-process run `batch` is this process's rows of the global
    batch (B / P of them, `trax_revplus.data`), split over its L devices.

    Returns:
      The pytree with leaves of shape (N, B // N, ...) in per-device layout
      on N > 1 devices; unchanged shapes on one device.

    Raises:
      validation.BatchSizeError: N (L: local rows) does not divide B, or a
        leaf has no leading axis (`validation.check_batch`).
    """
    if self.n_devices == 1:
      return self._put(batch, rules.batch)
    n = self.n_local_devices
    # The trainer ran this check before any work; a batch given here
    # directly gets the same error, with its fix.
    validation.check_batch(tuple(jax.tree_util.tree_leaves(batch)), n)

    def split(x, target):
      return np.asarray(x).reshape(target.local_shape)

    return self._put(batch, rules.batch, prepare=split)

  def place_rngs(self, rng: PRNGKey | HostArray, n_layers: int) -> List[Array]:
    """Per-layer RNGs of a step, as trax splits them: `split(rng,
    n_layers)`; on N devices each device first splits its own key.

    Args:
      rng: PRNG key (uint32[2]) of the step, a JAX or numpy array.
      n_layers: int.

    Returns:
      List of n_layers placed keys: uint32[2] on one device, uint32[N, 2]
      in per-device layout on N.
    """
    n = self.n_devices
    if n == 1:
      rows = np.asarray(jax.random.split(rng, n_layers))
      return self.place_params(list(rows))
    per_device = jax.random.split(jax.numpy.asarray(np.asarray(rng)), n)
    table = np.stack(
      [np.asarray(jax.random.split(r, n_layers)) for r in per_device], axis=1
    )  # (layers, devices, 2)
    return self.per_device_rows(list(table))

  def per_device_rows(self, rows: Sequence[HostArray]) -> List[Array]:
    """Places a list of host arrays of shape (N, ...) in per-device layout."""
    if self.processes is None:
      return self._put(list(rows), rules.rows)
    return self._put(
      list(rows),
      rules.rows,
      prepare=lambda x, target: self.processes.local_rows(x),
    )

  # The same rules' types, for compiling ahead (`ahead_of_time`).

  def abstract_params(self, tree: PyTree) -> PyTree | None:
    """What `place_params(tree)` would pass to a compiled call,
    untransferred (`ahead_of_time.types`: None if a leaf is neither a host
    `numpy.ndarray` nor a device array)."""
    return ahead_of_time.types(self.shardings, rules.params, tree)

  def abstract_per_device(self, tree: PyTree) -> PyTree | None:
    """What `per_device(tree)` would pass to a compiled call, untransferred
    (as `abstract_params`)."""
    return ahead_of_time.types(self.shardings, rules.per_device, tree)

  def abstract_batch(self, batch: PyTree) -> PyTree:
    """What `shard_batch(batch)` would give, untransferred; `batch` may hold
    `jax.ShapeDtypeStruct`s (`ahead_of_time.batch_types`)."""
    return ahead_of_time.batch_types(self.shardings, batch)

  def per_device_types(self, tree: PyTree) -> PyTree:
    """Traced result types with the per-device sharding where they have
    none (`ahead_of_time.per_device_types`)."""
    return ahead_of_time.per_device_types(self.shardings, tree)

  def replicated(self, tree: PyTree) -> PyTree:
    """`tree` readable on every process (`processes.Processes.replicated`);
    itself in a single-process run."""
    if self.processes is None:
      return tree
    return self.processes.replicated(tree)

  def start_to_host(
    self, tree: PyTree, per_device: bool = False
  ) -> host_copy.HostCopy:
    """Starts async device-to-host copies of one replica of `tree`.

    Mirrors trax's `_lazy_unreplicate`: takes device 0's value and calls
    `copy_to_host_async` on it, so the copy overlaps later device work. On
    the CPU backend no copy is started: the buffer is in host memory, and
    `collect` returns numpy views of it (see `HostCopy`).

    Args:
      tree: pytree of device arrays in replicated (default) or per-device
        layout.
      per_device: bool, whether `tree` is in per-device layout (the leading
        device axis is dropped on N > 1 devices).

    Returns:
      `HostCopy`; its `collect()` returns the pytree with numpy leaves.
    """
    if per_device:
      tree = self.replicated(tree)  # Device 0's value on every process.
    return host_copy.start(
      tree,
      self.transfers,
      self.n_devices > 1,
      self.platform == 'cpu',
      per_device,
    )

  def to_host(self, tree: PyTree, per_device: bool = False) -> PyTree:
    """Synchronous `start_to_host(...).collect()`: numpy leaves."""
    return self.start_to_host(tree, per_device).collect()

  def gather_to_host(self, tree: PyTree) -> PyTree:
    """Copies every device's data to host (per-device arrays keep axis N).

    In a multi-process run, arrays spanning other processes' devices stay
    where they are (a host copy of them could not be passed back).
    """
    return host_copy.gather(tree, self.transfers)

  def on_host_device(self, tree: PyTree) -> PyTree:
    """Host arrays as `jax.Array`s on the CPU device (trax's `tl.on_cpu`).

    No device memory is used; on the CPU backend numpy buffers may be shared.
    """
    # jax.devices('cpu')[0] is process 0's in a multi-process run.
    cpu = jax.local_devices(backend='cpu')[0]
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    where = [
      i
      for i, x in enumerate(leaves)
      if isinstance(x, (np.ndarray, np.generic, jax.Array))
    ]
    if where:
      placed = jax.device_put([leaves[i] for i in where], cpu)
      for i, x in zip(where, placed):
        leaves[i] = x
    return jax.tree_util.tree_unflatten(treedef, leaves)

  def block(self, tree: PyTree) -> PyTree:
    """Waits for all device arrays in `tree`; returns `tree`."""
    return jax.block_until_ready(tree)

  def free_device_buffers(self, keep: PyTree) -> Tuple[int, int]:
    """Releases this placement's device buffers that nothing alive can read.

    See `freeing.free_device_buffers`.

    Args:
      keep: pytree (or list of pytrees) of everything the caller still uses.

    Returns:
      (freed_arrays, freed_bytes): ints, device arrays released and their
      bytes, summed over the devices of this placement.
    """
    return freeing.free_device_buffers(self.devices, keep)

  def jit(
    self,
    fn: Callable[..., Any],
    in_layouts: Sequence[layouts.Layout],
    out_layouts: Sequence[layouts.Layout],
    donate_argnums: Tuple[int, ...] = (),
    collectives: bool = False,
  ) -> Callable[..., Any]:
    """Compiles `fn` to run on this placement's devices (`layouts.jit`)."""
    return layouts.jit(
      fn,
      in_layouts,
      out_layouts,
      self.mesh,
      donate_argnums=donate_argnums,
      wait=self.sync_collectives and collectives,
    )
