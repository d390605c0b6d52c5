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
"""

import contextlib
from typing import Any, Callable

import jax
from jax import lax
from jax import numpy as jnp
import numpy as np
from trax import fastmath
from trax import layers as tl

from trax_revplus import layers as layers_lib
from trax_revplus.trainer._plan import row_draws
from trax_revplus.trainer._step import chains
from trax_revplus.trainer._step import slices
from trax_revplus.trainer._step.loss_combination import loss_combination
from trax_revplus.trainer._step.slice_loop import FLOAT0
from trax_revplus.trax_door import functions as trax_functions
from trax_revplus.typing import Array
from trax_revplus.typing import PRNGKey
from trax_revplus.typing import PyTree

# Layer classes that act on each position alone (along the last axis, or
# element-wise), with no weights shared across positions' values.
POSITION_WISE_CLASSES = frozenset({
    'Dense', 'LayerNorm', 'Dropout', 'AssertShape'})
# trax's `Fn` layers (class `PureLayer`) by name: element-wise activations,
# stack moves, element-wise arithmetic, and the per-position part of
# trax's losses.
POSITION_WISE_NAMES = frozenset({
    'LogSoftmax', 'Softmax', 'Relu', 'Gelu', 'FastGelu', 'Sigmoid', 'Tanh',
    'HardSigmoid', 'HardTanh', 'LeakyRelu', 'Elu', 'Selu', 'Negate',
    'Dup', 'Drop', 'Swap', 'Add', 'SubtractTop', 'Multiply', 'XYAvg',
    '_CrossEntropy'})
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
        is_position_wise(sub) for sub in layer.sublayers)
  if kind in POSITION_WISE_CLASSES:
    return True
  if kind == 'Concatenate':
    return layer.name == 'Concatenate'
  if kind == 'PureLayer':
    return (layer.name in POSITION_WISE_NAMES or
            layer.name.startswith('Select['))
  return False


def sublayers_of(loss_layer: tl.Layer) -> list[Any]:
  """The loss layer's parts the tail is cut from: a `tl.Serial`'s
  sublayers (each a distinct layer), else the layer itself."""
  subs = list(loss_layer.sublayers)
  if (type(loss_layer).__name__ == 'Serial' and subs and
      len({id(s) for s in subs}) == len(subs)):
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
    if not (is_position_wise(sub) or
            (last and loss_combination([sub]) is not None)):
      break
    start -= 1
  # Stack items after the head: the loss layer's inputs, changed by each
  # head layer.
  depth = chains.chain_depth(subs) + sum(
      sub.n_out - sub.n_in for sub in subs[:start])
  while start < len(subs):
    tail = subs[start:]
    if (loss_combination(tail) is not None and
        depth == chains.chain_depth(tail)):
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
  weights, states = _parts(loss_layer, loss_layer.weights, loss_layer.state)
  rng = jax.ShapeDtypeStruct((2,), np.uint32)
  forward = chains.segment_forward_fn(subs[:start])
  try:
    with layers_lib.preserved(loss_layer):
      items, _ = jax.eval_shape(
          lambda x: forward(x, weights[:start], states[:start],
                            [rng] * start), inputs_types)
  except Exception:  # pylint: disable=broad-except
    return None
  return sequence_length(_items(items))


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


def _parts(loss_layer, weights, states):
  """(weights, states) of `sublayers_of(loss_layer)`, as lists."""
  if _whole(loss_layer):
    return [weights], [states]
  return list(weights), list(states)


def _joined(loss_layer, parts):
  """`parts` (one per sublayer) in the loss layer's own structure."""
  return parts[0] if _whole(loss_layer) else tuple(parts)


def _rngs(loss_layer, rng):
  """The sublayers' RNGs as the loss layer's own forward draws them
  (`tl.Serial` splits its RNG among its sublayers)."""
  if _whole(loss_layer):
    return [rng]
  return list(trax_functions.split_rngs(
      rng, len(sublayers_of(loss_layer))))


def _items(stack):
  return list(stack) if isinstance(stack, (tuple, list)) else [stack]


def _stack(items):
  return items[0] if len(items) == 1 else tuple(items)


def _pieces(forward, combine, items, weights, states, rngs, k, chunks,
            factor, all_weights=None):
  """Loss and gradients of `forward` (a chain from stack items to a loss)
  over k row slices times `chunks` chunks of the sequence, in one loop.

  Each piece reads its rows and positions from `items` as they are and writes
  its items' cotangents into one buffer of their shape, so the loop holds one
  piece's temporaries (a loop over stacked slices would copy the items and
  their cotangents). A piece's loss is scaled by `factor` times its share
  (`combine` of its loss weights and `all_weights`, by default the loss
  weights among `items`); with chunks each layer draws with its RNG folded
  with the chunk's index, without them with its RNG, its `Dropout` masks
  the slice's rows of the unsliced ones (`row_draws`, as batch slices).

  Returns:
    (loss, items' cotangents (list), weights' gradients, new states).

  Raises (when traced):
    ValueError: chunks > 1 and the items do not share a sequence length
      (`sequence_length`) that chunks divides.
  """
  b = items[0].shape[0] // k
  n = None
  if chunks > 1:
    length = sequence_length(items)
    if length is None or length % chunks:
      raise ValueError(
          f'{chunks} sequence chunks: the loss layer\'s tail reads items '
          f'of shapes {[tuple(x.shape) for x in items]}, which do not share '
          f'a sequence length (axis 1, before a feature axis) that {chunks} '
          f'divides.')
    n = length // chunks
  floats = [i for i, x in enumerate(items)
            if jnp.issubdtype(x.dtype, jnp.inexact)]
  whole = items[-1] if all_weights is None else all_weights

  def starts(x, s, j):
    at = [s * b] + [0] * (x.ndim - 1)
    if n is not None:
      at[1] = j * n
    return at

  def sizes(x):
    return [b] + ([n] if n is not None else []) + list(
        x.shape[1 if n is None else 2:])

  def body(p, carry):
    loss, bufs, acc, _ = carry
    s, j = p // chunks, p % chunks
    part = [lax.dynamic_slice(x, starts(x, s, j), sizes(x)) for x in items]
    share = factor * lax.stop_gradient(combine(part[-1], whole))
    # A piece whose loss weights are all 0 adds 0: its weights are swapped
    # for ones so that its own mean stays finite.
    part[-1] = jnp.where(share > 0, part[-1], jnp.ones_like(part[-1]))
    piece_rngs = [jax.random.fold_in(r, j) for r in rngs] if n else rngs

    def scaled(y, w):
      out, new_states = forward(y, w, states, piece_rngs)
      return out * share.astype(out.dtype), new_states
    # Without chunks a piece is a batch slice: its masks are its rows of
    # the unsliced ones (`row_draws`).
    draws = (row_draws.slice_of(s, k) if n is None and k > 1 else
             contextlib.nullcontext())
    with draws:
      out, vjp_fn, new_states = fastmath.vjp(scaled, _stack(part), weights,
                                             has_aux=True)
    grads_part, grads_weights = vjp_fn(jnp.ones((), out.dtype))
    grads_part = _items(grads_part)
    bufs = [lax.dynamic_update_slice(buf, grads_part[i].astype(buf.dtype),
                                     starts(buf, s, j))
            for i, buf in zip(floats, bufs)]
    acc = jax.tree_util.tree_map(jnp.add, acc, grads_weights)
    return loss + out.astype(loss.dtype), bufs, acc, new_states
  loss, bufs, grads_weights, new_states = lax.fori_loop(
      0, k * chunks, body,
      (jnp.zeros((), jnp.float32),
       [jnp.zeros_like(items[i]) for i in floats],
       jax.tree_util.tree_map(jnp.zeros_like, weights), list(states)))
  grads_items = [_zero_cotangent(x) for x in items]
  for i, buf in zip(floats, bufs):
    grads_items[i] = buf
  return loss, grads_items, grads_weights, new_states


def chunked_grads(loss_layer: tl.Layer, k: int,
                  rng: PRNGKey) -> Callable[..., tuple]:
  """The loss layer's loss and gradients with its tail over k chunks.

  The head (`tail_start`) runs forward and backward once, on whole rows;
  the tail over the chunks (`_pieces`).

  Args:
    loss_layer: the trainer's loss layer (`tail_start` not None).
    k: int >= 2, chunks of the sequence.
    rng: the loss layer's RNG of the step.

  Returns:
    `(inputs, weights, state, factor) -> (loss, grads_inputs,
    grads_weights, new_state)`: the loss layer's output times `factor` (a
    float32 scalar, 1 for a whole call, a batch slice's share otherwise)
    and its gradients with respect to `inputs` (the loss layer's input
    stack items, rows first and the sequence second) and `weights`.

  Raises (when traced):
    ValueError: the tail's inputs do not share a sequence length that k
      divides.
  """
  start = tail_start(loss_layer)
  subs = sublayers_of(loss_layer)
  head = chains.segment_forward_fn(subs[:start])
  tail = chains.segment_forward_fn(subs[start:])
  combine = loss_combination(subs[start:])

  def grads(inputs, weights, state, factor):
    ws, ss = _parts(loss_layer, weights, state)
    rngs = _rngs(loss_layer, rng)
    if start:
      y, head_vjp, head_states = fastmath.vjp(
          lambda x, w: head(x, w, ss[:start], rngs[:start]), inputs,
          ws[:start], has_aux=True)
    else:
      y, head_vjp, head_states = inputs, None, []
    loss, grads_y, grads_tail, tail_states = _pieces(
        tail, combine, _items(y), ws[start:], ss[start:], rngs[start:], 1, k,
        factor)
    grads_y = _stack(grads_y)
    if start:
      grads_inputs, grads_head = head_vjp(grads_y)
    else:
      grads_inputs, grads_head = grads_y, []
    return (loss, grads_inputs,
            _joined(loss_layer, list(grads_head) + list(grads_tail)),
            _joined(loss_layer, list(head_states) + list(tail_states)))
  return grads


def in_place(loss_layer: tl.Layer, inputs: PyTree, state: PyTree) -> bool:
  """Whether `pieces_grads` can run the loss layer's call: its tail is the
  whole layer, and its state holds nothing per row (as batch slices split
  state: `slices.States`)."""
  if tail_start(loss_layer) != 0:
    return False
  rows = _items(inputs)[0].shape[0]
  return not slices.States(state, slices.state_rows(loss_layer), rows,
                           1).scanned


def pieces_grads(loss_layer: tl.Layer, k: int, chunks: int,
                 rng: PRNGKey) -> Callable[..., tuple]:
  """The loss layer's loss and gradients over k row slices times `chunks`
  chunks of the sequence, in one loop, in place (`_pieces`): the call
  holds, beyond its arguments and results, one piece's temporaries.

  Args:
    loss_layer: the trainer's loss layer (`in_place` True).
    k: int >= 1, slices of the call's rows.
    chunks: int >= 1, chunks of the sequence (1: whole rows).
    rng: the loss layer's RNG of the step.

  Returns:
    `(inputs, weights, state, all_weights=None) -> (loss, grads_inputs,
    grads_weights, new_state)`; `all_weights`: the loss weights each
    piece's share is of (`_pieces`).
  """
  subs = sublayers_of(loss_layer)
  forward = chains.segment_forward_fn(subs)
  combine = loss_combination(subs)

  def grads(inputs, weights, state, all_weights=None):
    ws, ss = _parts(loss_layer, weights, state)
    loss, grads_inputs, grads_ws, new_states = _pieces(
        forward, combine, _items(inputs), ws, ss, _rngs(loss_layer, rng), k,
        chunks, jnp.ones((), jnp.float32), all_weights)
    return (loss, _stack(grads_inputs), _joined(loss_layer, grads_ws),
            _joined(loss_layer, new_states))
  return grads


def _zero_cotangent(x: Array) -> Array | np.ndarray:
  """The cotangent of an input the tail does not differentiate: float0
  zeros for an integer input (as `jax.vjp` gives), zeros otherwise."""
  if jnp.issubdtype(x.dtype, jnp.inexact):
    return jnp.zeros_like(x)
  return np.zeros(x.shape, FLOAT0)
