"""The two layouts of a value on N devices, and functions run per device."""

import enum
import functools
from typing import Any, Callable, Optional, Sequence, Tuple

import jax
from jax.sharding import PartitionSpec

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
  def partition_spec(self):
    """The `jax.sharding.PartitionSpec` of this layout on the 'batch' mesh."""
    if self is Layout.PER_DEVICE:
      return PartitionSpec(AXIS_NAME)
    return PartitionSpec()


def jit(fn: Callable[..., Any], in_layouts: Sequence[Layout],
        out_layouts: Sequence[Layout], mesh: Optional[jax.sharding.Mesh],
        donate_argnums: Tuple[int, ...] = (),
        wait: bool = False) -> Callable[..., Any]:
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

  Returns:
    The compiled function: a `jax.jit` function, or where calls wait, a
    function that calls one and waits, with the `jax.jit` function's
    `trace`.
  """
  if mesh is None:
    return jax.jit(fn, donate_argnums=donate_argnums)
  squeeze = lambda t: jax.tree_util.tree_map(lambda x: x[0], t)
  expand = lambda t: jax.tree_util.tree_map(lambda x: x[None], t)

  def per_device(*args):
    args = [squeeze(a) if k is Layout.PER_DEVICE else a
            for a, k in zip(args, in_layouts)]
    outs = fn(*args)
    return tuple(expand(o) if k is Layout.PER_DEVICE else o
                 for o, k in zip(outs, out_layouts))
  compiled = jax.jit(
      jax.shard_map(per_device, mesh=mesh,
                    in_specs=tuple(k.partition_spec for k in in_layouts),
                    out_specs=tuple(k.partition_spec for k in out_layouts),
                    check_vma=False),
      # Named result shardings (the ones shard_map gives them anyway), so
      # that a trace's result types carry them: a walk ahead of the step
      # then knows a replicated result from a per-device one.
      out_shardings=tuple(jax.sharding.NamedSharding(mesh, k.partition_spec)
                          for k in out_layouts),
      donate_argnums=donate_argnums)
  return _waiting(compiled) if wait else compiled


def _waiting(fn):
  """Waits for each call's results (see `Placement.sync_collectives`).

  Its `trace` is `fn`'s: the types of a call's arguments and results, and
  its program, do not depend on the wait, so the walk ahead of a step
  compiles and accounts it as any other.
  """
  @functools.wraps(fn)
  def call(*args):
    return jax.block_until_ready(fn(*args))
  call.trace = fn.trace
  return call
