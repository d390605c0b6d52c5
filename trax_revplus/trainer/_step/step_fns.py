"""The pure functions a training step compiles, one builder per kind.

Each builder takes layers (and optimizers) and returns a function of arrays
only, which `compilation.Compiler` jits for the trainer's devices. On N > 1
devices a function runs once per device (`placement.Placement.jit`): each
argument and result is either replicated (weights, slots, optimizer
hyperparameters, the step) or per-device (activations, cotangents, state,
RNGs, statistics), as `fn_kinds.Kind.in_layouts` / `Kind.out_layouts` say.

The builders mirror trax 1.4.1's `trax.optimizers.trainer`:
`_fbo_with_layer_and_opt` (`fbo_fn`), `_reverse_and_fbo_with_layer_and_opt`
(`reverse_and_fbo_fn`) and `_average_multidevice_gradients`
(`average_gradients`).
"""

import enum
from typing import Any, Callable, Sequence

import jax
from trax import fastmath
from trax import layers as tl
from trax.fastmath import numpy as jnp
from trax.optimizers import base as optimizer_base

from trax_revplus import placement as placement_lib
from trax_revplus.trainer._step import chains
from trax_revplus.trainer._step import fingerprints
from trax_revplus.trainer._step import ties as ties_lib
from trax_revplus.trax_door import functions as trax_functions
from trax_revplus.typing import PyTree


def is_empty_tuple(x: Any) -> bool:
  """Whether x is empty or a tuple of (tuples of) empty things (as trax)."""
  if not isinstance(x, (list, tuple)):
    return False
  return all(is_empty_tuple(y) for y in x)


def has_weights(layer: tl.Layer) -> bool:
  """Whether a layer's weights hold any array (it was initialized or
  loaded; a layer without weights holds only empty tuples)."""
  return any(
    hasattr(x, 'shape') for x in jax.tree_util.tree_leaves(layer.weights)
  )


def average_gradients(grads: PyTree, n_devices: int, adasum: bool) -> PyTree:
  """Averages gradients over the devices' 'batch' axis.

  Mirrors trax's `_average_multidevice_gradients`, with N the devices of
  this trainer. Runs inside a per-device function.

  Args:
    grads: pytree of this device's gradients.
    n_devices: int N > 1.
    adasum: bool, merge pairs of devices with Adasum first (N a power of 2).

  Returns:
    The pytree of gradients averaged over the N devices.
  """
  if adasum:
    lg = max(i for i in range(20) if 2**i <= n_devices)
    for lg_i in range(lg):
      shift = 2**lg_i
      perm = []
      for i in range(n_devices):
        if i % (2 * shift) < shift:
          perm.append((i, i + shift))
        else:
          perm.append((i, i - shift))
      perm_grads = jax.lax.ppermute(
        grads, perm=perm, axis_name=placement_lib.AXIS_NAME
      )
      grads = fastmath.nested_map_multiarg(
        trax_functions.adasum_merge, grads, perm_grads
      )
  grads_psum = fastmath.psum(grads, placement_lib.AXIS_NAME)
  n = jnp.array(n_devices, dtype=jnp.float32)
  return fastmath.nested_map(lambda g: g / n, grads_psum)


class Update(enum.Enum):
  """What an updating call does with the weight gradients it computes.

  NOW: the optimizer update, at once (a step in one pass over the batch).
  ACCUMULATE: adds them to the gradients of the step's earlier micro-batches
    (`units.Units.walk`), which the call takes in the slots' place (an empty
    tuple in the first micro-batch) and returns in the new slots' place;
    it returns no weights (an empty tuple) and no update statistics.
  APPLY: the update of the step's last micro-batch, with the gradients of
    the earlier ones added: the call takes (slots, accumulated gradients)
    in the slots' place.
  """

  NOW = 'now'
  ACCUMULATE = 'accumulate'
  APPLY = 'apply'


def update_fn(
  optimizer: optimizer_base.Optimizer,
  n_devices: int,
  adasum: bool,
  mode: Update = Update.NOW,
) -> Callable[..., tuple[PyTree, PyTree, dict]]:
  """One layer's optimizer update from its gradients.

  The update of trax's `_fbo_with_layer_and_opt` and
  `_reverse_and_fbo_with_layer_and_opt`, apart from their forward and
  backward: gradients averaged over the devices, then
  `optimizer.tree_update`. With `mode` (`Update`) the gradients of a
  micro-batch are accumulated, or added to the accumulated ones before the
  update; each micro-batch's gradients are averaged over the devices
  before they are added (an average of sums is the sum of averages;
  Adasum, which is not linear, is not accumulated).

  Returns (of the returned function):
    (grads_weights, weights, slots, opt_params, step) -> (new_weights,
    new_slots, stats); a layer without weights is returned unchanged with
    empty stats (ACCUMULATE: empty tuples).
  """

  def update(grads_weights, weights, slots, opt_params, step):
    if mode is Update.APPLY:
      slots, accumulated = slots
    if is_empty_tuple(weights):
      if mode is Update.ACCUMULATE:
        return (), (), {}
      return weights, slots, {}
    if n_devices > 1:
      grads_weights = average_gradients(grads_weights, n_devices, adasum)
    if mode is Update.ACCUMULATE:
      if not is_empty_tuple(slots):  # The gradients so far.
        grads_weights = jax.tree_util.tree_map(jnp.add, slots, grads_weights)
      return (), grads_weights, {}
    if mode is Update.APPLY:
      grads_weights = jax.tree_util.tree_map(
        jnp.add, accumulated, grads_weights
      )
    return optimizer.tree_update(
      step, grads_weights, weights, slots, opt_params, store_slots=False
    )

  return update


def fbo_fn(
  layer: tl.Layer,
  optimizer: optimizer_base.Optimizer,
  n_devices: int,
  adasum: bool,
  stats_name: str | None = None,
  mode: Update = Update.NOW,
) -> Callable[..., tuple]:
  """Forward + backward + optimizer update of a standard layer.

  Mirrors trax's `_fbo_with_layer_and_opt`. With `stats_name` (the loss
  layer: `Kind.LOSS`) the cotangent is 1 when none is given, and the
  layer's output is returned among the stats under that name. `mode`: see
  `update_fn`.
  """
  update = update_fn(optimizer, n_devices, adasum, mode)

  def fbo(inputs, weights, grads, state, slots, opt_params, rng, step):
    def pure_fn_without_state_and_rng(x, w):
      return layer.pure_fn(x, w, state, rng)

    activations, vjp_fn, new_state = fastmath.vjp(
      pure_fn_without_state_and_rng, inputs, weights, has_aux=True
    )
    if grads is None and stats_name is not None:
      grads = jnp.ones((), dtype=activations.dtype)
    grads_inputs, grads_weights = vjp_fn(grads)
    new_weights, new_slots, stats = update(
      grads_weights, weights, slots, opt_params, step
    )
    if stats_name is not None:
      stats[stats_name] = activations
    return new_weights, new_state, new_slots, grads_inputs, stats

  return fbo


def reverse_and_fbo_fn(
  layer: tl.Layer,
  optimizer: optimizer_base.Optimizer,
  n_devices: int,
  adasum: bool,
  mode: Update = Update.NOW,
) -> Callable[..., tuple]:
  """Reverse + backward + optimizer update of a reversible layer.

  Mirrors trax's `_reverse_and_fbo_with_layer_and_opt`. `mode`: see
  `update_fn`.
  """
  update = update_fn(optimizer, n_devices, adasum, mode)

  def reverse_and_fbo(
    output, weights, grads, state, new_state, slots, opt_params, rng, step
  ):
    inputs, (grads_inputs, grads_weights) = layer.reverse_and_grad(
      output, grads, weights, state, new_state, rng=rng
    )
    new_weights, new_slots, stats = update(
      grads_weights, weights, slots, opt_params, step
    )
    return new_weights, new_slots, inputs, grads_inputs, stats

  return reverse_and_fbo


def forward_fn(layer: tl.Layer) -> Callable[..., tuple[PyTree, PyTree]]:
  """A standard layer's forward: `layer.pure_fn` (`Kind.FORWARD`)."""

  def forward(inputs, weights, state, rng):
    return layer.pure_fn(inputs, weights, state, rng)

  return forward


def segment_reverse_fn(
  layers: Sequence[tl.Layer],
  optimizers: Sequence[optimizer_base.Optimizer],
  n_devices: int,
  adasum: bool,
  in_call: ties_lib.InCall = (),
  mode: Update = Update.NOW,
) -> Callable[..., tuple]:
  """Reverse + backward + update of consecutive reversible layers.

  Runs `reverse_and_fbo_fn` of each layer, last to first
  (`chains.reverse_chain`), inside one call; every layer keeps its own
  weights, slots, optimizer hyperparameters, states and RNG. Arguments are
  those of `reverse_and_fbo_fn` with a list (one entry per layer) in place
  of each per-layer value, and the stack items the segment's forward wrote
  as outputs and cotangents.

  Returns (of the returned function):
    (new_weights, new_slots, inputs, grads_inputs, stats): lists of each
    layer's new weights, slots and stats; the reconstructed stack items the
    segment's forward read (`chains.chain_depth(layers)`) and their cotangents.
  With `in_call` (`ties.Ties.in_call` of the layers), a layer reads the
  weights it shares with a later layer of the segment from that layer's
  update, as trax's one call per layer would. `mode`: see `update_fn`.
  """
  fns = [
    reverse_and_fbo_fn(layer, opt, n_devices, adasum, mode)
    for layer, opt in zip(layers, optimizers)
  ]

  def reverse(
    outputs, weights, grads, states, new_states, slots, opt_params, rngs, step
  ):
    n = len(layers)
    new_weights: list[Any] = [None] * n
    new_slots: list[Any] = [None] * n
    stats: list[Any] = [None] * n

    def reverse_layer(k, y, y_ct):
      # Each layer's update follows its own reverse, as one call per layer
      # would order them.
      new_weights[k], new_slots[k], x, x_ct, stats[k] = fns[k](
        y,
        tied_weights(k, weights[k], new_weights, in_call),
        y_ct,
        states[k],
        new_states[k],
        slots[k],
        opt_params[k],
        rngs[k],
        step,
      )
      return x, x_ct

    stack, grad_stack = chains.reverse_chain(
      layers, outputs, grads, reverse_layer
    )
    return new_weights, new_slots, stack, grad_stack, stats

  return reverse


def tied_weights(
  k: int, weights_k: PyTree, new_weights: list[PyTree], in_call: ties_lib.InCall
) -> PyTree:
  """Layer k's weights with the leaves it shares with a later layer of the
  call taken from that layer's update (`new_weights[source]`, already
  computed: updates run last to first).

  Args:
    k: int, the layer's position in the call's lists.
    weights_k: pytree, its weights at the step's start.
    new_weights: list over the call's layers of updated weights (None for
      layers not yet updated).
    in_call: `ties.Ties.in_call` of the call's layers.

  Returns:
    `weights_k` with each tied leaf replaced (same shapes and dtypes).
  """
  replacements = {
    leaf: ties_lib.leaf(new_weights[source], source_leaf)
    for layer, leaf, source, source_leaf in in_call
    if layer == k
  }
  return ties_lib.with_leaves(weights_k, replacements)


def update_each(
  updates: Sequence[Callable[..., tuple]],
  grads_weights: Sequence[PyTree],
  weights: Sequence[PyTree],
  slots: Sequence[PyTree],
  opt_params: Sequence[PyTree],
  step: PyTree,
  in_call: ties_lib.InCall = (),
  blocks: Sequence[chains.Repeats] = (),
) -> tuple[list[PyTree], list[PyTree], list[dict]]:
  """Each layer's `update_fn` on its gradients (lists over the layers).

  Layers are updated last to first, as trax's backward pass does; with
  `in_call` (`ties.Ties.in_call`), a layer's shared weights are those its
  later holder's update left. The layers of each run of equal blocks of
  `blocks` (`updated_together`; none with `in_call`) are updated by one
  update per position in the block, mapped (`jax.vmap`) over that
  position's layers' stacked values: each layer's update as its own, in
  a program that does not grow with the run's length.

  Returns:
    (new_weights, new_slots, stats): lists over the layers.
  """
  n = len(updates)
  new_weights: list[Any] = [None] * n
  new_slots: list[Any] = [None] * n
  stats: list[Any] = [None] * n
  for run in blocks:
    args = (grads_weights, weights, slots, opt_params)
    if in_call or not chains.stackable(run, *args):
      continue
    # Per position in the block, its layers' (weights, slots, stats)
    # stacked; None for a layer without weights (updated below).
    mapped: list[Any] = [
      None
      if is_empty_tuple(weights[run.start + j])
      else jax.vmap(updates[run.start + j], in_axes=(0, 0, 0, 0, None))(
        *stacked, step
      )
      for j, stacked in enumerate(zip(*(chains.stacked(run, a) for a in args)))
    ]
    for k, result in enumerate(chains.unstacked(run, mapped), run.start):
      if result is not None:
        new_weights[k], new_slots[k], st = result
        stats[k] = dict(st)
  for k in range(n - 1, -1, -1):
    if stats[k] is not None:
      continue
    w = tied_weights(k, weights[k], new_weights, in_call)
    new_weights[k], new_slots[k], st = updates[k](
      grads_weights[k], w, slots[k], opt_params[k], step
    )
    stats[k] = dict(st)
  return new_weights, new_slots, stats


def updated_together(
  blocks: Sequence[chains.Repeats],
  optimizers: Sequence[optimizer_base.Optimizer],
  adasum: bool,
) -> list[chains.Repeats]:
  """The runs of equal blocks of `blocks` (`chains.looped_blocks`) that
  `update_each` updates as one mapped update per position in the block:
  those whose layers at each position have equal optimizers
  (`fingerprints.of`: the same class and hyperparameters); none with
  `adasum`, whose exchange between devices runs per layer."""
  if adasum:
    return []

  def equal(run):
    return all(
      len(
        {
          fingerprints.of(optimizers[run.start + r * run.period + j])
          for r in range(run.count)
        }
      )
      == 1
      for j in range(run.period)
    )

  return [run for run in blocks if equal(run)]
