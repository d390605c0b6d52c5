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
"""

from typing import Any, Callable, Sequence

import jax
from jax import lax
from jax import numpy as jnp
import numpy as np
from trax import fastmath
from trax import layers as tl
from trax.optimizers import base as optimizer_base

from trax_revplus.trainer import ties as ties_lib
from trax_revplus.trainer._plan import row_draws
from trax_revplus.trainer._step import chains
from trax_revplus.trainer._step import step_fns
from trax_revplus.trainer._step.slice_loop import FLOAT0
from trax_revplus.trainer._step.slice_loop import is_float0
from trax_revplus.trainer._step.slice_loop import merge
from trax_revplus.trainer._step.slice_loop import scan_rows
from trax_revplus.trax_door import layers as layer_door
from trax_revplus.typing import Array
from trax_revplus.typing import PyTree

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
  same = (jax.tree_util.tree_structure(rows) ==  # type: ignore[operator]
          jax.tree_util.tree_structure(layer.state))
  return rows if same else jax.tree_util.tree_map(lambda _: BY_SHAPE,
                                                  layer.state)


def _rows_of(layer):
  if layer.sublayers:
    return tuple(_rows_of(sub) for sub in layer.sublayers)
  per_row = (hasattr(layer, 'create_state_unbatched') and
             isinstance(layer_door.attention_n_heads(layer), int) and
             not layer_door.attention_incremental(layer))
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
      ok = (m > 0 and getattr(x, 'ndim', 0) > 0 and x.shape[0] >= used and
            used % k == 0)
      self._used.append(used if ok else None)
    self._leaves = leaves
    self._k = k
    self.scanned = [_split(x[:u], k) for x, u in zip(leaves, self._used)
                    if u is not None]
    self.shared = [x for x, u in zip(leaves, self._used) if u is None]

  def slice(self, scanned: Sequence[Array],
            shared: Sequence[Array] | None = None) -> PyTree:
    """The states of one slice, from its scanned leaves."""
    scanned, shared = list(scanned), list(
        self.shared if shared is None else shared)
    out = [scanned.pop(0) if u is not None else shared.pop(0)
           for u in self._used]
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
        x[s * b:(s + 1) * b] = per_row.pop(0)
        out.append(x)
    return jax.tree_util.tree_unflatten(self._treedef, out)

  def parts(self, states: PyTree) -> tuple[list[Array], list[Array]]:
    """(per-row leaves, shared leaves) of a slice's new states."""
    leaves = jax.tree_util.tree_leaves(states)
    return ([x for x, u in zip(leaves, self._used) if u is not None],
            [x for x, u in zip(leaves, self._used) if u is None])

  def join(self, stacked: Sequence[Array],
           shared: Sequence[Array]) -> PyTree:
    """The whole new states: the slices' per-row leaves put back together
    (rows beyond the batch's kept), the last slice's shared leaves."""
    stacked, shared = list(stacked), list(shared)
    out = []
    for x, u in zip(self._leaves, self._used):
      if u is None:
        out.append(shared.pop(0))
      else:
        rows = merge(stacked.pop(0))
        out.append(rows if u == x.shape[0] else
                   jnp.concatenate([rows, x[u:]], axis=0))
    return jax.tree_util.tree_unflatten(self._treedef, out)


def n_rows(tree: PyTree) -> int:
  """Leading-axis size of the first leaf of `tree` (the rows)."""
  return jax.tree_util.tree_leaves(tree)[0].shape[0]


def add(acc: PyTree, tree: PyTree) -> PyTree:
  """`acc + tree`, leaf by leaf."""
  return jax.tree_util.tree_map(jnp.add, acc, tree)


def zeros(tree: PyTree) -> PyTree:
  """Zeros shaped as `tree`, leaf by leaf."""
  return jax.tree_util.tree_map(jnp.zeros_like, tree)


def forward(fn: Callable[..., tuple[PyTree, PyTree]], k: int,
            rows: PyTree) -> Callable[..., tuple[PyTree, PyTree]]:
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
    shared, (_, per_row), outputs = scan_rows(body, st.shared,
                                              (xs.scanned, st.scanned), k)
    return outputs(), st.join(per_row, shared)
  return sliced


def fbo(layer: tl.Layer, optimizer: optimizer_base.Optimizer, n_devices: int,
        adasum: bool, k: int, rows: PyTree,
        mode: step_fns.Update = step_fns.Update.NOW) -> Callable[..., tuple]:
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
          lambda x_, w_: layer.pure_fn(x_, w_, s, rng), xs.slice(x), weights,
          has_aux=True)
      grads_inputs, grads_weights = vjp_fn(cts.slice(ct))
      per_row, new_shared = st.parts(new_state)
      return (add(acc, grads_weights), new_shared), (grads_inputs, per_row)
    (grads_weights, shared), (_, per_row), grads_inputs = scan_rows(
        body, (zeros(weights), st.shared),
        (xs.scanned, cts.scanned, st.scanned), k)
    new_state = st.join(per_row, shared)
    new_weights, new_slots, stats = update(grads_weights, weights, slots,
                                           opt_params, step)
    return new_weights, new_state, new_slots, grads_inputs(), stats
  return sliced


def segment_reverse(layers: Sequence[tl.Layer],
                    optimizers: Sequence[optimizer_base.Optimizer],
                    n_devices: int, adasum: bool, k: int, rows: PyTree,
                    in_call: ties_lib.InCall = (),
                    mode: step_fns.Update = step_fns.Update.NOW
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
    return step_fns.segment_reverse_fn(layers, optimizers, n_devices, adasum,
                                       in_call, mode)
  updates = [step_fns.update_fn(opt, n_devices, adasum, mode)
             for opt in optimizers]

  if any(layer.n_in != layer.n_out for layer in layers):
    def sliced_by_scan(outputs, weights, grads, states, new_states, slots,
                       opt_params, rngs, step):
      n = n_rows(outputs)
      old, new = States(states, rows, n, k), States(new_states, rows, n, k)
      ys, cts = Rows(outputs, k), Rows(grads, k)

      def body(acc, scanned):
        y, ct, old_rows, new_rows = scanned
        stack, grad_stack, grads_weights = chains.reverse_and_grad_chain(
            layers, ys.slice(y), cts.slice(ct), weights, old.slice(old_rows),
            new.slice(new_rows), rngs)
        return add(acc, grads_weights), ((stack, grad_stack),)
      # The carry holds only gradient sums, whose type the slices keep.
      grads_weights, _, done = scan_rows(
          body, zeros(weights),
          (ys.scanned, cts.scanned, old.scanned, new.scanned), k,
          loop=lax.scan)
      inputs, grads_inputs = done()
      new_weights, new_slots, stats = step_fns.update_each(
          updates, grads_weights, weights, slots, opt_params, step, in_call)
      return new_weights, new_slots, inputs, grads_inputs, stats
    return sliced_by_scan

  def sliced(outputs, weights, grads, states, new_states, slots, opt_params,
             rngs, step):
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
      at = lambda arrays: [lax.dynamic_index_in_dim(a, s, keepdims=False)
                           for a in arrays]
      with row_draws.slice_of(s, k):
        stack, grad_stack, grads_weights = chains.reverse_and_grad_chain(
            layers, stack, grad_stack, weights, old.slice(at(old.scanned)),
            new.slice(at(new.scanned)), rngs)
      done = jax.tree_util.tree_leaves((stack, grad_stack))
      bufs = [lax.dynamic_update_slice_in_dim(buf, done[i].astype(buf.dtype),
                                              s * b, 0)
              for i, buf in zip(moving, bufs)]
      return bufs, add(acc, grads_weights)
    bufs, grads_weights = lax.fori_loop(
        0, k, body, ([leaves[i] for i in moving], zeros(weights)))
    done = list(leaves)
    for i, x in zip(moving, bufs):
      done[i] = x
    inputs, grads_inputs = jax.tree_util.tree_unflatten(treedef, done)
    new_weights, new_slots, stats = step_fns.update_each(
        updates, grads_weights, weights, slots, opt_params, step, in_call)
    return new_weights, new_slots, inputs, grads_inputs, stats
  return sliced
