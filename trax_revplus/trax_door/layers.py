"""Private attributes and methods of trax's layers.

trax's layers keep their constructor arguments in private attributes (a
`ReversibleSelect`'s indices, a `Dropout`'s shared axes, an efficient
attention's head count); the trainer's plans and the input checks read them
here. trax's `Layer` keeps its sublayers and its input and output counts
privately too; our layers that subclass trax's set them here
(`layers.half_residual`). trax is not imported here: the functions take
the layers.
"""

from typing import Any

from trax_revplus.trax_door.registry import ATTRIBUTE
from trax_revplus.trax_door.registry import METHOD
from trax_revplus.trax_door.registry import uses

LAYER = 'trax.layers.base.Layer'
SELECT = 'trax.layers.reversible.ReversibleSelect'
DROPOUT = 'trax.layers.core.Dropout'
SELF_ATTENTION = 'trax.layers.research.efficient_attention.SelfAttention'
LSH_SELF_ATTENTION = 'trax.layers.research.efficient_attention.LSHSelfAttention'
POSITIONAL_ENCODING = 'trax.layers.attention.PositionalEncoding'
AXIAL_POSITIONAL_ENCODING = (
  'trax.layers.research.position_encodings.AxialPositionalEncoding'
)


@uses(
  SELECT,
  '_indices',
  ATTRIBUTE,
  'the input index of each output, in output order',
  check=lambda v: all(isinstance(i, int) for i in v),
)
def select_indices(layer: Any) -> Any:
  """A `ReversibleSelect`'s (`ReversibleSwap`'s) input index per output
  (its `_indices`); None for a layer without them."""
  return getattr(layer, '_indices', None)


@uses(
  DROPOUT,
  '_shared_axes',
  ATTRIBUTE,
  'the axes (ints, negative ones counted from the end) along which the '
  'mask is shared, a sequence',
  check=lambda v: all(isinstance(a, int) for a in v),
)
def dropout_shared_axes(layer: Any) -> Any:
  """The axes along which a `Dropout`'s mask is shared (its
  `_shared_axes`)."""
  return layer._shared_axes  # pylint: disable=protected-access


_N_HEADS = (
  "the number of heads, an int; the layer's state has one entry "
  'per row and head along its leading axis'
)
_INCREMENTAL = (
  'whether it decodes one position at a time (its state is '
  'then a cache, not per row and head), a bool'
)


def _is_int(v):
  return isinstance(v, int)


def _is_bool(v):
  return isinstance(v, bool)


@uses(
  LAYER,
  '_sublayers',
  ATTRIBUTE,
  'its sublayers, a tuple: what `sublayers` returns, which its weights '
  'and state follow',
  check=lambda v: isinstance(v, tuple),
)
def set_sublayers(layer: Any, sublayers: tuple) -> None:
  """Sets a layer's sublayers (its `_sublayers`), as trax's combinators
  do in their constructors: `Layer`'s constructor takes none, and its
  `sublayers` property has no setter."""
  layer._sublayers = sublayers  # pylint: disable=protected-access


@uses(
  LAYER,
  '_n_in',
  ATTRIBUTE,
  'the inputs it takes, an int: what `n_in` returns',
  check=_is_int,
)
@uses(
  LAYER,
  '_n_out',
  ATTRIBUTE,
  'the outputs it gives, an int: what `n_out` returns',
  check=_is_int,
)
def set_n_in_n_out(layer: Any, n_in: int, n_out: int) -> None:
  """Sets a layer's input and output counts (its `_n_in`, `_n_out`) after
  its constructor, where they follow from sublayers made after it (as
  trax's combinators do)."""
  layer._n_in = n_in  # pylint: disable=protected-access
  layer._n_out = n_out  # pylint: disable=protected-access


@uses(SELF_ATTENTION, '_n_heads', ATTRIBUTE, _N_HEADS, check=_is_int)
@uses(LSH_SELF_ATTENTION, '_n_heads', ATTRIBUTE, _N_HEADS, check=_is_int)
def attention_n_heads(layer: Any) -> Any:
  """An efficient attention layer's (`SelfAttention`'s,
  `LSHSelfAttention`'s) head count (its `_n_heads`); None for a layer
  without one."""
  return getattr(layer, '_n_heads', None)


@uses(SELF_ATTENTION, '_incremental', ATTRIBUTE, _INCREMENTAL, check=_is_bool)
@uses(
  LSH_SELF_ATTENTION, '_incremental', ATTRIBUTE, _INCREMENTAL, check=_is_bool
)
def attention_incremental(layer: Any) -> bool:
  """Whether an efficient attention layer (`SelfAttention`,
  `LSHSelfAttention`) decodes incrementally (its
  `_incremental`); False for a layer without it."""
  return getattr(layer, '_incremental', False)


@uses(
  POSITIONAL_ENCODING,
  '_max_len',
  ATTRIBUTE,
  'the longest sequence it encodes, an int',
  check=lambda v: isinstance(v, int),
)
def positional_max_len(layer: Any) -> Any:
  """A `PositionalEncoding`'s longest sequence (its `_max_len`), or None."""
  return getattr(layer, '_max_len', None)


@uses(
  AXIAL_POSITIONAL_ENCODING,
  '_shape',
  ATTRIBUTE,
  'the axial shape, ints whose product is the sequence length it encodes',
  check=lambda v: all(isinstance(n, int) for n in v),
)
def axial_shape(layer: Any) -> tuple:
  """An `AxialPositionalEncoding`'s axial shape (its `_shape`); () for a
  layer without one."""
  return tuple(getattr(layer, '_shape', ()))


@uses(
  LAYER,
  '_rng',
  ATTRIBUTE,
  'the PRNG key `forward` draws from, set directly (the `rng` setter '
  'also reaches the sublayers)',
  check=lambda v: tuple(v.shape) == (2,),
)
def set_rng(layer: Any, key: Any) -> None:
  """Sets the key the layer's own `forward` draws from (its `_rng`), and
  no sublayer's."""
  layer._rng = key  # pylint: disable=protected-access


@uses(
  LAYER,
  '_forward_abstract',
  METHOD,
  "the layer's outputs' and new state's `ShapeDtype`s for inputs' "
  'ones, nothing computed',
  parameters=('input_signature',),
)
def forward_abstract(layer: Any, input_signature: Any) -> Any:
  """`(outputs, new state)` as `ShapeDtype`s, for `input_signature`
  (trax's `Layer._forward_abstract`), with the layer's weights and state."""
  return layer._forward_abstract(input_signature)  # pylint: disable=protected-access
