"""The stack's types through the blocks: the bytes each block's reversible
layers read, the loss layer's inputs, whether batch slices change a random
draw, whether some layer hashes its activations, and each layer's
residuals.

`backward_segment_max_layers='auto'` and the fused program's lower bound
(`candidates`) read the bytes: a block whose reversible layers pass on less
than `segment_lengths.ACTIVATION_BOUND_BYTES` is compiler-bound, not
activation-bound.
Sequence chunks (their module's `tail_length`) read the loss's inputs; the
speed model's rank of batch slices reads whether they change a draw
(`rng_use` of each forward with the draws slices keep exact on a fixed key,
`row_draws.exact_draws_fixed`), and its ranks for speed alone read whether
a layer hashes its activations (`hashing`: then float32 summation order
can change results beyond rounding). The fused program's bound
(`bounds`) reads each layer's residuals: the bytes `jax.vjp` of its
forward keeps for its backward, which a program holding every layer's
forward and backward (trax's default `Trainer`'s, the fused program) keeps
for all its layers at once (docs/device-memory.md).

Layers that compute the same thing (equal `kind_of`) on the same input
types are traced once: tracing costs the same for every depth of a stack of
equal blocks.
"""

from typing import Any, Callable, Hashable, NamedTuple

from absl import logging
import jax
from trax.layers import combinators as cb

from trax_revplus import layers as layers_lib
from trax_revplus import memory
from trax_revplus.trainer._plan import segment_lengths
from trax_revplus.trainer._search import hashing
from trax_revplus.trainer._search import rng_use
from trax_revplus.trainer._step import chains
from trax_revplus.trainer._step import host_store
from trax_revplus.trainer._step import row_draws
from trax_revplus.typing import PyTree


class StackTrace(NamedTuple):
  """What tracing the step's forward tells the planner.

  Attributes:
    block_bytes: list over blocks of int bytes: the stack items each
      block's reversible layers read, all devices.
    loss_inputs: the loss layer's input stack items as
      `jax.ShapeDtypeStruct`s on one device, or None where the types could
      not be traced.
    slices_change_draws: bool, whether any layer's results (the loss
      layer's too) depend on a random draw that batch slices change
      (`row_draws`); True where they could not be traced.
    hashes_activations: bool, whether any layer's forward (the loss
      layer's too) makes a discrete choice on float values it computes
      (`hashing`: LSH attention's buckets); True where they could not be
      traced.
    residual_bytes: list by layer index (the loss layer last) of int
      bytes `jax.vjp` of the layer's forward keeps on one device's rows
      (`residual_bytes`), or None where the layers could not be traced.
  """

  block_bytes: list[int]
  loss_inputs: PyTree | None
  slices_change_draws: bool
  hashes_activations: bool
  residual_bytes: list[int] | None = None


def residual_bytes(layer: Any, inputs: PyTree) -> tuple[int, PyTree]:
  """(Bytes `jax.vjp` of `layer`'s forward keeps for its backward on
  `inputs`: the leaves of its vjp function, the inputs it reads included;
  the forward's outputs' types). Traced only (`jax.eval_shape`); the
  caller keeps the layer as it was found (`layers.preserved`)."""

  def keeps(x, weights, state, rng):
    outputs, vjp_fn, _ = jax.vjp(
      lambda x_, w_: layer.pure_fn(x_, w_, state, rng),
      x,
      weights,
      has_aux=True,
    )
    return vjp_fn, outputs

  kept, outputs = jax.eval_shape(
    keeps, inputs, layer.weights, layer.state, rng_use.RNG_TYPE
  )
  return memory.array_bytes(kept), outputs


class _Traced(NamedTuple):
  """One layer kind's trace on one input types."""

  outputs: PyTree
  changes_draws: bool
  hashes: bool
  residual_bytes: int | None


def trace(
  store: host_store.LayerStore,
  stack_types: PyTree,
  n_devices: int,
  kind_of: Callable[[int], Hashable] | None = None,
) -> StackTrace:
  """The stack's types through every block, from the batch's.

  The stack's types come from `jax.make_jaxpr` of every layer's forward on
  one device's rows, in order; where they cannot be known so, every block
  counts as activation-bound (`segment_lengths.ACTIVATION_BOUND_BYTES`).
  Tracing leaves the layers as they were (`layers.preserved`), also where
  a layer's trace fails.

  Args:
    store: the trainer's `host_store.LayerStore` (its blocks and layers).
    stack_types: the batch's types as placed: leaves of shape (B, ...) on
      one device, (N, B / N, ...) on N devices.
    n_devices: int N, devices the batch is sharded over.
    kind_of: layer index -> hashable, equal for layers that compute the
      same thing (`compilation.Compiler.fingerprint_of`); None: each layer
      traced on its own.

  Returns:
    `StackTrace`.
  """
  per_device = lambda x: jax.ShapeDtypeStruct(
    x.shape[1:] if n_devices > 1 else x.shape, x.dtype
  )
  stack = jax.tree_util.tree_map(per_device, stack_types)
  changed = hashes = False
  index = {id(layer): i for i, layer in enumerate(store.layers)}
  traced: dict[Hashable, _Traced] = {}
  residuals: list[int] | None = []

  def traced_once(layer, inputs):
    i = index[id(layer)]
    key = (
      ('layer', i) if kind_of is None else kind_of(i),
      jax.tree_util.tree_structure(inputs),
      tuple(
        (tuple(x.shape), str(x.dtype))
        for x in jax.tree_util.tree_leaves(inputs)
      ),
    )
    if key not in traced:
      with row_draws.exact_draws_fixed([layer]):
        closed, outputs = rng_use.forward_jaxpr(layer, inputs)
      try:
        kept = residual_bytes(layer, inputs)[0]
      except Exception as e:  # pylint: disable=broad-except
        logging.info('the residuals of %s were not traced (%s).', layer, e)
        kept = None
      traced[key] = _Traced(
        outputs,
        rng_use.depends_on_last_input(closed),
        hashing.hashes_activations(closed),
        kept,
      )
    return traced[key]

  def forward(layer, stack):
    nonlocal changed, hashes, residuals
    found = traced_once(layer, cb.inputs_from_stack(stack, layer.n_in))
    changed = changed or found.changes_draws
    hashes = hashes or found.hashes
    if residuals is not None:
      if found.residual_bytes is None:
        residuals = None
      else:
        residuals.append(found.residual_bytes)
    return cb.outputs_onto_stack(found.outputs, stack, layer.n_in)

  out = []
  loss = store.layers[-1]
  try:
    with layers_lib.preserved(*store.layers):
      for std, revs in store.blocks:
        stack = forward(std, stack)
        depth = chains.chain_depth(revs)
        out.append(
          n_devices
          * memory.array_bytes(
            cb.inputs_from_stack(stack, depth) if depth else ()
          )
        )
        for rev in revs:
          stack = forward(rev, stack)
  except Exception as e:  # pylint: disable=broad-except
    logging.info(
      "the stack's types could not be traced (%s); every block "
      'counts as activation-bound.',
      e,
    )
    return StackTrace(
      [segment_lengths.ACTIVATION_BOUND_BYTES] * len(store.blocks),
      None,
      True,
      True,
    )
  try:
    with layers_lib.preserved(loss):
      forward(loss, stack)
  except Exception as e:  # pylint: disable=broad-except
    logging.info(
      'the loss layer could not be traced (%s); it counts as '
      'drawing what slices change and hashing its activations.',
      e,
    )
    changed = hashes = True
    residuals = None
  return StackTrace(
    out, cb.inputs_from_stack(stack, loss.n_in), changed, hashes, residuals
  )
