"""Sequence chunks: the loss layer's position-wise tail over k chunks.

The loss layer trax's `extract_reversible_blocks` builds is a `tl.Serial`
of the model's standard layers after its last reversible block, then the
loss: for trax's `ReformerLM`, Concatenate, LayerNorm, Dropout, Dense,
`_CrossEntropy`, `_WeightedMean`. For one row of a long sequence its
temporaries (the logits and their cotangents, over the whole sequence) are
the step's largest. Its **tail** is the longest run of its last sublayers
that act on each position alone (`is_position_wise`) and end in a loss
that `loss_combination.loss_combination` can combine (a weighted mean or sum
over positions); its **head** is the sublayers before (for trax's
`ConfigurableTerraformer`, up to `StripFromConcatenateWithPadding`, which
moves positions).

With k > 1 sequence chunks in its plan the loss layer's program runs its
head on the whole sequence, then the tail's forward, backward and weight
gradients over k equal chunks of the sequence axis (axis 1 of every stack
item the tail reads, `sequence_length`), one after the other, inside one
loop: XLA keeps one chunk's temporaries at a time. The chunks' losses are
combined by their weight sums (`loss_combination`), as batch slices combine
rows; their cotangents are written into one buffer, on which the head's
backward runs once. With batch slices, each slice runs its chunks. Exact up
to float32 summation order, except for random draws: chunk j draws with
`jax.random.fold_in(rng, j)` of its tail layer's RNG of the step (dropout
masks of chunk shape; deterministic across runs and resumes, not the
unchunked masks).

A layer is position-wise by its class and trax name (`POSITION_WISE_CLASSES`,
`POSITION_WISE_NAMES`; combinators `Serial` and `Parallel` when every
sublayer is); anything else (attention, shifts, convolutions, layers this
module does not know) is never chunked.

This module finds the tail and the sequence length its chunks split, and
maps the loss layer's weights, states and RNGs onto its parts; the
programs that run the tail over chunks are `loss_slices`.
"""

from typing import Any

from absl import logging
import jax
from jax import numpy as jnp
import numpy as np
from trax import layers as tl

from trax_revplus import layers as layers_lib
from trax_revplus.trainer._step import chains
from trax_revplus.trainer._step.loss_combination import loss_combination
from trax_revplus.trax_door import functions as trax_functions
from trax_revplus.typing import PRNGKey
from trax_revplus.typing import PyTree

# Layer classes that act on each position alone (along the last axis, or
# element-wise), with no weights shared across positions' values.
POSITION_WISE_CLASSES = frozenset(
  {'Dense', 'LayerNorm', 'Dropout', 'AssertShape'}
)
# trax's `Fn` layers (class `PureLayer`) by name: element-wise activations,
# stack moves, element-wise arithmetic, and the per-position part of
# trax's losses.
POSITION_WISE_NAMES = frozenset(
  {
    'LogSoftmax',
    'Softmax',
    'Relu',
    'Gelu',
    'FastGelu',
    'Sigmoid',
    'Tanh',
    'HardSigmoid',
    'HardTanh',
    'LeakyRelu',
    'Elu',
    'Selu',
    'Negate',
    'Dup',
    'Drop',
    'Swap',
    'Add',
    'SubtractTop',
    'Multiply',
    'XYAvg',
    '_CrossEntropy',
  }
)
# Combinators: position-wise when every sublayer is.
_COMBINATORS = frozenset({'Serial', 'Parallel'})
# The chunk counts a device budget tries (those dividing the sequence).
CHUNK_COUNTS = (2, 4, 8, 16, 32, 64)


def is_position_wise(layer: tl.Layer) -> bool:
  """Whether `layer` acts on each position of its inputs alone.

  Recognised: `POSITION_WISE_CLASSES`; `Concatenate` along the last axis
  (trax names it 'Concatenate' only then); `Select` permutations and
  copies (trax's `Fn` named 'Select[...]'); `Fn` layers named in
  `POSITION_WISE_NAMES`; `Serial` and `Parallel` of such layers.
  """
  kind = type(layer).__name__
  if kind in _COMBINATORS:
    return bool(layer.sublayers) and all(
      is_position_wise(sub) for sub in layer.sublayers
    )
  if kind in POSITION_WISE_CLASSES:
    return True
  if kind == 'Concatenate':
    return layer.name == 'Concatenate'
  if kind == 'PureLayer':
    return layer.name in POSITION_WISE_NAMES or layer.name.startswith('Select[')
  return False


def sublayers_of(loss_layer: tl.Layer) -> list[Any]:
  """The loss layer's parts the tail is cut from: a `tl.Serial`'s
  sublayers (each a distinct layer), else the layer itself."""
  subs = list(loss_layer.sublayers)
  if (
    type(loss_layer).__name__ == 'Serial'
    and subs
    and len({id(s) for s in subs}) == len(subs)
  ):
    return subs
  return [loss_layer]


def tail_start(loss_layer: tl.Layer) -> int | None:
  """Index into `sublayers_of(loss_layer)` where its tail starts, or None
  where no tail can run in chunks (its last part is not a loss
  `loss_combination` combines). A tail layer's state is given whole to
  every chunk, and the last chunk's new state is kept (trax's position-wise
  layers keep none, or a constant: `Dropout`'s rate)."""
  subs = sublayers_of(loss_layer)
  start = len(subs)
  while start > 0:
    last = start == len(subs)
    sub = subs[start - 1]
    if not (
      is_position_wise(sub) or (last and loss_combination([sub]) is not None)
    ):
      break
    start -= 1
  # Stack items after the head: the loss layer's inputs, changed by each
  # head layer.
  depth = chains.chain_depth(subs) + sum(
    sub.n_out - sub.n_in for sub in subs[:start]
  )
  while start < len(subs):
    tail = subs[start:]
    if loss_combination(tail) is not None and depth == chains.chain_depth(tail):
      return start
    depth += subs[start].n_out - subs[start].n_in
    start += 1
  return None


def tail_length(loss_layer: tl.Layer, inputs_types: PyTree) -> int | None:
  """The sequence length the tail's chunks split: axis 1 of every stack
  item the tail reads, found with `jax.eval_shape` of the head on
  `inputs_types` (the loss layer's inputs on one device; the layer is left
  as it was found); None where the items do not share one, or there is no
  tail, or `inputs_types` is None."""
  start = tail_start(loss_layer)
  if start is None or inputs_types is None:
    return None
  subs = sublayers_of(loss_layer)
  weights, states = parts_of(loss_layer, loss_layer.weights, loss_layer.state)
  rng = jax.ShapeDtypeStruct((2,), np.uint32)
  forward = chains.segment_forward_fn(subs[:start])
  try:
    with layers_lib.preserved(loss_layer):
      items, _ = jax.eval_shape(
        lambda x: forward(x, weights[:start], states[:start], [rng] * start),
        inputs_types,
      )
  except Exception as e:  # pylint: disable=broad-except
    # Any failure of a trax layer's shape inference (its own errors are
    # not one type): the step still runs, its tail unchunked; said once.
    logging.info(
      "sequence chunks: the shapes after %s's head could not be found "
      'ahead (%s: %s); its tail runs unchunked.',
      loss_layer.name,
      type(e).__name__,
      e,
    )
    return None
  return sequence_length(items_of(items))


def sequence_length(items: list[Any]) -> int | None:
  """The sequence length of the tail's input stack items (arrays or
  types): their shared axis 1, where each has one and each float item but
  the last (the loss weights) has a feature axis after it (rank >= 3), so
  that axis 1 is never the axis a Dense or LayerNorm acts along; else
  None."""
  lengths = {x.shape[1] if len(x.shape) >= 2 else None for x in items}
  if len(lengths) != 1 or None in lengths:
    return None
  for x in items[:-1]:
    if jnp.issubdtype(x.dtype, jnp.inexact) and len(x.shape) < 3:
      return None
  return lengths.pop()


def chunk_counts(length: int | None) -> list[int]:
  """`CHUNK_COUNTS` that divide `length` (none where it is None)."""
  if length is None:
    return []
  return [c for c in CHUNK_COUNTS if c <= length and length % c == 0]


def _whole(loss_layer) -> bool:
  """Whether `sublayers_of(loss_layer)` is the layer itself (not a
  `tl.Serial`'s sublayers)."""
  return sublayers_of(loss_layer)[0] is loss_layer


def parts_of(
  loss_layer: tl.Layer, weights: PyTree, states: PyTree
) -> tuple[list[PyTree], list[PyTree]]:
  """(weights, states) of `sublayers_of(loss_layer)`, as lists."""
  if _whole(loss_layer):
    return [weights], [states]
  return list(weights), list(states)


def joined(loss_layer: tl.Layer, parts: list[PyTree]) -> PyTree:
  """`parts` (one per sublayer) in the loss layer's own structure."""
  return parts[0] if _whole(loss_layer) else tuple(parts)


def rngs_of(loss_layer: tl.Layer, rng: PRNGKey) -> list[PRNGKey]:
  """The sublayers' RNGs as the loss layer's own forward draws them
  (`tl.Serial` splits its RNG among its sublayers)."""
  if _whole(loss_layer):
    return [rng]
  return list(trax_functions.split_rngs(rng, len(sublayers_of(loss_layer))))


def items_of(stack: PyTree) -> list[Any]:
  """The items of a stack in trax's layout (one array or a tuple)."""
  return list(stack) if isinstance(stack, (tuple, list)) else [stack]


def stack_of(items: list[Any]) -> PyTree:
  """Stack items in trax's layout: one array alone, else a tuple."""
  return items[0] if len(items) == 1 else tuple(items)
