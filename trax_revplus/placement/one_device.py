"""`OneDevice`: values placed whole on one device, and released after use.

Where a computation runs on one device of a placement (trax's evals, which
a memory-efficient `Loop` runs on the whole eval batch), its arguments are
placed there, committed, so that the compiled program runs on that device
(not on JAX's default device, nor on the host's CPU device); the copies are
deleted once the computation is done (`freeing.delete_copies`), so that
what the device holds between steps does not grow by an eval's weights.
"""

from typing import Any

import jax
from jax.sharding import SingleDeviceSharding

from trax_revplus import memory
from trax_revplus.placement import freeing
from trax_revplus.placement import to_device
from trax_revplus.typing import PyTree


class OneDevice:
  """Places pytrees whole on one device, gives their types, frees copies.

  Attributes:
    device: the `jax.Device`.
    sharding: `jax.sharding.SingleDeviceSharding` of it.
  """

  def __init__(
    self, device: jax.Device, transfers: memory.TransferCounter | None = None
  ):
    """Args:
    device: the `jax.Device` values go to.
    transfers: `memory.TransferCounter` H2D copies are added to, or None.
    """
    self.device = device
    self.sharding = SingleDeviceSharding(device)
    self._transfers = transfers

  def _here(self, x) -> bool:
    return isinstance(x, jax.Array) and x.sharding == self.sharding

  def types(self, tree: PyTree) -> PyTree:
    """What `put(tree)` would give, as `jax.ShapeDtypeStruct`s committed to
    the device (weak types as `jax.device_put` gives them); nothing is
    placed or copied.

    Args:
      tree: pytree of arrays (numpy or JAX) and Python scalars.
    """
    shapes = jax.eval_shape(lambda t: t, tree)

    def typed(x, shape):
      sharding = x.sharding if self._here(x) else self.sharding
      return jax.ShapeDtypeStruct(
        shape.shape, shape.dtype, sharding=sharding, weak_type=shape.weak_type
      )

    return jax.tree_util.tree_map(typed, tree, shapes)

  def put(self, tree: PyTree) -> tuple[PyTree, list[jax.Array]]:
    """Places `tree`'s leaves on the device, in one `jax.device_put`.

    Args:
      tree: pytree of arrays (numpy or JAX) and Python scalars.

    Returns:
      (placed tree, the copies it made): arrays already on the device are
      passed as they are, and are not among the copies.
    """
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    moving = [i for i, x in enumerate(leaves) if not self._here(x)]
    copies = jax.device_put([leaves[i] for i in moving], self.sharding)
    if self._transfers is not None:
      h2d = sum(to_device.host_nbytes(leaves[i]) for i in moving)
      if h2d:
        self._transfers.add_h2d(h2d)
    for i, x in zip(moving, copies):
      leaves[i] = x
    return jax.tree_util.tree_unflatten(treedef, leaves), list(copies)

  def release(self, copies: list[jax.Array], sources: Any) -> int:
    """Deletes the device buffers of `copies` that `put(sources)` made
    (`freeing.delete_copies`); returns the bytes released."""
    return freeing.delete_copies(copies, sources)
