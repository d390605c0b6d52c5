"""Checking and preparing the arguments of `reverse` / `reverse_and_grad`.

Weights, state and `new_state` must have one entry per sublayer (stock trax
truncates a short tuple with `zip` and returns wrong results); numpy leaves
become jax arrays (trax's efficient attention indexes them inside
`lax.fori_loop`); states of layers that remember their forward pass are
marked for replay.
"""

from typing import Any

import jax
import numpy as np
from trax.layers import base

from trax_revplus.typing import Array
from trax_revplus.typing import PyTree
from trax_revplus.typing import Stack


def as_tuple(xs: Stack) -> tuple[Array, ...]:
  return tuple(xs) if isinstance(xs, (tuple, list)) else (xs,)


def as_jax_arrays(*trees: PyTree) -> tuple[PyTree, ...]:
  """`trees` with numpy leaves turned into jax arrays (float0 ones kept).

  trax's efficient attention (e.g. `LSHSelfAttention` without
  `use_python_loop`) indexes its weights, state and output cotangents with
  loop counters inside `lax.fori_loop`, which a numpy array cannot take
  (`TracerArrayConversionError`, in stock trax too); jax arrays and tracers
  can, and pass through unchanged.
  """

  def convert(x: Any) -> Any:
    if isinstance(x, (np.ndarray, np.generic)) and x.dtype != jax.dtypes.float0:
      return jax.numpy.asarray(x)
    return x

  return jax.tree_util.tree_map(convert, trees)


def replace_second_time(state: PyTree, new_state: PyTree) -> PyTree:
  """Marks states of `_RememberInReverse`-style layers as a second pass.

  A layer whose state is `(value, {'running_second_time': ...})` (trax's
  `sparsity._RememberInReverse`, used by Terraformer's sparse feed-forward)
  recorded `value` on the forward pass. When the residual is recomputed for
  the backward pass it must replay that value rather than recompute it, so it
  gets `(new_value, {'running_second_time_yes': ()})`. Mirrors the closure of
  the same name in trax's `ReversibleHalfResidual.reverse_and_grad`.

  Args:
    state: the state the forward pass started from (nested tuples/lists).
    new_state: the state the forward pass returned; same structure.

  Returns:
    `state` with every remembering layer's entry replaced as above.

  Raises:
    ValueError: if `state` and `new_state` differ in structure.
  """
  if (
    isinstance(state, tuple)
    and len(state) == 2
    and isinstance(state[1], dict)
    and 'running_second_time' in state[1]
  ):
    return (new_state[0], {'running_second_time_yes': ()})
  if isinstance(state, (tuple, list)):
    if not isinstance(new_state, (tuple, list)) or len(new_state) != len(state):
      raise ValueError(
        'state and new_state differ in structure: state has '
        f'{len(state)} entries, new_state is {type(new_state).__name__} '
        f'{new_state!r:.80}. Pass the new_state returned by the forward pass '
        'that started from this state.'
      )
    return type(state)(
      replace_second_time(s, ns) for s, ns in zip(state, new_state)
    )
  return state


def check_per_sublayer(layer: base.Layer, **trees: PyTree) -> None:
  """Raises ValueError unless each tree has one entry per sublayer."""
  n = len(layer.sublayers)
  for arg_name, tree in trees.items():
    if not isinstance(tree, (tuple, list)) or len(tree) != n:
      got = len(tree) if isinstance(tree, (tuple, list)) else type(tree)
      raise ValueError(
        f'{layer.name}: {arg_name} must have one entry per sublayer '
        f"({n}), got {got}. Pass the layer's weights/state (e.g. "
        f'layer.weights, layer.state, and the state returned by forward).'
      )
