"""Micro-batches: the step's forward and backward over m parts of the batch.

With m > 1 micro-batches in its plan a step walks its units m times
(`units.Units.walk`), each time over one part of each device's rows (B/m of
them, in order), and applies each layer's optimizer update once, in the
last part:

  parts 0 .. m-2: forward, loss, backward; every backward call adds its
                  weight gradients (averaged over the devices) to the
                  step's accumulated gradients and updates nothing
                  (`step_fns.Update.ACCUMULATE`);
  part m-1:       forward, loss, backward; every backward call adds the
                  accumulated gradients to its own and updates
                  (`step_fns.Update.APPLY`).

The accumulated gradients wait on the device (`step_run.StepRun.grads`)
or, in a plan with `grads_on_host`, on the host: each accumulating call
then returns its part's gradients alone, which are copied back with its
state and added up by the commit queue (`commit.CommitQueue`), and the
last part's call takes their sum, placed with its slots. The stack and
cotangent stack held across the step are one part's; every layer's
weights go to the device m times per step, its slots once.

What stays exact (up to float32 summation order), as with batch slices
(`slices`): the loss is combined by its weight sums
(`loss_combination.loss_combination`): each part's loss call is given the
loss weights of the whole batch (`loss_weights_item`) and scales its loss
by its share of them, so the parts' gradients add up to the gradient of
one pass over the batch; layer state splits with the rows as batch slices
split it: each part reads its rows of every per-row leaf and writes them
back, and a shared leaf is read and written by each part in turn (the
last part's value kept); every part gets its layers' RNGs of the step, so
a dropout mask of part shape repeats from part to part (deterministic
across runs and resumes, not the one-pass masks).

Not accumulated: weights two layers share (`ties`; trax's backward pass
reads the later holder's update, which exists only after the last part),
Adasum (not linear), and a loss `loss_combination` cannot combine.
"""

import dataclasses
from typing import Any, Sequence

import jax
import numpy as np
from trax import layers as tl

from trax_revplus.trainer._step import chains
from trax_revplus.trainer._step import slices
from trax_revplus.trainer._step.loss_combination import loss_combination
from trax_revplus.typing import PyTree


def loss_weights_item(layers: Sequence[tl.Layer], n_items: int) -> int | None:
  """Which batch item the loss layer reads as its loss weights, untouched.

  Follows each batch item's position on the stack through the layers
  before the loss (a layer reading n_in items and writing n_out moves the
  items below its inputs by n_out - n_in; an item it reads is lost).

  Args:
    layers: the trainer's layers in forward order, the loss layer last.
    n_items: int, items of the batch (1 for a single array).

  Returns:
    int, the index in the batch of the item that reaches the loss layer as
    the deepest item it reads (where `loss_combination` reads the weights);
    None where none does.
  """
  positions: list[int | None] = list(range(n_items))
  for layer in layers[:-1]:
    positions = [
      None if p is None or p < layer.n_in else p + layer.n_out - layer.n_in
      for p in positions
    ]
  deepest = chains.chain_depth(layers[-1:]) - 1
  return positions.index(deepest) if deepest in positions else None


def refusal(
  layers: Sequence[tl.Layer], n_items: int, adasum: bool, tied: bool
) -> str | None:
  """Why a step on these layers cannot run in micro-batches, or None.

  Args:
    layers: the trainer's layers in forward order, the loss layer last.
    n_items: int, items of the batch.
    adasum: bool, gradients merged with Adasum.
    tied: bool, some layers share weights (`ties.Ties`).

  Returns:
    None where micro-batches give the one-pass update; else one clause
    saying why not.
  """
  loss_layer = layers[-1]
  if adasum:
    return (
      "adasum merges the devices' gradients in a way that is not "
      "linear, so the parts' gradients cannot be added"
    )
  if tied:
    return (
      'layers of the model share weights, which trax updates between '
      'their backward passes, before the last part exists'
    )
  if loss_combination([loss_layer]) is None:
    return (
      f'the loss layer {loss_layer.name} does not end in a weighted '
      f'mean or sum of its weights (trax_revplus.trainer._step.'
      f'loss_combination), so its parts cannot be combined exactly'
    )
  if loss_weights_item(layers, n_items) is None:
    return (
      f'the loss weights the loss layer {loss_layer.name} reads are '
      f'not an item of the batch that reaches it untouched'
    )
  return None


def part_of_rows(x: np.ndarray, p: int, m: int, n_devices: int) -> np.ndarray:
  """Part p of m of a host batch item's rows, for each of `n_devices`.

  Args:
    x: host array of shape (B, ...), B rows split over `n_devices` devices
      in order (as `placement.Placement.shard_batch` splits them); or its
      `jax.ShapeDtypeStruct` (the walk ahead's types).
    p: int, the part, 0 <= p < m.
    m: int, the parts; m divides each device's rows.
    n_devices: int, the devices (this process's).

  Returns:
    Host array of shape (B // m, ...): rows [p * b, (p + 1) * b) of each
    device's rows, b = B / (n_devices * m), devices in order; for a
    `jax.ShapeDtypeStruct`, one of that shape and `x`'s dtype.
  """
  b = x.shape[0] // (n_devices * m)
  if isinstance(x, jax.ShapeDtypeStruct):
    return jax.ShapeDtypeStruct((n_devices * b,) + tuple(x.shape[1:]), x.dtype)
  x = np.asarray(x)
  parts = x.reshape((n_devices, m, b) + x.shape[1:])
  return parts[:, p].reshape((n_devices * b,) + x.shape[1:])


# A dataclass, not a NamedTuple: its fields `index` and `count` would
# shadow the tuple's methods of those names.
@dataclasses.dataclass(frozen=True)
class Part:
  """One micro-batch of a step.

  Attributes:
    index: int, the part, 0 <= index < count.
    count: int m >= 2, the step's micro-batches.
    n_rows: int, each device's rows of the whole batch.
  """

  index: int
  count: int
  n_rows: int

  @property
  def last(self) -> bool:
    """Whether this is the step's last part (which updates)."""
    return self.index == self.count - 1

  def _states(self, layer, state):
    return slices.States(
      state, slices.state_rows(layer), self.n_rows, self.count
    )

  def state(self, layer: tl.Layer, state: PyTree) -> PyTree:
    """The part's state of `layer` (its rows of each per-row leaf), from
    the layer's whole host state `state`."""
    return self._states(layer, state).slice_at(self.index)

  def joined_state(
    self, layer: tl.Layer, state: PyTree, new_state: PyTree
  ) -> PyTree:
    """`layer`'s whole host state with the part's new state in its rows
    (`state`: the whole state; `new_state`: the part's, host arrays)."""
    return self._states(layer, state).with_slice(self.index, new_state)


def part_of_batch(
  batch: Any, index: int, count: int, n_devices: int
) -> tuple[Part, Any]:
  """Part `index` of `count` of a host batch, and its rows: what the step
  places (`step_context`) and the walk ahead types (`ahead`) alike.

  Args:
    batch: a tuple of host arrays of shape (B, ...) or one array, or their
      `jax.ShapeDtypeStruct`s.
    index: int, the part, 0 <= index < count.
    count: int m >= 2, the step's micro-batches.
    n_devices: int, the devices the rows are split over (this process's).

  Returns:
    (`Part`, the part's rows as `batch_part` gives them).
  """
  n_rows = jax.tree_util.tree_leaves(batch)[0].shape[0] // n_devices
  part = Part(index, count, n_rows)
  return part, batch_part(batch, part, n_devices)


def batch_part(batch: Any, part: Part, n_devices: int) -> Any:
  """Part `part` of a host batch (a tuple of items or one array, or their
  `jax.ShapeDtypeStruct`s)."""
  if isinstance(batch, (tuple, list)):
    return type(batch)(
      part_of_rows(x, part.index, part.count, n_devices) for x in batch
    )
  return part_of_rows(batch, part.index, part.count, n_devices)
