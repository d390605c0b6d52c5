"""Layer mixes built twice, with stock trax classes and with trax_revplus's.

Each case is a function `(half_residual_cls, serial_cls) -> (layer, inputs)`
that builds fresh sublayers, so the two builds share structure but no layer
objects. `inputs` are concrete numpy arrays (float32 activations, int32
tokens).

Efficient attention layers use `use_python_loop=True`: in eager mode their
`lax` loops are recompiled on every call, while the Python loop's small ops
are compiled once and shared by the stock and trax_revplus runs.
"""

import numpy as np
from trax import layers as tl
from trax.models.research import configurable_transformer as ct

# Shapes and attention settings as in test_layers' tiny ReformerLM, so that
# eagerly compiled ops are shared between the layer and model tests.
BATCH, LENGTH, D = 2, 16, 16


def _floats(seed, shape=(BATCH, LENGTH, D)):
  return np.random.RandomState(seed).normal(size=shape).astype(np.float32)


def _tokens(seed):
  # Zeros included: they act as padding for the masking residual below.
  return (
    np.random.RandomState(seed)
    .randint(0, 4, size=(BATCH, LENGTH))
    .astype(np.int32)
  )


def _pair():
  return (_floats(1), _floats(2))


def dense(hr, rs):
  return rs(
    hr(tl.Dense(D)), tl.ReversibleSwap(), hr(tl.Dense(D)), tl.ReversibleSwap()
  ), _pair()


def dropout_layernorm(hr, rs):
  return rs(
    hr(tl.LayerNorm(), tl.Dense(D), tl.Dropout(0.5, mode='train')),
    tl.ReversibleSwap(),
    hr(tl.LayerNorm(), tl.Dropout(0.3, mode='train')),
    tl.ReversibleSwap(),
  ), _pair()


def feed_forward(hr, rs):
  def ff():
    return ct.FeedForwardWithOptions(
      D, 2 * D, 0.2, [-2], tl.Relu, 0.1, 0, 0, 0, True, 'train', False
    )

  return rs(
    hr(ff()), tl.ReversibleSwap(), hr(ff()), tl.ReversibleSwap()
  ), _pair()


def aux_outputs(hr, rs):
  """Residual with a second output that gets no gradient (moved to aux)."""
  both = tl.Fn('Both', lambda x: (x, 2.0 * x), n_out=2)
  return rs(hr(tl.Dense(D), both), tl.ReversibleSwap()), _pair()


def lsh_attention(hr, rs):
  def attn():
    return tl.LSHSelfAttention(
      n_heads=2,
      d_qk=8,
      d_v=8,
      causal=True,
      chunk_len=4,
      n_hashes=2,
      n_buckets=4,
      attention_dropout=0.1,
      output_dropout=0.1,
      mode='train',
      use_python_loop=True,
    )

  return rs(
    hr(tl.LayerNorm(), attention_layer=attn()),
    tl.ReversibleSwap(),
    hr(tl.LayerNorm(), tl.Dense(D)),
    tl.ReversibleSwap(),
  ), _pair()


def chunked_self_attention(hr, rs):
  """Chunked SelfAttention, then attention without forward_and_or_backward.

  `tl.Chunk(...)` has no `forward_and_or_backward`, so the second layer takes
  trax's VJP-based fallback path.
  """
  attn = tl.SelfAttention(
    n_heads=2,
    d_qk=8,
    d_v=8,
    causal=True,
    chunk_len=4,
    n_chunks_before=1,
    attention_dropout=0.1,
    output_dropout=0.1,
    mode='train',
    use_python_loop=True,
  )
  chunk_wrapped = tl.Chunk(
    tl.SelfAttention(n_heads=2, d_qk=8, d_v=8, causal=True, mode='train'), 1
  )
  return rs(
    hr(tl.LayerNorm(), attention_layer=attn),
    tl.ReversibleSwap(),
    hr(tl.LayerNorm(), attention_layer=chunk_wrapped),
    tl.ReversibleSwap(),
  ), _pair()


def int_stack(hr, rs):
  """int32 tokens on the stack, read by one residual, passed by others."""

  def masked_dense():
    mask = tl.Fn(
      'MaskByTokens', lambda x, t: x * (t[..., None] > 0).astype(x.dtype)
    )
    return [mask, tl.Dense(D)]

  return rs(
    hr(*masked_dense()),
    tl.ReversibleSwap(),
    hr(tl.Dense(D), tl.Dropout(0.2, mode='train')),
    tl.ReversibleSwap(),
  ), _pair() + (_tokens(3),)


def nested_serial(hr, rs):
  return rs(
    rs(hr(tl.Dense(D)), tl.ReversibleSwap()),
    rs(
      hr(tl.Dense(D), tl.Dropout(0.4, mode='train')),
      tl.ReversibleSwap(),
      rs(hr(tl.LayerNorm()), tl.ReversibleSwap()),
    ),
  ), _pair()


def remember_in_reverse(hr, rs):
  """SparseFF: `_RememberInReverse` state replayed on the second pass."""
  sparse_ff = tl.SparseFF(
    2 * D, n_elements_in_block=4, d_lowrank=8, dropout_rate=0.1, mode='train'
  )
  return rs(hr(tl.LayerNorm(), sparse_ff), tl.ReversibleSwap()), _pair()


CASES = {
  f.__name__: f
  for f in (
    dense,
    dropout_layernorm,
    feed_forward,
    aux_outputs,
    lsh_attention,
    chunked_self_attention,
    int_stack,
    nested_serial,
    remember_in_reverse,
  )
}
