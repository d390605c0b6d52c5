"""`init_reversible_blocks`: trax's initializer of the blocks, keeping loaded
weights."""

from typing import Any

from absl import logging
from trax import fastmath
from trax import layers as tl
from trax.layers import combinators as cb

from trax_revplus import memory
from trax_revplus import validation
from trax_revplus.placement import to_numpy as _host
from trax_revplus.trainer.step_fns import has_weights as _has_weights
from trax_revplus.typing import Blocks
from trax_revplus.typing import PRNGKey


def init_reversible_blocks(blocks: Blocks, loss_layer: tl.Layer,
                           input_signature: Any, rng: PRNGKey) -> None:
  """Initializes the layers that hold no weights yet; keeps the rest.

  Replaces trax's `init_reversible_blocks`, which `training.Loop` calls with
  `model.rng`: it re-initialized every layer, silently replacing weights a
  user loaded before the Loop (fine-tuning, `train.init_checkpoint`). Here a
  layer whose weights already contain arrays keeps its weights and state;
  the others are initialized with exactly the RNGs trax would give them.
  Afterwards all weights and state are host `numpy.ndarray`s.

  Args:
    blocks: list of pairs (standard layers, reversible layers).
    loss_layer: the final loss layer.
    input_signature: `ShapeDtype` or tuple of them, of the batch.
    rng: JAX PRNG key (uint32[2]).

  Raises:
    validation.BlockStructureError: blocks are not (standard, reversible)
      pairs of layer lists, or a reversible list holds a non-reversible layer.
    validation.SequenceLengthError: the batch's sequence axis does not fit a
      positional encoding of the blocks (checked before any layer is
      initialized).
    validation.LossLayerError: the loss layer does not output a scalar
      (checked abstractly once the layers before it are initialized).
  """
  validation.check_blocks(blocks)
  validation.check_sequence_length(blocks, input_signature)
  sig_stack = input_signature
  rss = memory.host_rss_bytes()

  def init_one(layer, sig, layer_rng):
    nonlocal rss
    if _has_weights(layer):
      logging.info('init: layer %s keeps its weights', layer.name)
    else:
      layer.init(sig, rng=layer_rng)
    layer.weights = _host(layer.weights)
    layer.state = _host(layer.state)
    now = memory.host_rss_bytes()
    logging.info('init: layer %s: weights %.2f MiB, host RSS added %.2f MiB, '
                 'host RSS %.2f MiB', layer.name,
                 memory.array_bytes(layer.weights) / 2**20,
                 (now - rss) / 2**20, now / 2**20)
    rss = now

  for (std_layers, rev_layers) in blocks:
    rngs = fastmath.random.split(rng, len(std_layers) + len(rev_layers) + 1)
    rng = rngs[0]
    for layer, layer_rng in zip(list(std_layers) + list(rev_layers), rngs[1:]):
      sig = cb.inputs_from_stack(sig_stack, layer.n_in)
      init_one(layer, sig, layer_rng)
      out_sig = layer.output_signature(sig)
      sig_stack = cb.outputs_onto_stack(out_sig, sig_stack, layer.n_in)
  loss_sig = cb.inputs_from_stack(sig_stack, loss_layer.n_in)
  init_one(loss_layer, loss_sig, rng)
  validation.check_loss_output(loss_layer, loss_sig)
