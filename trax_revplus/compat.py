"""trax 1.4.1 helpers that break on current JAX, rewritten for it.

`activate()` binds these in place of trax's own (and `deactivate()` restores
trax's), alongside the reversible layers and trainer, so that the paths a
memory-efficient `training.Loop` takes work on current JAX and call no
deprecated JAX API (which warns now and will be removed):

  trax                                   deprecated JAX call
  training.init_host_and_devices         jax.host_count()
  acceleration._accelerate (n_devices=0:  jax.jit(f, device=cpu)
    trax's memory-efficient Loop's evals;
    with trax_revplus's trainer they run
    on its device instead, `evaluation`)

and so that they work in a multi-process run (`jax.distributed`), where
`jax.devices('cpu')[0]` is process 0's CPU device on every process:

  acceleration.on_cpu (`tl.on_cpu`: the   jax.device_put(x,
    memory-efficient Loop's RNG, eval       jax.devices('cpu')[0])
    weights)

jax itself is left as it is: only the names trax's modules call are bound.
"""

from typing import Any, Callable, Sequence

from absl import logging
import jax
import numpy as np
from trax import fastmath

from trax_revplus.multiprocess import training as processes
from trax_revplus.trax_door import functions as trax_functions
from trax_revplus.typing import PRNGKey
from trax_revplus.typing import PyTree


def tree_unflatten(
  flat: Sequence[Any], tree: PyTree, copy_from_tree: Sequence[Any] | None = None
) -> tuple[PyTree, Sequence[Any]]:
  """Builds a tree shaped as `tree` from the leaves `flat`.

  Mirrors `trax.fastmath.tree_unflatten`, which `Loop.load_checkpoint` uses
  to restore optimizer slots. trax's version tests `tree in copy_from_tree`
  for every leaf; on current JAX `jax.Array == ()` raises `TypeError` and a
  `numpy.ndarray` compares elementwise, so no checkpoint with slots could be
  restored. Array leaves (anything with a `shape`) are never copied from
  `tree`; other leaves are copied when they are, or equal a value of the same
  type in, `copy_from_tree`.

  Args:
    flat: Sequence of leaves, in the order `trax.fastmath.tree_flatten`
      yields them.
    tree: Nested tuples, lists and dicts giving the structure.
    copy_from_tree: Optional list of values (e.g. `[None, ()]`) that are kept
      from `tree` instead of taken from `flat`.

  Returns:
    `(new_tree, rest)`: the tree with leaves from `flat`, and the leaves of
    `flat` left over.
  """
  if (
    copy_from_tree is not None
    and not hasattr(tree, 'shape')
    and any(
      tree is c or (type(tree) is type(c) and tree == c) for c in copy_from_tree
    )
  ):
    return tree, flat
  if isinstance(tree, (list, tuple)):
    new_tree, rest = [], flat
    for t in tree:
      new_t, rest = tree_unflatten(rest, t, copy_from_tree=copy_from_tree)
      new_tree.append(new_t)
    return (tuple(new_tree) if isinstance(tree, tuple) else new_tree), rest
  if isinstance(tree, dict):
    new_dict, rest = {}, flat
    for k in tree:
      new_dict[k], rest = tree_unflatten(rest, tree[k], copy_from_tree)
    return new_dict, rest
  return flat[0], flat[1:]


def for_n_devices(x: PyTree, n_devices: int) -> PyTree:
  """Replicates `x` for `n_devices`: each leaf gets a leading device axis.

  Mirrors `trax.layers.acceleration.for_n_devices`, which calls the removed
  `jax.device_put_replicated` when `n_devices > 1`. The host copy this
  returns (a read-only `numpy` broadcast view, no bytes copied) is what
  `jax.pmap`, the consumer in trax's `Loop` and `Accelerate`, takes.

  Args:
    x: Pytree of arrays (numpy or jax) or scalars.
    n_devices: Number of devices, an int >= 1.

  Returns:
    `x` itself when `n_devices == 1`; otherwise a pytree of the same
    structure whose leaves have shape `(n_devices,) + leaf.shape`.
  """
  if n_devices <= 1:
    return x

  def replicate(leaf):
    leaf = np.asarray(leaf)
    return np.broadcast_to(leaf, (n_devices,) + leaf.shape)

  return fastmath.nested_map(replicate, x)


def init_host_and_devices(
  n_devices: int | None = None, random_seed: int | None = None
) -> tuple[bool, int, int, PRNGKey]:
  """Host index and count, devices and the first RNG of a `training.Loop`.

  Mirrors `trax.supervised.training.init_host_and_devices`, which every
  `Loop` calls first, with `jax.process_count()` in place of the deprecated
  `jax.host_count()`.

  Args:
    n_devices: int or None; None means all local devices.
    random_seed: int or None; None on several hosts: process 0's seed from
      the time, the same on every host (trax derives a different one per
      host, then averages the initial weights over the hosts).

  Returns:
    `(is_chief, host_count, n_devices, rng)`: bool (process 0), int, int,
    and the JAX PRNG key seeded as trax seeds it.

  Raises:
    ValueError: n_devices is not the local device count (as trax, on JAX).
  """
  if fastmath.is_backend(fastmath.Backend.JAX):
    host_id = jax.process_index()
    host_count = jax.process_count()
  else:
    host_id = 0
    host_count = 1
  is_chief = host_id == 0
  logging.info(
    'Initializing hosts and devices: host_id %d, host_count %d, is_chief %d',
    host_id,
    host_count,
    is_chief,
  )
  device_count = fastmath.local_device_count()
  n_devices = n_devices or device_count
  if n_devices != device_count and fastmath.is_backend(fastmath.Backend.JAX):
    raise ValueError(
      'JAX cannot work yet with n_devices != all devices: '
      '%d != %d' % (n_devices, device_count)
    )
  if random_seed is None and host_count > 1:
    random_seed = processes.shared_random_seed()
  return (
    is_chief,
    host_count,
    n_devices,
    trax_functions.init_random_number_generators(random_seed),
  )


def accelerate(f: Callable[..., Any], n_devices: int) -> Callable[..., Any]:
  """`f` compiled for `n_devices` (0: on the CPU, whatever else is present).

  Mirrors `trax.layers.acceleration._accelerate`, behind `tl.jit_forward`,
  which trax's memory-efficient `Loop` calls with `n_devices=0` for its
  evals (with trax_revplus's trainer the `Loop` evaluates on the trainer's
  device instead: `evaluation.DeviceEvaluator`).
  For 0, trax calls `jax.jit(f, device=jax.devices('cpu')[0])`, deprecated;
  here the arguments are placed on the CPU device and the computation follows
  them, as JAX advises. Other counts compile as in trax: `jit` for 1, `pmap`
  over a 'batch' axis above.

  Args:
    f: the function, e.g. a layer's `pure_fn`.
    n_devices: int >= 0.

  Returns:
    The compiled function, same signature as `f`.
  """
  if n_devices == 1:
    return fastmath.jit(f)
  if n_devices > 1:
    return fastmath.pmap(f, axis_name='batch')
  compiled = fastmath.jit(f)
  cpu = local_cpu_device()

  def on_cpu(*args, **kwargs):
    args, kwargs = jax.device_put((args, kwargs), cpu)
    return compiled(*args, **kwargs)

  return on_cpu


def local_cpu_device() -> jax.Device:
  """This process's CPU device (`jax.devices('cpu')[0]` is process 0's)."""
  return jax.local_devices(backend='cpu')[0]


def on_cpu(x: PyTree) -> PyTree:
  """Puts `x` in this process's CPU memory (host), as JAX arrays.

  Mirrors `trax.layers.acceleration.on_cpu` (`tl.on_cpu`), which places
  on `jax.devices('cpu')[0]`: in a multi-process run that is process 0's
  device, and on any other process the value placed there cannot be read.

  Args:
    x: pytree of arrays (numpy or JAX) or scalars.

  Returns:
    The pytree with `jax.Array` leaves on this process's CPU device (with
    another backend than JAX's, `x` itself, as trax).
  """
  if not fastmath.is_backend(fastmath.Backend.JAX):
    return x
  return jax.device_put(x, local_cpu_device())
