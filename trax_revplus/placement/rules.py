"""Where each kind of placed value goes: one function per placement rule.

A rule maps an array's host shape to its `Target`: the global shape and
sharding the placed array will have. `devices.Placement` places arrays by
these rules (`jax.device_put(x, target.sharding)`), and `ahead_of_time`
gives the types compiling ahead needs from the very same rules
(`jax.ShapeDtypeStruct(target.shape, dtype, sharding=target.sharding)`),
so the planner's figures are those of the arrays the step places.

  replicated  weights, slots, optimizer hyperparameters, the step: whole on
              every device (`Layout.REPLICATED`).
  params      as `replicated`, except on one CPU device, where host arrays
              stay on the host (the compiled call copies them itself).
  per_device  a host value copied to each device (layer state), global
              shape (N,) + S on N > 1 devices (`Layout.PER_DEVICE`).
  batch       a host batch split over the devices along its rows.
  rows        host rows, one per device, of shape (N, ...) (RNG keys).
"""

from typing import Callable, NamedTuple, Sequence

import jax
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import SingleDeviceSharding

from trax_revplus.placement.layouts import Layout


class Shardings(NamedTuple):
  """What the rules read of a placement.

  Attributes:
    replicated: `jax.sharding.Sharding` of `Layout.REPLICATED` values.
    per_device: `jax.sharding.Sharding` of `Layout.PER_DEVICE` values (the
      replicated one on one device).
    n_devices: int N, devices of the mesh, all processes together.
    n_local_devices: int L, this process's devices.
    host_is_device: bool, one CPU device, whose compiled calls take host
      arrays as they are.
  """

  replicated: jax.sharding.Sharding
  per_device: jax.sharding.Sharding
  n_devices: int
  n_local_devices: int
  host_is_device: bool


def shardings(
  devices: Sequence[jax.Device],
  mesh: Mesh | None,
  n_devices: int,
  host_is_device: bool,
) -> Shardings:
  """The `Shardings` of this process's `devices` and the `mesh` over all
  processes' devices (None: one device, no mesh)."""
  if mesh is None:
    one = SingleDeviceSharding(devices[0])
    return Shardings(one, one, n_devices, len(devices), host_is_device)
  return Shardings(
    NamedSharding(mesh, Layout.REPLICATED.partition_spec),
    NamedSharding(mesh, Layout.PER_DEVICE.partition_spec),
    n_devices,
    len(devices),
    host_is_device,
  )


class Target(NamedTuple):
  """Where a rule puts one array.

  Attributes:
    shape: tuple of int, the placed (global) array's shape.
    sharding: its `jax.sharding.Sharding`.
    local_shape: tuple of int, the part of it this process's host array
      becomes before it is placed (`shape` in a single-process run).
    copies: int, this process's devices that each receive the whole host
      array (for counting H2D bytes).
  """

  shape: tuple
  sharding: jax.sharding.Sharding
  local_shape: tuple
  copies: int


# A rule: (Shardings, host shape) -> Target, or None where the array is not
# placed (its host array is what the compiled call receives).
Rule = Callable[[Shardings, tuple], Target | None]


def replicated(s: Shardings, shape: tuple) -> Target:
  """The whole array on every device; global shape `shape`."""
  shape = tuple(shape)
  return Target(shape, s.replicated, shape, s.n_local_devices)


def params(s: Shardings, shape: tuple) -> Target | None:
  """Weights, slots or state a compiled call takes: `replicated`, or None
  on one CPU device (`Shardings.host_is_device`)."""
  return None if s.host_is_device else replicated(s, shape)


def _split(s: Shardings, shape: tuple) -> Target:
  """Per-device layout of an array whose rows are the devices'."""
  shape = tuple(shape)
  local = (s.n_local_devices,) + shape[1:] if s.n_devices > 1 else shape
  return Target(shape, s.per_device, local, 1)


def per_device(s: Shardings, shape: tuple) -> Target | None:
  """A copy of a host value of shape S on each device: global shape
  (N,) + S on N > 1 devices, S on one; None on one CPU device."""
  if s.host_is_device:
    return None
  shape = tuple(shape)
  return _split(s, (s.n_devices,) + shape if s.n_devices > 1 else shape)


def batch(s: Shardings, shape: tuple) -> Target:
  """This process's host rows (B, ...) split over its L devices: global
  shape (N, B // L, ...) on N > 1 devices, (B, ...) on one."""
  shape = tuple(shape)
  if s.n_devices > 1 and shape:  # A 0-d leaf is refused where it is split.
    shape = (s.n_devices, shape[0] // s.n_local_devices) + shape[1:]
  return _split(s, shape)


def rows(s: Shardings, shape: tuple) -> Target:
  """Host rows of shape (N, ...), row d on device d (in a multi-process
  run each process holds its L rows)."""
  return _split(s, shape)
