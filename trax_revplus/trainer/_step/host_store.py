"""The trainer's layers and optimizers, and what lives on the host between uses.

Layers are indexed in forward order: block 0's standard layers (as one
`tl.Serial`), its reversible layers, block 1's standard layers, ..., the
loss layer last; index i is also the index of layer i's RNG (as trax).
Between steps every layer's weights and state and every optimizer's slots
are host `numpy.ndarray`s (`move_to_host`); optimizer hyperparameters stay
on the devices.
"""

from typing import Any, Callable

from absl import logging
import jax
import numpy as np
from trax import layers as tl
from trax.fastmath import numpy as jnp
from trax.optimizers import base as optimizer_base

from trax_revplus import memory
from trax_revplus import placement as placement_lib
from trax_revplus import state_shapes
from trax_revplus import validation
from trax_revplus.trainer._step import fingerprints
from trax_revplus.trainer._step import ties as ties_lib
from trax_revplus.typing import Array
from trax_revplus.typing import Blocks
from trax_revplus.typing import PyTree

_MIB = 2**20


def move_to_host(layer: tl.Layer) -> None:
  """Device arrays in `layer`'s weights and state become numpy arrays.

  Weights (state) holding no device array are not set again: an
  uninitialized trax layer may report `()` for weights whatever its
  sublayers (e.g. `ReversibleHalfResidual`), which its own setter rejects;
  trax's trainer accepts such layers, so this leaves them as they are.
  """
  if any(
    isinstance(x, jax.Array) for x in jax.tree_util.tree_leaves(layer.weights)
  ):
    layer.weights = placement_lib.to_numpy(layer.weights)
  if any(
    isinstance(x, jax.Array) for x in jax.tree_util.tree_leaves(layer.state)
  ):
    layer.state = placement_lib.to_numpy(layer.state)


class LayerStore:
  """Every layer with its optimizer; host weights, state and slots.

  Attributes:
    blocks: list of (standard layers as one `tl.Serial`, list of reversible
      layers), as given.
    layers: list of all layers by index (the loss layer last).
    optimizers: list of one optimizer per layer, by index.
    opt_params: list of each optimizer's hyperparameters, placed; equal
      ones are one placed copy, and a changed learning rate is placed once
      for all (`set_learning_rate`).
    init_records: list of dict, one memory-log 'init' record per layer
      (layer, layer_name, weights_bytes, slots_bytes, host_rss_added_bytes).
    ties: `ties.Ties`, the weights two layers share (one trax sublayer used
      in both, as the encoder-decoder `Reformer`'s embedding); `set` of the
      later layer, then of the earlier, leaves the earlier's update in both,
      as trax's backward pass does.
  """

  def __init__(
    self,
    blocks: Blocks,
    loss_layer: tl.Layer,
    optimizer_fn: Callable[[], optimizer_base.Optimizer],
    placement: placement_lib.Placement,
  ):
    """Makes one optimizer per layer and puts everything on the host.

    Args:
      blocks: list of (standard layers, reversible layers), initialized.
      loss_layer: the loss layer, initialized.
      optimizer_fn: optimizer factory, called once per layer.
      placement: `placement.Placement` for the hyperparameters.

    Raises:
      validation.OptimizerFactoryError: optimizer_fn does not return an
        `Optimizer`.
    """
    self._placement = placement
    self.blocks = [(tl.Serial(std), list(rev)) for (std, rev) in blocks]
    self.layers: list[tl.Layer] = []
    for std, revs in self.blocks:
      self.layers.append(std)
      self.layers.extend(revs)
    self.layers.append(loss_layer)

    def make_optimizer(layer):
      opt = validation.make_optimizer(optimizer_fn, len(opts))
      opt.tree_init(layer.weights)
      opt.slots = placement_lib.to_numpy(opt.slots)
      return opt

    init_records = []
    opts = []
    for i, layer in enumerate(self.layers):
      rss = memory.host_rss_bytes()
      move_to_host(layer)
      opts.append(make_optimizer(layer))
      init_records.append(
        dict(
          layer=i,
          layer_name=layer.name,
          weights_bytes=memory.array_bytes(layer.weights),
          slots_bytes=memory.array_bytes(opts[-1].slots),
          host_rss_added_bytes=memory.host_rss_bytes() - rss,
        )
      )
    self.optimizers = opts
    self.init_records = init_records
    self.ties = ties_lib.Ties.of_layers(self.layers)
    for r in init_records:
      logging.info(
        'init: layer %d %s: weights %.2f MiB, slots %.2f MiB, '
        'host RSS added %.2f MiB',
        r['layer'],
        r['layer_name'],
        r['weights_bytes'] / _MIB,
        r['slots_bytes'] / _MIB,
        r['host_rss_added_bytes'] / _MIB,
      )

    # Optimizer hyperparameters stay on the device between steps; only a
    # changed learning rate is placed again. Equal ones are placed once.
    placed_params = {}
    self.opt_params = []
    for opt in opts:
      key = fingerprints.of(opt.opt_params)
      if key not in placed_params:
        placed_params[key] = placement.replicate(opt.opt_params)
      self.opt_params.append(placed_params[key])
    # (host value, placed value).
    self._learning_rate: tuple[Any, Array] | None = None

  def block_sizes(self) -> list[int]:
    """Reversible layers per block (list of int)."""
    return [len(revs) for _, revs in self.blocks]

  def params_bytes(self) -> dict[int, int]:
    """dict layer index -> bytes of its weights + slots."""
    return {
      i: memory.array_bytes(layer.weights)
      + memory.array_bytes(self.optimizers[i].slots)
      for i, layer in enumerate(self.layers)
    }

  def host_bytes(self) -> int:
    """Bytes of every layer's host weights and state and every optimizer's
    slots, an array two layers share counted once."""
    leaves = jax.tree_util.tree_leaves(
      (
        [layer.weights for layer in self.layers],
        [layer.state for layer in self.layers],
        [opt.slots for opt in self.optimizers],
      )
    )
    return sum({id(x): memory.array_bytes(x) for x in leaves}.values())

  def params(
    self, indices: list[int], with_slots: bool
  ) -> tuple[list[PyTree], list[PyTree] | None]:
    """(weights, slots) of layers `indices`: lists; slots None without
    `with_slots`."""
    weights = [self.layers[i].weights for i in indices]
    if not with_slots:
      return weights, None
    return weights, [self.optimizers[i].slots for i in indices]

  def given_up(self) -> list[int]:
    """Indices of the layers whose weights or slots on the device were
    given up to a call (donated) whose update was never committed: a step
    that keeps them on the device (`plan.StepPlan.params_on_device`) and
    stopped on a non-finite value. Empty otherwise."""
    return [
      i
      for i, layer in enumerate(self.layers)
      if any(
        isinstance(x, jax.Array) and x.is_deleted()
        for x in jax.tree_util.tree_leaves(
          (layer.weights, self.optimizers[i].slots)
        )
      )
    ]

  def states(self, indices: list[int]) -> list[PyTree]:
    """List of the state of each of layers `indices`."""
    return [self.layers[i].state for i in indices]

  def get(self, i: int) -> tuple[PyTree, PyTree, PyTree]:
    """(weights, slots, state) of layer i."""
    layer = self.layers[i]
    return layer.weights, self.optimizers[i].slots, layer.state

  def set(self, i: int, weights: PyTree, slots: PyTree, state: PyTree) -> None:
    """Sets layer i's weights and state and its optimizer's slots."""
    self.layers[i].weights = weights
    self.optimizers[i].slots = slots
    self.set_state(i, state)

  def set_state(self, i: int, state: PyTree) -> None:
    """Sets layer i's state alone, in the shapes the layer holds it in
    (`state_shapes.conformed`: a trax layer that returns its state with an
    axis of size 1 more or less than it initialized it would otherwise hand
    every program a new argument shape at the next step)."""
    layer = self.layers[i]
    layer.state = state_shapes.conformed(state, layer.state)

  def trax_optimizers(
    self,
  ) -> list[
    tuple[optimizer_base.Optimizer, list[optimizer_base.Optimizer]]
    | optimizer_base.Optimizer
  ]:
    """Optimizers in trax's structure: [(std opt, [rev opts]), ..., loss]."""
    structured = []
    k = 0
    for _, revs in self.blocks:
      structured.append(
        (self.optimizers[k], self.optimizers[k + 1 : k + 1 + len(revs)])
      )
      k += 1 + len(revs)
    return structured + [self.optimizers[-1]]

  def set_learning_rate(
    self, learning_rate: float | np.ndarray | Array | None
  ) -> None:
    """Places a new learning rate once; the same value costs nothing.

    Args:
      learning_rate: float, array or None (keep the optimizers' own).
    """
    if learning_rate is None:
      return
    if isinstance(learning_rate, jax.Array):
      learning_rate = np.asarray(learning_rate)
    previous = self._learning_rate
    if (
      previous is not None
      and type(previous[0]) is type(learning_rate)
      and np.shape(learning_rate) == np.shape(previous[0])
      and np.all(previous[0] == learning_rate)
    ):
      return
    # jnp.asarray keeps trax's typing: a Python float stays weakly typed.
    placed = self._placement.replicate(jnp.asarray(learning_rate))
    self._learning_rate = (learning_rate, placed)
    for params in self.opt_params:
      params['learning_rate'] = placed

  def keep(self) -> list[PyTree]:
    """Everything held between steps (for safe freeing)."""
    return [
      [(l.weights, l.state) for l in self.layers],
      [o.slots for o in self.optimizers],
      self.opt_params,
      self._learning_rate,
    ]
