"""The loop over batch slices: `lax.scan` over k slices of a call's rows.

`scan_rows` runs a slice's body k times inside one loop, so that XLA keeps
one slice's intermediates at a time, and gives the slices' per-row results
back whole (`slices` and `loss_slices` build the bodies).
"""

from typing import Any, Callable

import jax
from jax import lax
from jax import numpy as jnp
import numpy as np

from trax_revplus.trainer._step import row_draws
from trax_revplus.typing import Array
from trax_revplus.typing import PyTree

FLOAT0 = jax.dtypes.float0


def merge(x: Array) -> Array:
  """Puts k slices (leading axis k) back together along the rows."""
  return x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:])


def is_float0(x: Any) -> bool:
  """Whether x is a float0 array (a cotangent of an integer input)."""
  return getattr(x, 'dtype', None) == FLOAT0


def stackable(
  tree: PyTree,
) -> tuple[list[Array], Callable[[list[Array], int], PyTree]]:
  """(leaves lax.scan can stack, a function rebuilding the merged tree)."""
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  shapes = [(x.shape, is_float0(x)) for x in leaves]
  kept = [x for x in leaves if not is_float0(x)]

  def merged(stacked, k):
    stacked = list(stacked)
    out: list[Array | np.ndarray] = []
    for shape, float0 in shapes:
      if float0:
        out.append(np.zeros((k * shape[0],) + shape[1:], FLOAT0))
      else:
        out.append(merge(stacked.pop(0)))
    return jax.tree_util.tree_unflatten(treedef, out)

  return kept, merged


def _types(tree):
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  return treedef, [
    (x.shape, x.dtype, getattr(x, 'weak_type', False)) for x in leaves
  ]


def _reshaped(carry, after_one):
  """`carry` with each leaf reshaped to its type in `after_one`, or None
  where a leaf changes more than its shape (its size, dtype or the tree)."""
  leaves, treedef = jax.tree_util.tree_flatten(carry)
  after, after_def = jax.tree_util.tree_flatten(after_one)
  # jaxlib ships no stub of PyTreeDef: mypy knows no comparison of it.
  if treedef != after_def or any(  # type: ignore[operator]
    np.size(x) != int(np.prod(a.shape)) or jnp.result_type(x) != a.dtype
    for x, a in zip(leaves, after)
  ):
    return None
  return jax.tree_util.tree_unflatten(
    treedef, [jnp.reshape(x, a.shape) for x, a in zip(leaves, after)]
  )


def scan(
  body: Callable[[PyTree, PyTree], tuple[PyTree, PyTree]],
  carry: PyTree,
  xs: PyTree,
) -> tuple[PyTree, PyTree]:
  """`lax.scan(body, carry, xs)` over the k slices, also where the carry
  changes type in the first slice; every slice runs inside the loop, one
  at a time.

  trax's `ConcatWithPadding` and `StripFromConcatenateWithPadding` (in
  Terraformer) mark their first call by reshaping their int32 state from
  () to (1,), which their output does not read outside predict mode; a
  scan's carry must keep its type. Where the first slice only reshapes
  leaves of the carry, the scan starts from the carry so reshaped (the
  value the first call would give them). Where it changes more, the first
  slice runs, in a `lax.cond`, on the carry given. (Run before the loop,
  the first slice's program is scheduled beside the loop's, or inlined
  with a loop of one slice, and their temporaries add up: 2 slices would
  not shrink the call. The cond's branches cost a copy of the carry.)

  Returns:
    (carry, ys) as `lax.scan`: ys leaves have the leading axis k.

  Raises:
    ValueError: the carry changes type in a later slice too.
  """
  first = jax.tree_util.tree_map(lambda x: x[0], xs)
  after_one = jax.eval_shape(lambda c, x: body(c, x)[0], carry, first)
  if _types(after_one) == _types(carry):
    return lax.scan(body, carry, xs)
  after_two = jax.eval_shape(lambda c, x: body(c, x)[0], after_one, first)
  if _types(after_two) != _types(after_one):
    raise ValueError(
      'a layer state changes type in more than its first '
      'call; it cannot run over batch slices.'
    )
  reshaped = _reshaped(carry, after_one)
  if reshaped is not None:
    return lax.scan(body, reshaped, xs)
  k = jax.tree_util.tree_leaves(xs)[0].shape[0]

  def body_from_given_carry(c, indexed):
    i, x = indexed
    return lax.cond(i == 0, lambda _, x_: body(carry, x_), body, c, x)

  # Never read: the first slice runs on `carry`.
  placeholder = jax.tree_util.tree_map(
    lambda t: jnp.zeros(t.shape, t.dtype), after_one
  )
  return lax.scan(
    body_from_given_carry, placeholder, (jnp.arange(k, dtype=jnp.int32), xs)
  )


def scan_rows(
  body: Callable[[PyTree, PyTree], tuple[PyTree, tuple]],
  carry: PyTree,
  xs: PyTree,
  k: int,
  rows_at: int = 0,
  loop: Callable[..., tuple[PyTree, PyTree]] = scan,
) -> tuple[PyTree, tuple, Callable[[], PyTree]]:
  """`loop(body, carry, xs)` over k slices, where item `rows_at` of the
  body's results is a tree of the slice's rows, given back whole.

  `lax.scan` stacks arrays only: the item's float0 leaves are left out of
  the scan and its tree is rebuilt after it (`stackable`). Each slice's
  body is traced with `row_draws.slice_of`: its random masks are its rows
  of the unsliced call's.

  Args:
    body: `(carry, x) -> (carry, ys)`, ys a tuple.
    carry, xs: as `lax.scan`'s.
    k: int, the slices.
    rows_at: int, the item of ys whose leaves are per row.
    loop: `scan` (a carry that may change type in the first slice) or
      `lax.scan`.

  Returns:
    (carry, ys, rows): carry and ys as `loop`'s; `rows()` puts the slices'
    trees of ys[rows_at] back together along the rows. The caller calls it
    where its program joins them (e.g. after a backward's update), so that
    the program's operations keep their order.
  """
  merged: list[Any] = []

  def stacked_body(c, indexed):
    s, x = indexed
    with row_draws.slice_of(s, k):
      c, ys = body(c, x)
    outs = list(ys)
    outs[rows_at], merge = stackable(outs[rows_at])
    # The tree is known only while tracing the body; the last trace's is
    # the scan's.
    merged[:] = [merge]
    return c, tuple(outs)

  carry, ys = loop(stacked_body, carry, (jnp.arange(k, dtype=jnp.int32), xs))
  return carry, ys, lambda: merged[0](ys[rows_at], k)
