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

Stock's own trainer, run as the baseline ours is compared with, gets the
one fix without which its step cannot run on an accelerator on current
JAX, within `stock_baseline()` (`STOCK_BASELINE`: how it is labelled).
"""

import contextlib
import threading
import weakref
from typing import Any, Callable, Iterator, Sequence

from absl import logging
import jax
import numpy as np
from trax import fastmath
from trax import layers as tl
from trax.optimizers import trainer as stock_trainer

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


# What `stock_baseline` changes, as a run's banner and `compare` say it.
STOCK_BASELINE = "its Loop's RNG on the step's device"
# Stock's trainer class: this module is imported (by `swap`) before
# `activate()` can bind trax_revplus's class to the name.
_STOCK_TRAINER = stock_trainer.ReversibleSerialTrainer
_baseline_lock = threading.Lock()
_baseline_depth = 0
_stock_one_step: Callable[..., Any] | None = None
# Stock trainers that ran a step with the fix (`stock_baseline_fix`).
_baseline_trainers: weakref.WeakSet[Any] = weakref.WeakSet()


def _one_step_with_rng_on_device(
  stock_one_step: Callable[..., Any],
) -> Callable[..., Any]:
  """Stock's `one_step` with its `rng` first placed as stock places the
  step's weights (`tl.on_accelerator`)."""

  def one_step(
    trainer: Any,
    batch: Any,
    rng: PRNGKey,
    step: int = 0,
    learning_rate: Any = None,
  ) -> Any:
    _baseline_trainers.add(trainer)
    return stock_one_step(
      trainer, batch, tl.on_accelerator(rng), step, learning_rate
    )

  one_step.__doc__ = stock_one_step.__doc__
  return one_step


@contextlib.contextmanager
def stock_baseline() -> Iterator[None]:
  """Meanwhile, stock's `ReversibleSerialTrainer.one_step` takes the Loop's
  RNG on the device its step runs on; nothing else of stock changes.

  trax 1.4.1's memory-efficient `Loop` keeps its RNG in host memory
  (`Loop.new_rng` puts each key `on_cpu`) and hands it to stock's
  `ReversibleSerialTrainer.one_step`, which on one device splits it and
  passes the keys to layer programs whose weights it placed on the
  accelerator (`tl.on_accelerator`). The JAX of trax's time moved the key
  along; current JAX refuses a call on arrays committed to two devices
  ("Received incompatible devices for jitted computation"), so without
  this stock's first step fails on a TPU or GPU. On the CPU (no
  accelerator), or with several accelerators (stock moves the key to the
  host itself), `tl.on_accelerator` returns the key as given. Nested blocks
  share one binding, undone when the outermost ends.
  """
  global _baseline_depth, _stock_one_step
  with _baseline_lock:
    if _baseline_depth == 0:
      _stock_one_step = _STOCK_TRAINER.one_step
      _STOCK_TRAINER.one_step = _one_step_with_rng_on_device(_stock_one_step)
    _baseline_depth += 1
  try:
    yield
  finally:
    with _baseline_lock:
      _baseline_depth -= 1
      if _baseline_depth == 0:
        _STOCK_TRAINER.one_step = _stock_one_step
        _stock_one_step = None


def stock_baseline_fix(trainers: Sequence[Any]) -> str | None:
  """`STOCK_BASELINE` where the first of `trainers` ran a step within
  `stock_baseline()`, else None."""
  trainers = list(trainers)
  if trainers and trainers[0] in _baseline_trainers:
    return STOCK_BASELINE
  return None
