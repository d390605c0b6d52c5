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

How rows and layer states split into slices is `slice_states`; this
module builds the sliced step functions from them.
"""

from typing import Callable, Sequence

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
from trax_revplus.trainer._step.slice_loop import FLOAT0
from trax_revplus.trainer._step.slice_loop import is_float0
from trax_revplus.trainer._step.slice_loop import scan_rows
from trax_revplus.trainer._step.slice_states import n_rows
from trax_revplus.trainer._step.slice_states import Rows
from trax_revplus.trainer._step.slice_states import States
from trax_revplus.typing import PyTree


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
  slices; `rows` is `slice_states.state_rows` of its state argument."""
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
