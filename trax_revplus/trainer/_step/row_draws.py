"""Random draws in batch slices: each slice draws its rows of the unsliced
batch's draw.

trax's `Dropout` draws one mask of its input's shape from its layer's RNG
(`fastmath.random.bernoulli(rng, keep, x.shape)`). In a sliced call
(`slices`) every slice gets its layer's RNG of the step, so a mask of the
slice's shape would repeat from slice to slice. While slice s of k is
traced (`slice_of`), `Dropout` instead draws the mask of the call's whole
rows (k b, ...) and keeps the slice's rows [s b, (s + 1) b): bit for bit
the unsliced call's mask for those rows. Each slice computes the whole
draw: on the CPU backend JAX runs threefry's rounds in a loop, which XLA
does not fuse with the slice, so a `Dropout`'s mask temporaries do not
shrink with the slices (`compiled.memory_analysis` accounts them, and the
planner with it).

Two other kinds of trax layers draw the same in any slice: the efficient
attention layers (`attention_heads.attention_layers`) draw per (example,
head) pair with one RNG for every pair (attention dropout, LSH rotations),
and `PositionalEncoding` draws its offset and its dropout mask over the
positions and features only (shape (1, length, d_feature)). Whether any
other draw remains is read with `exact_draws_fixed` (`stack_bytes`): the
speed model ranks batch slices by speed only where none does and no layer
hashes its activations (`hashing`, `candidates`).
"""

import contextlib
import threading
from typing import Any, Iterator, Sequence

from jax import lax
import numpy as np
from trax import fastmath
from trax.fastmath import ops as fastmath_ops
from trax.layers import attention as tl_attention
from trax.layers import core

from trax_revplus.trainer._step import attention_heads
from trax_revplus.trax_door import layers as layer_door

# The slice being traced, per thread: (index s, a traced int32; k slices).
_tracing = threading.local()


def _at() -> tuple[Any, int] | None:
  return getattr(_tracing, 'at', None)


def _bernoulli_of(rows: int | None = None, key=None, at=None):
  """`fastmath.random.bernoulli` as `Dropout` calls it, where a mask of
  `rows` rows is slice `at` = (s, k) of the whole rows' mask (None: drawn
  as asked), and `key` replaces the RNG (None: the one given)."""
  own = fastmath_ops.RandomBackend.bernoulli

  def bernoulli(rng, p, shape):
    rng = rng if key is None else key
    shape = tuple(shape)
    if at is None or rows is None or not shape or shape[0] != rows:
      return own(fastmath.random, rng, p, shape)
    s, k = at
    whole = own(fastmath.random, rng, p, (k * rows,) + shape[1:])
    return lax.dynamic_slice_in_dim(whole, s * rows, rows)

  return bernoulli


def _draws_per_row(layer, x) -> bool:
  """Whether `layer`'s (a `Dropout`'s) mask on input `x` has a row axis:
  not shared along axis 0."""
  ndim = getattr(x, 'ndim', 0)
  shared = layer_door.dropout_shared_axes(layer)
  return ndim > 0 and all(a % ndim != 0 for a in shared)


@contextlib.contextmanager
def _dropout_drawing(make_bernoulli) -> Iterator[None]:
  """Within the block, every trax `Dropout` draws its mask with
  `make_bernoulli(layer, x)` (a `fastmath.random.bernoulli`, or None for
  trax's own); put back as found after it, also on an error."""
  found = core.Dropout.__dict__['forward']

  def forward(layer, x):
    bernoulli = make_bernoulli(layer, x)
    if bernoulli is None:
      return found(layer, x)
    fastmath.random.bernoulli = bernoulli
    try:
      return found(layer, x)
    finally:
      del fastmath.random.bernoulli

  core.Dropout.forward = forward
  try:
    yield
  finally:
    core.Dropout.forward = found


@contextlib.contextmanager
def slice_of(s: Any, k: int) -> Iterator[None]:
  """Within the block (the trace of slice `s` of a call's `k` slices),
  trax's `Dropout` layers draw their rows of the unsliced call's masks.

  Args:
    s: int32 scalar (traced: a loop's index), the slice, 0 <= s < k.
    k: int, the call's slices; each slice's inputs have b rows of the
      call's k b.

  Yields:
    None. Restored as found on exit, also on an error.
  """
  previous = _at()
  _tracing.at = (s, k)

  def make(layer, x):
    at = _at()
    if at is None or not _draws_per_row(layer, x):
      return None
    return _bernoulli_of(x.shape[0], at=at)

  try:
    if previous is None:
      with _dropout_drawing(make):
        yield
    else:  # already drawing by slice: only the slice changes
      yield
  finally:
    _tracing.at = previous


# A fixed key for the draws `exact_draws_fixed` takes off the RNG. A numpy
# array: a JAX array made at import would start JAX's backend in every
# process that imports the trainer, parents of the runs included.
_FIXED_KEY = np.zeros((2,), np.uint32)


@contextlib.contextmanager
def exact_draws_fixed(layers: Sequence[Any]) -> Iterator[None]:
  """Within the block, the draws that batch slices keep exact read a fixed
  key instead of their layer's RNG: trax's `Dropout` masks, and everything
  trax's efficient attention and `PositionalEncoding` layers among `layers`
  (and their sublayers) draw. A forward traced inside it
  (`rng_use.forward_types`) that still depends on an RNG holds a draw that
  slices change (e.g. `tl.Attention`'s dropout, of shape (rows x heads,
  length, length)).

  Args:
    layers: trax layers about to be traced; the caller keeps them as found
      (`layers.preserved`) around the block.

  Yields:
    None. Put back as found on exit, also on an error.
  """
  attention = attention_heads.attention_layers(layers) + [
    layer
    for layer in attention_heads.sublayers(layers)
    if isinstance(layer, tl_attention.PositionalEncoding)
  ]
  for a in attention:
    # trax's `Layer.__setattr__` refuses public names but its own three.
    vars(a)['forward'] = _with_fixed_key(a)
  try:
    with _dropout_drawing(lambda layer, x: _bernoulli_of(key=_FIXED_KEY)):
      yield
  finally:
    for a in attention:
      vars(a).pop('forward', None)


def _with_fixed_key(layer):
  own = type(layer).forward

  def forward(x):
    layer_door.set_rng(layer, _FIXED_KEY)
    return own(layer, x)

  return forward
