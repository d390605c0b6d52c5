"""Batch slices: one compiled call over k slices of each device's rows.

With k > 1 batch slices every function of the step (`step_fns`) runs
inside a `jax.lax.scan` over k equal slices of the rows it is given (each
device's rows, inside a per-device call): a forward maps each slice and
puts the outputs back together; a backward sums the slices' weight
gradients and applies one optimizer update. XLA keeps one slice's
intermediates at a time, so a call's temporary bytes shrink about k-fold;
its arguments and results are those of the unsliced call. With k = 1 each
builder returns `step_fns`'s function unchanged.

What stays exact (up to float32 summation order):
  * layers that treat rows independently (trax's Embedding, Dense,
    LayerNorm, attention, ...): every row sees what it would unsliced;
  * layer state: a leaf with entries per row is split with the rows: trax's
    efficient attention layers (`SelfAttention`, `LSHSelfAttention`,
    `PureLSHSelfAttention`) keep one per row and head (their per-example
    hash RNGs and buckets), so LSH hashes each row as it would unsliced;
    in any other layer, a leaf whose leading axis is a multiple of the rows
    counts as rows-major (e.g. `_RememberInReverse` of Terraformer's sparse
    feed-forward, which remembers its input). Any other state is given
    whole to every slice, and the last slice's new value is kept;
  * RNGs: every slice gets its layer's RNG of the step, so a random draw
    whose shape does not depend on the rows (LSH's rotations) is the same
    as unsliced; trax's `Dropout` draws the unsliced call's mask and keeps
    the slice's rows (`row_draws`), so its masks are the unsliced ones; a
    draw of slice shape in any other layer (`tl.Attention`'s dropout)
    repeats from slice to slice (deterministic across runs and resumes,
    not the unsliced draw: `row_draws.exact_draws_fixed`);
  * the loss: see `loss_slices`.

The module holds the three parts of such a call, in this order:
  * the loop over batch slices: `scan_rows` runs a slice's body k times
    inside one `lax.scan`, so that XLA keeps one slice's intermediates at
    a time, and gives the slices' per-row results back whole (this
    module's builders and `loss_slices` build the bodies);
  * how a call's rows and its layers' states split into batch slices:
    `state_rows` says how each leaf of a layer's state splits with the
    rows (the rules above); `Rows` and `States` split a call's per-row
    arrays and states into k slices for `lax.scan` and put the slices' new
    states back together (the loss program, micro-batches and the
    evaluation split rows and states by the same rules);
  * the sliced step functions built from them (`forward`, `fbo`,
    `segment_reverse`).
"""

from typing import Any, Callable, Sequence

import jax
from jax import lax
from jax import numpy as jnp
import numpy as np
from trax import fastmath
from trax import layers as tl
from trax.optimizers import base as optimizer_base

from trax_revplus.trainer._step import chains
from trax_revplus.trainer._step import row_draws
from trax_revplus.trainer._step import step_fns
from trax_revplus.trainer._step import ties as ties_lib
from trax_revplus.trax_door import layers as layer_door
from trax_revplus.typing import Array
from trax_revplus.typing import PyTree


# The loop over batch slices.

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


# How rows and layer states split into slices.

# `state_rows` of a leaf not known per row: per row if its leading axis is
# a multiple of the batch's rows (rows-major), else shared by all rows.
BY_SHAPE = 0


def state_rows(layer: tl.Layer) -> Any:
  """How each leaf of `layer.state` splits with the batch's rows.

  Returns:
    A pytree of `layer.state`'s structure whose leaves are ints: m > 0 for
    a leaf holding m entries per row along its leading axis (trax's
    efficient attention: one per row and head, row-major), `BY_SHAPE` for
    any other leaf.
  """
  rows = _rows_of(layer)
  # jaxlib ships no stub of PyTreeDef: mypy knows no comparison of it.
  same = (
    jax.tree_util.tree_structure(rows)  # type: ignore[operator]
    == jax.tree_util.tree_structure(layer.state)
  )
  return (
    rows if same else jax.tree_util.tree_map(lambda _: BY_SHAPE, layer.state)
  )


def _rows_of(layer):
  if layer.sublayers:
    return tuple(_rows_of(sub) for sub in layer.sublayers)
  per_row = (
    hasattr(layer, 'create_state_unbatched')
    and isinstance(layer_door.attention_n_heads(layer), int)
    and not layer_door.attention_incremental(layer)
  )
  m = layer_door.attention_n_heads(layer) if per_row else BY_SHAPE
  return jax.tree_util.tree_map(lambda _: m, layer.state)


def _split(x, k):
  return x.reshape((k, x.shape[0] // k) + x.shape[1:])


class Rows:
  """A pytree of per-row arrays, split into k slices for `lax.scan`.

  Float0 leaves (cotangents of integer inputs) cannot be scanned; each
  slice gets float0 zeros of its shape instead.
  """

  def __init__(self, tree: PyTree, k: int):
    self._leaves, self._treedef = jax.tree_util.tree_flatten(tree)
    self.scanned = [_split(x, k) for x in self._leaves if not is_float0(x)]
    self._k = k

  def slice(self, scanned: Sequence[Array]) -> PyTree:
    """The tree of one slice, from its scanned leaves."""
    scanned = list(scanned)
    out: list[Array | np.ndarray] = []
    for x in self._leaves:
      if is_float0(x):
        out.append(np.zeros((x.shape[0] // self._k,) + x.shape[1:], FLOAT0))
      else:
        out.append(scanned.pop(0))
    return jax.tree_util.tree_unflatten(self._treedef, out)


class States:
  """Layer states: leaves split with the rows, and leaves shared whole."""

  def __init__(self, states: PyTree, rows: PyTree, n_rows: int, k: int):
    leaves, self._treedef = jax.tree_util.tree_flatten(states)
    ms = jax.tree_util.tree_leaves(rows)
    if len(ms) != len(leaves):
      ms = [BY_SHAPE] * len(leaves)
    # Per leaf: the entries its rows use (split), or None (shared whole).
    self._used: list[int | None] = []
    for x, m in zip(leaves, ms):
      if m == BY_SHAPE and getattr(x, 'ndim', 0) and x.shape[0] % n_rows == 0:
        m = x.shape[0] // n_rows
      used = n_rows * m
      ok = (
        m > 0
        and getattr(x, 'ndim', 0) > 0
        and x.shape[0] >= used
        and used % k == 0
      )
      self._used.append(used if ok else None)
    self._leaves = leaves
    self._k = k
    self.scanned = [
      _split(x[:u], k) for x, u in zip(leaves, self._used) if u is not None
    ]
    self.shared = [x for x, u in zip(leaves, self._used) if u is None]

  def slice(
    self, scanned: Sequence[Array], shared: Sequence[Array] | None = None
  ) -> PyTree:
    """The states of one slice, from its scanned leaves."""
    scanned, shared = (
      list(scanned),
      list(self.shared if shared is None else shared),
    )
    out = [
      scanned.pop(0) if u is not None else shared.pop(0) for u in self._used
    ]
    return jax.tree_util.tree_unflatten(self._treedef, out)

  def slice_at(self, s: int) -> PyTree:
    """The states of slice s: its rows of each per-row leaf, each shared
    leaf whole."""
    return self.slice([x[s] for x in self.scanned])

  def with_slice(self, s: int, states: PyTree) -> PyTree:
    """Host states: the whole states with slice s's rows of each per-row
    leaf, and each shared leaf, taken from `states` (a slice's new states,
    host arrays); the other rows as they are (copied)."""
    per_row, shared = self.parts(states)
    out: list[Array | np.ndarray] = []
    for x, u in zip(self._leaves, self._used):
      if u is None:
        out.append(shared.pop(0))
      else:
        b = u // self._k
        x = np.array(x)
        x[s * b : (s + 1) * b] = per_row.pop(0)
        out.append(x)
    return jax.tree_util.tree_unflatten(self._treedef, out)

  def parts(self, states: PyTree) -> tuple[list[Array], list[Array]]:
    """(per-row leaves, shared leaves) of a slice's new states."""
    leaves = jax.tree_util.tree_leaves(states)
    return (
      [x for x, u in zip(leaves, self._used) if u is not None],
      [x for x, u in zip(leaves, self._used) if u is None],
    )

  def join(self, stacked: Sequence[Array], shared: Sequence[Array]) -> PyTree:
    """The whole new states: the slices' per-row leaves put back together
    (rows beyond the batch's kept), the last slice's shared leaves."""
    stacked, shared = list(stacked), list(shared)
    out = []
    for x, u in zip(self._leaves, self._used):
      if u is None:
        out.append(shared.pop(0))
      else:
        rows = merge(stacked.pop(0))
        out.append(
          rows if u == x.shape[0] else jnp.concatenate([rows, x[u:]], axis=0)
        )
    return jax.tree_util.tree_unflatten(self._treedef, out)


def n_rows(tree: PyTree) -> int:
  """Leading-axis size of the first leaf of `tree` (the rows)."""
  return jax.tree_util.tree_leaves(tree)[0].shape[0]


# The sliced step functions.


def add(acc: PyTree, tree: PyTree) -> PyTree:
  """`acc + tree`, leaf by leaf."""
  return jax.tree_util.tree_map(jnp.add, acc, tree)


def zeros(tree: PyTree) -> PyTree:
  """Zeros shaped as `tree`, leaf by leaf."""
  return jax.tree_util.tree_map(jnp.zeros_like, tree)


def forward(
  fn: Callable[..., tuple[PyTree, PyTree]], k: int, rows: PyTree
) -> Callable[..., tuple[PyTree, PyTree]]:
  """`fn` (a `Kind.FORWARD` or `Kind.SEGMENT_FORWARD` function) over k
  slices; `rows` is `state_rows` of its state argument."""
  if k == 1:
    return fn

  def sliced(inputs, weights, states, rngs):
    st = States(states, rows, n_rows(inputs), k)
    xs = Rows(inputs, k)

    def body(shared, scanned):
      x, state_rows_ = scanned
      y, new_states = fn(xs.slice(x), weights, st.slice(state_rows_), rngs)
      per_row, new_shared = st.parts(new_states)
      return new_shared, (y, per_row)

    shared, (_, per_row), outputs = scan_rows(
      body, st.shared, (xs.scanned, st.scanned), k
    )
    return outputs(), st.join(per_row, shared)

  return sliced


def fbo(
  layer: tl.Layer,
  optimizer: optimizer_base.Optimizer,
  n_devices: int,
  adasum: bool,
  k: int,
  rows: PyTree,
  mode: step_fns.Update = step_fns.Update.NOW,
) -> Callable[..., tuple]:
  """`step_fns.fbo_fn` of a standard layer over k slices (`mode`: see
  `step_fns.update_fn`)."""
  if k == 1:
    return step_fns.fbo_fn(layer, optimizer, n_devices, adasum, mode=mode)
  update = step_fns.update_fn(optimizer, n_devices, adasum, mode)

  def sliced(inputs, weights, grads, state, slots, opt_params, rng, step):
    st = States(state, rows, n_rows(inputs), k)
    xs, cts = Rows(inputs, k), Rows(grads, k)

    def body(carry, scanned):
      acc, _ = carry
      x, ct, state_rows_ = scanned
      s = st.slice(state_rows_)
      _, vjp_fn, new_state = fastmath.vjp(
        lambda x_, w_: layer.pure_fn(x_, w_, s, rng),
        xs.slice(x),
        weights,
        has_aux=True,
      )
      grads_inputs, grads_weights = vjp_fn(cts.slice(ct))
      per_row, new_shared = st.parts(new_state)
      return (add(acc, grads_weights), new_shared), (grads_inputs, per_row)

    (grads_weights, shared), (_, per_row), grads_inputs = scan_rows(
      body,
      (zeros(weights), st.shared),
      (xs.scanned, cts.scanned, st.scanned),
      k,
    )
    new_state = st.join(per_row, shared)
    new_weights, new_slots, stats = update(
      grads_weights, weights, slots, opt_params, step
    )
    return new_weights, new_state, new_slots, grads_inputs(), stats

  return sliced


def segment_reverse(
  layers: Sequence[tl.Layer],
  optimizers: Sequence[optimizer_base.Optimizer],
  n_devices: int,
  adasum: bool,
  k: int,
  rows: PyTree,
  in_call: ties_lib.InCall = (),
  mode: step_fns.Update = step_fns.Update.NOW,
) -> Callable[..., tuple]:
  """`step_fns.segment_reverse_fn` over k slices: each slice reversed
  through every layer, last to first; then each layer's update.

  Where the segment keeps the stack's depth (its layers' `n_in == n_out`,
  as `ReversibleHalfResidual` and `ReversibleSwap`), the slices'
  reconstructed inputs and input cotangents are written over their outputs
  and output cotangents, in place: with those arguments donated, as the
  trainer donates them, the call needs no second batch-sized buffer. A
  segment that changes it (`tl.ReversibleSelect([0, 0])`) collects them as
  a scan's results instead. `in_call`: see `step_fns.update_each`; `mode`:
  `step_fns.update_fn`.
  """
  if k == 1:
    return step_fns.segment_reverse_fn(
      layers, optimizers, n_devices, adasum, in_call, mode
    )
  updates = [
    step_fns.update_fn(opt, n_devices, adasum, mode) for opt in optimizers
  ]

  if any(layer.n_in != layer.n_out for layer in layers):

    def sliced_by_scan(
      outputs, weights, grads, states, new_states, slots, opt_params, rngs, step
    ):
      n = n_rows(outputs)
      old, new = States(states, rows, n, k), States(new_states, rows, n, k)
      ys, cts = Rows(outputs, k), Rows(grads, k)

      def body(acc, scanned):
        y, ct, old_rows, new_rows = scanned
        stack, grad_stack, grads_weights = chains.reverse_and_grad_chain(
          layers,
          ys.slice(y),
          cts.slice(ct),
          weights,
          old.slice(old_rows),
          new.slice(new_rows),
          rngs,
        )
        return add(acc, grads_weights), ((stack, grad_stack),)

      # The carry holds only gradient sums, whose type the slices keep.
      grads_weights, _, done = scan_rows(
        body,
        zeros(weights),
        (ys.scanned, cts.scanned, old.scanned, new.scanned),
        k,
        loop=lax.scan,
      )
      inputs, grads_inputs = done()
      new_weights, new_slots, stats = step_fns.update_each(
        updates, grads_weights, weights, slots, opt_params, step, in_call
      )
      return new_weights, new_slots, inputs, grads_inputs, stats

    return sliced_by_scan

  def sliced(
    outputs, weights, grads, states, new_states, slots, opt_params, rngs, step
  ):
    n = n_rows(outputs)
    b = n // k
    old, new = States(states, rows, n, k), States(new_states, rows, n, k)
    leaves, treedef = jax.tree_util.tree_flatten((outputs, grads))
    moving = [i for i, x in enumerate(leaves) if not is_float0(x)]

    def slice_of(bufs, s):
      part = list(leaves)
      for i, x in zip(moving, bufs):
        part[i] = lax.dynamic_slice_in_dim(x, s * b, b)
      for i, x in enumerate(leaves):
        if is_float0(x):
          part[i] = np.zeros((b,) + x.shape[1:], FLOAT0)
      return jax.tree_util.tree_unflatten(treedef, part)

    def body(s, carry):
      bufs, acc = carry
      stack, grad_stack = slice_of(bufs, s)
      at = lambda arrays: [
        lax.dynamic_index_in_dim(a, s, keepdims=False) for a in arrays
      ]
      with row_draws.slice_of(s, k):
        stack, grad_stack, grads_weights = chains.reverse_and_grad_chain(
          layers,
          stack,
          grad_stack,
          weights,
          old.slice(at(old.scanned)),
          new.slice(at(new.scanned)),
          rngs,
        )
      done = jax.tree_util.tree_leaves((stack, grad_stack))
      bufs = [
        lax.dynamic_update_slice_in_dim(
          buf, done[i].astype(buf.dtype), s * b, 0
        )
        for i, buf in zip(moving, bufs)
      ]
      return bufs, add(acc, grads_weights)

    bufs, grads_weights = lax.fori_loop(
      0, k, body, ([leaves[i] for i in moving], zeros(weights))
    )
    done = list(leaves)
    for i, x in zip(moving, bufs):
      done[i] = x
    inputs, grads_inputs = jax.tree_util.tree_unflatten(treedef, done)
    new_weights, new_slots, stats = step_fns.update_each(
      updates, grads_weights, weights, slots, opt_params, step, in_call
    )
    return new_weights, new_slots, inputs, grads_inputs, stats

  return sliced
