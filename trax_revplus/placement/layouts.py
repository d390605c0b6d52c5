"""The two layouts of a value on N devices, and functions run per device."""

import enum
import functools
from typing import Any, Callable, Sequence, Tuple

import jax
from jax.sharding import PartitionSpec
import numpy as np

AXIS_NAME = 'batch'


class Layout(enum.Enum):
  """How a value of a compiled per-device call lies on N devices.

  REPLICATED: the whole value on every device (weights, slots, optimizer
    hyperparameters, the step); global shape S.
  PER_DEVICE: one slice per device (activations, cotangents, state, RNGs,
    statistics); global shape (N,) + S, device d holds slice d.
  """

  REPLICATED = 'r'
  PER_DEVICE = 'd'

  @property
  def partition_spec(self) -> PartitionSpec:
    """The `jax.sharding.PartitionSpec` of this layout on the 'batch' mesh."""
    if self is Layout.PER_DEVICE:
      return PartitionSpec(AXIS_NAME)
    return PartitionSpec()


def jit(
  fn: Callable[..., Any],
  in_layouts: Sequence[Layout],
  out_layouts: Sequence[Layout],
  mesh: jax.sharding.Mesh | None,
  donate_argnums: Tuple[int, ...] = (),
  wait: bool = False,
) -> Callable[..., Any]:
  """Compiles `fn` to run once per device of `mesh`, as `jax.pmap` would.

  Without a mesh (one device) `jax.jit(fn)`. With one, `fn` runs as a
  `jax.shard_map` over the 'batch' axis: a PER_DEVICE argument of global
  shape (N,) + S reaches `fn` with shape S, a REPLICATED one whole, and its
  results go back the same way.

  Args:
    fn: function of positional pytree arguments, returning a tuple.
    in_layouts, out_layouts: sequences of `Layout`, one per argument / per
      result of `fn`.
    mesh: `jax.sharding.Mesh` with axis 'batch', or None for one device.
    donate_argnums: tuple of int, arguments whose device buffers a call may
      reuse for its results.
    wait: bool, each call waits for its results before returning (see
      `Placement.sync_collectives`).

  Cotangents of integer inputs (dtype `float0`) cross the function's
  boundary as empty arrays (`float0_as_empty`).

  Returns:
    The compiled function: a `jax.jit` function, or where calls wait, a
    function that calls one and waits, with the `jax.jit` function's
    `trace`.
  """
  fn = float0_as_empty(fn)
  if mesh is None:
    return jax.jit(fn, donate_argnums=donate_argnums)
  squeeze = lambda t: jax.tree_util.tree_map(lambda x: x[0], t)
  expand = lambda t: jax.tree_util.tree_map(lambda x: x[None], t)

  def per_device(*args):
    local_args = [
      squeeze(a) if k is Layout.PER_DEVICE else a
      for a, k in zip(args, in_layouts)
    ]
    outs = fn(*local_args)
    return tuple(
      expand(o) if k is Layout.PER_DEVICE else o
      for o, k in zip(outs, out_layouts)
    )

  compiled = jax.jit(
    jax.shard_map(
      per_device,
      mesh=mesh,
      in_specs=tuple(k.partition_spec for k in in_layouts),
      out_specs=tuple(k.partition_spec for k in out_layouts),
      check_vma=False,
    ),
    # Named result shardings (the ones shard_map gives them anyway), so
    # that a trace's result types carry them: a walk ahead of the step
    # then knows a replicated result from a per-device one.
    out_shardings=tuple(
      jax.sharding.NamedSharding(mesh, k.partition_spec) for k in out_layouts
    ),
    donate_argnums=donate_argnums,
  )
  return _Waiting(compiled) if wait else compiled


def _empty_of_float0(x):
  """A float0 leaf of shape S as an empty bool array of shape S + (0,)."""
  if getattr(x, 'dtype', None) == jax.dtypes.float0:
    return jax.numpy.zeros(tuple(x.shape) + (0,), bool)
  return x


def _float0_of_empty(x):
  """`_empty_of_float0`'s empty array as float0 zeros of shape S again."""
  shape: tuple[int, ...] = getattr(x, 'shape', ())
  if (
    getattr(x, 'dtype', None) == np.bool_ and len(shape) > 0 and shape[-1] == 0
  ):
    return np.zeros(tuple(shape[:-1]), jax.dtypes.float0)
  return x


def float0_as_empty(fn: Callable[..., Any]) -> Callable[..., Any]:
  """`fn` whose float0 results leave as empty bool arrays of shape S + (0,)
  (no bytes), and whose such arguments arrive as float0 zeros of shape S.

  A float0 result (the cotangent of an integer input: a batch's tokens,
  targets or weights) is no device buffer: JAX hands it back as a numpy
  array, and a call with a result that is not a device array never takes
  JAX's compiled dispatch path, so every call of the function paid Python's
  per-argument dispatch (about 50 us an argument; 0.19 s a step for a
  fused program of 64 blocks). The empty arrays carry the shape, which the
  next call's `vjp` needs, in a device array of no bytes. An argument that
  is a bool array whose last axis is 0 is taken for one.
  """

  @functools.wraps(fn)
  def wrapped(*args):
    args = jax.tree_util.tree_map(_float0_of_empty, args)
    return jax.tree_util.tree_map(_empty_of_float0, fn(*args))

  return wrapped


class _Waiting:
  """`fn` (a `jax.jit` function) that waits for each call's results (see
  `Placement.sync_collectives`).

  Its `trace` is `fn`'s: the types of a call's arguments and results, and
  its program, do not depend on the wait, so the walk ahead of a step
  compiles and accounts it as any other.
  """

  def __init__(self, fn: jax.stages.Wrapped):
    functools.update_wrapper(self, fn)
    self._fn = fn
    self.trace = fn.trace

  def __call__(self, *args: Any) -> Any:
    return jax.block_until_ready(self._fn(*args))
