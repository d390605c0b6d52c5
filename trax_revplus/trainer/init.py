"""`init_reversible_blocks`: trax's initializer of the blocks, keeping loaded
weights."""

from typing import Any

from absl import logging
import jax
import numpy as np
from trax import fastmath
from trax import layers as tl
from trax.layers import base
from trax.layers import combinators as cb

from trax_revplus import memory
from trax_revplus import validation
from trax_revplus.trainer._step.host_store import move_to_host
from trax_revplus.typing import Blocks
from trax_revplus.typing import PRNGKey


def _holds_arrays(tree):
  """Whether `tree` has an array leaf (numpy or jax): values, not markers."""
  return any(
    isinstance(x, (np.ndarray, np.generic, jax.Array))
    for x in jax.tree_util.tree_leaves(tree)
  )


def _standard_layers(std_layers: Any) -> list[tl.Layer]:
  """A block's standard layers as a flat list (blocks already checked)."""
  layers = validation.standard_layer_list(std_layers)
  assert layers is not None  # `validation.check_blocks` passed
  return layers


def _leaf_layers(layer):
  """The distinct layers without sublayers in `layer` (itself if it has none).

  trax keeps every weight and state value in such layers: a combinator's
  weights are only its sublayers'. A layer shared by several parents is
  listed once.
  """
  found, seen = [], set()

  def walk(l) -> None:
    if id(l) in seen:
      return
    seen.add(id(l))
    if l.sublayers:
      for sub in l.sublayers:
        walk(sub)
    else:
      found.append(l)

  walk(layer)
  return found


def _initializes_itself(leaf):
  """Whether `init` can give this sublayer-less layer weights or state.

  A layer that does not override `Layer.init_weights_and_state` (Dropout,
  Select, Fn, ...) keeps `()` whatever its inputs, and so does an empty
  `tl.Serial` or `tl.Parallel` (e.g. the `[]` of `tl.Parallel(layer, [])`).
  A wrong True costs an initialization whose values are then discarded,
  never a wrong value.
  """
  if isinstance(leaf, (cb.Serial, cb.Parallel)):
    return False
  return (
    type(leaf).init_weights_and_state is not base.Layer.init_weights_and_state
  )


def init_reversible_blocks(
  blocks: Blocks, loss_layer: tl.Layer, input_signature: Any, rng: PRNGKey
) -> None:
  """Initializes the blocks and loss layer as trax does; keeps loaded values.

  Replaces trax's `init_reversible_blocks`, which `training.Loop` calls with
  `model.rng`: it initializes each standard and reversible layer and the
  loss layer in turn, each with its own RNG, silently replacing weights a
  user loaded before the Loop (fine-tuning, `train.init_checkpoint`). Here
  every layer is initialized exactly as trax would (same order, same RNGs;
  a layer shared by two places is initialized at each, the last one
  counting, as in trax), except the values a user loaded: a layer without
  sublayers (where trax keeps weights and state) whose weights or state
  held arrays when this function was called keeps both. A layer is not
  initialized at all when all its sublayers that can hold values hold
  loaded ones; otherwise it is initialized and its loaded sublayers get
  their values back. So a partly loaded layer (e.g. a `tl.Parallel` around
  an embedding shared with an earlier block and a positional encoding of
  its own) has its empty sublayers initialized. Afterwards all weights and
  state are host `numpy.ndarray`s.

  Args:
    blocks: list of pairs (standard layers, reversible layers): the
      standard part a list of layers (nested lists are flattened, as
      `tl.Serial` does) or a single layer, the reversible part a list of
      `tl.ReversibleLayer`.
    loss_layer: the final loss layer.
    input_signature: `ShapeDtype` or tuple of them, of the batch.
    rng: JAX PRNG key (uint32[2]).

  Raises:
    validation.BlockStructureError: blocks are not (standard, reversible)
      pairs, or a reversible list holds a non-reversible layer.
    validation.SequenceLengthError: the batch's sequence axis does not fit a
      positional encoding of the blocks (checked before any layer is
      initialized).
    validation.LossLayerError: the loss layer does not output a scalar
      (checked abstractly once the layers before it are initialized).
  """
  validation.check_blocks(blocks)
  # Each block's layers as lists (`standard_layer_list` flattens its first).
  listed = [(_standard_layers(std), list(rev)) for std, rev in blocks]
  validation.check_sequence_length(listed, input_signature)
  # The values the user loaded, noted before anything is initialized: a
  # layer shared with an earlier block holds values once that block is
  # initialized, which are not the user's.
  loaded = {}
  for top in [l for std, rev in listed for l in std + rev] + [loss_layer]:
    for leaf in _leaf_layers(top):
      if id(leaf) not in loaded and _holds_arrays((leaf.weights, leaf.state)):
        loaded[id(leaf)] = (leaf, leaf.weights, leaf.state)
  sig_stack = input_signature
  rss = memory.host_rss_bytes()

  def init_one(layer, sig, layer_rng) -> None:
    nonlocal rss
    leaves = _leaf_layers(layer)
    kept = [leaf for leaf in leaves if id(leaf) in loaded]
    if kept and all(
      id(leaf) in loaded for leaf in leaves if _initializes_itself(leaf)
    ):
      logging.info('init: layer %s keeps its loaded weights', layer.name)
    else:
      layer.init(sig, rng=layer_rng)
      for leaf in kept:
        _, leaf.weights, leaf.state = loaded[id(leaf)]
      if kept:
        logging.info(
          'init: layer %s: %d of its sublayers keep their loaded '
          'weights, the others are initialized',
          layer.name,
          len(kept),
        )
    move_to_host(layer)
    now = memory.host_rss_bytes()
    logging.info(
      'init: layer %s: weights %.2f MiB, host RSS added %.2f MiB, '
      'host RSS %.2f MiB',
      layer.name,
      memory.array_bytes(layer.weights) / 2**20,
      (now - rss) / 2**20,
      now / 2**20,
    )
    rss = now

  for std_layers, rev_layers in listed:
    rngs = fastmath.random.split(rng, len(std_layers) + len(rev_layers) + 1)
    rng = rngs[0]
    for layer, layer_rng in zip(std_layers + rev_layers, rngs[1:]):
      sig = cb.inputs_from_stack(sig_stack, layer.n_in)
      init_one(layer, sig, layer_rng)
      out_sig = layer.output_signature(sig)
      sig_stack = cb.outputs_onto_stack(out_sig, sig_stack, layer.n_in)
  loss_sig = cb.inputs_from_stack(sig_stack, loss_layer.n_in)
  init_one(loss_layer, loss_sig, rng)
  validation.check_loss_output(loss_layer, loss_sig)
