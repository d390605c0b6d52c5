"""The stack's types through the blocks: the bytes each block's reversible
layers read, and the loss layer's inputs.

`backward_segment_max_layers='auto'` and the fused program's lower bound
(`candidates`) read the bytes: a block whose reversible layers pass on less
than `plan.ACTIVATION_BOUND_BYTES` is compiler-bound, not activation-bound.
Sequence chunks (`sequence_chunks.tail_length`) read the loss's inputs.
"""

from absl import logging
import jax
import numpy as np
from trax.layers import combinators as cb

from trax_revplus import layers as layers_lib
from trax_revplus import memory
from trax_revplus.trainer import chains
from trax_revplus.trainer import plan as plan_lib
from trax_revplus.typing import PyTree


def trace(store, stack_types: PyTree,
          n_devices: int) -> tuple[list[int], PyTree | None]:
  """The stack's types through every block, from the batch's.

  The stack's types come from `jax.eval_shape` of every layer's forward on
  one device's rows, in order; where they cannot be known so, every block
  counts as activation-bound (`plan.ACTIVATION_BOUND_BYTES`). Tracing
  leaves the layers as they were (`layers.preserved`), also where a
  layer's trace fails.

  Args:
    store: the trainer's `store.LayerStore` (its blocks and layers).
    stack_types: the batch's types as placed: leaves of shape (B, ...) on
      one device, (N, B / N, ...) on N devices.
    n_devices: int N, devices the batch is sharded over.

  Returns:
    (list over blocks of int bytes: the stack items each block's
    reversible layers read, all devices; the loss layer's input stack
    items as `jax.ShapeDtypeStruct`s on one device, or None where the
    types could not be traced).
  """
  per_device = lambda x: jax.ShapeDtypeStruct(
      x.shape[1:] if n_devices > 1 else x.shape, x.dtype)
  stack = jax.tree_util.tree_map(per_device, stack_types)
  rng = jax.ShapeDtypeStruct((2,), np.uint32)

  def forward(layer, stack):
    outputs, _ = jax.eval_shape(
        layer.pure_fn, cb.inputs_from_stack(stack, layer.n_in),
        layer.weights, layer.state, rng)
    return cb.outputs_onto_stack(outputs, stack, layer.n_in)

  out = []
  try:
    with layers_lib.preserved(*store.layers):
      for std, revs in store.blocks:
        stack = forward(std, stack)
        depth = chains.chain_depth(revs)
        out.append(n_devices * memory.array_bytes(
            cb.inputs_from_stack(stack, depth) if depth else ()))
        for rev in revs:
          stack = forward(rev, stack)
  except Exception as e:  # pylint: disable=broad-except
    logging.info('the stack\'s types could not be traced (%s); every block '
                 'counts as activation-bound.', e)
    return [plan_lib.ACTIVATION_BOUND_BYTES] * len(store.blocks), None
  loss = store.layers[-1]
  return out, cb.inputs_from_stack(stack, loss.n_in)
