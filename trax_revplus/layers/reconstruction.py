"""`reconstruction_error`: how exactly reversible layers rebuild their inputs.

Walks a layer or a whole model and reports, per reversible layer, how far
the inputs reconstructed from the outputs are from the true inputs, both
reversing the whole block down to the layer (as the reversible trainer
does) and reversing the layer alone.
"""

import dataclasses
from typing import Any, Tuple

import jax
import numpy as np
from trax import fastmath
from trax import shapes
from trax.layers import base
from trax.layers import combinators as cb
from trax.layers import reversible as trax_reversible

from trax_revplus.layers import arguments
from trax_revplus.trax_door import functions as trax_functions
from trax_revplus.typing import PRNGKey
from trax_revplus.typing import PyTree
from trax_revplus.typing import Stack

_split_rngs = trax_functions.split_rngs

ReversibleLayer = trax_reversible.ReversibleLayer


@dataclasses.dataclass(frozen=True)
class ReconstructionRecord:
  """Reconstruction error of one reversible layer.

  Errors compare reconstructed input stack items with the true ones, over all
  `n_in` items (int/bool items too, as floats), in float64:
  `max_abs_error = max |x_rec - x|`, `max_rel_error = max_abs_error /
  max |x|` (0 if both are 0; inf if only `max |x|` is 0).

  Attributes:
    index: position among the model's reversible layers, in forward order.
    path: sublayer indices from the walked layer down to this one, e.g.
      `(5, 3)` is `model.sublayers[5].sublayers[3]`; `()` is the layer itself.
    name: the layer's name.
    block: index of the run of consecutive reversible layers it belongs to
      (one run per reversible block as `extract_reversible_blocks` sees it).
    max_abs_error: error of the inputs reconstructed by reversing the whole
      block from its output down to this layer, as the reversible trainer
      does; grows with depth when reversal drifts.
    max_rel_error: `max_abs_error` relative to max |true inputs|.
    local_max_abs_error: error of reversing this layer alone from its true
      outputs.
    local_max_rel_error: `local_max_abs_error` relative to max |true inputs|.
  """

  index: int
  path: Tuple[int, ...]
  name: str
  block: int
  max_abs_error: float
  max_rel_error: float
  local_max_abs_error: float
  local_max_rel_error: float

  def as_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


def _flat_leaves(layer, weights, state, rng, path):
  """Yields (path, layer, weights, state, rng) for the layers a run visits.

  `tl.Serial` (and so `ReversibleSerial`) layers are opened up, with the rngs
  `Serial.forward` would give their sublayers, so running the leaves in order
  on one stack is `layer.pure_fn` (as `extract_reversible_blocks` flattens).
  """
  if isinstance(layer, cb.Serial) and layer.sublayers:
    n = len(layer.sublayers)
    if not isinstance(weights, (tuple, list)) or len(weights) != n:
      raise ValueError(
        f'{layer.name} at path {path}: weights must have one entry per '
        f'sublayer ({n}); pass the weights of this layer or model.'
      )
    if not isinstance(state, (tuple, list)) or len(state) != n:
      raise ValueError(
        f'{layer.name} at path {path}: state must have one entry per '
        f'sublayer ({n}); pass the state of this layer or model.'
      )
    rngs = _split_rngs(rng, n)
    for i, (sub, w, s, r) in enumerate(
      zip(layer.sublayers, weights, state, rngs)
    ):
      yield from _flat_leaves(sub, w, s, r, path + (i,))
  else:
    yield path, layer, weights, state, rng


def _zero_cotangent(x):
  x = jax.numpy.asarray(x)
  if jax.numpy.issubdtype(x.dtype, jax.numpy.inexact):
    return jax.numpy.zeros_like(x)
  return np.zeros(x.shape, dtype=jax.dtypes.float0)


def _reverse(layer, outputs, weights, state, new_state, rng):
  """`layer.reverse`, or `reverse_and_grad` for layers that only have that."""
  try:
    return layer.reverse(outputs, weights, state, new_state, rng)
  except NotImplementedError:
    ct = fastmath.nested_map(_zero_cotangent, outputs)
    return layer.reverse_and_grad(outputs, ct, weights, state, new_state, rng)[
      0
    ]


def _errors(reconstructed, true):
  """(max abs error, max rel error) over stack items, in float64."""
  rec = [
    np.asarray(x).astype(np.float64) for x in arguments.as_tuple(reconstructed)
  ]
  ref = [np.asarray(x).astype(np.float64) for x in arguments.as_tuple(true)]
  if len(rec) != len(ref):
    raise ValueError(
      f'reverse returned {len(rec)} stack items, expected {len(ref)}.'
    )
  max_abs = max(
    [float(np.max(np.abs(a - b))) if a.size else 0.0 for a, b in zip(rec, ref)]
    + [0.0]
  )
  scale = max(
    [float(np.max(np.abs(b))) if b.size else 0.0 for b in ref] + [0.0]
  )
  if max_abs == 0.0:
    max_rel = 0.0
  else:
    max_rel = max_abs / scale if scale > 0 else float('inf')
  return max_abs, max_rel


def reconstruction_error(
  layer_or_model: base.Layer,
  inputs: Stack,
  weights: PyTree | None = None,
  state: PyTree | None = None,
  rng: PRNGKey | None = None,
) -> tuple[list[ReconstructionRecord], str]:
  """Measures how exactly reversible layers reconstruct their inputs.

  Runs `layer_or_model` forward on `inputs` layer by layer (opening up
  `tl.Serial` and `ReversibleSerial` combinators, with the same rng splits as
  `pure_fn`), then, for each run of consecutive reversible layers (a
  reversible block), reverses from the block's output down to its input and
  compares each layer's reconstructed inputs with the true ones. Works with
  trax's and trax_revplus's reversible layers (for layers without `reverse`,
  such as stock `ReversibleHalfResidual`, `reverse_and_grad` with zero
  cotangents is used). Non-reversible layers just run forward.

  Args:
    layer_or_model: a reversible layer, a `ReversibleSerial`, or a model (e.g.
      `trax.models.ReformerLM(...)`, with or without a loss layer).
    inputs: the model's inputs: an array or a tuple of `n_in` arrays, e.g.
      int32 tokens `[batch, length]` for a language model.
    weights: the model's weights; None uses `layer_or_model.weights`, and if
      it holds no arrays yet the model is first initialised with
      `layer_or_model.init(shapes.signature(inputs))`.
    state: the model's state; None uses `layer_or_model.state` (after the
      initialisation above, if any).
    rng: JAX PRNG key for the run (dropout etc.); None uses
      `layer_or_model.rng`.

  Returns:
    `(records, summary)`: `records` is a list of `ReconstructionRecord`, one
    per reversible layer in forward order (`record.as_dict()` gives a dict);
    `summary` is a one-line string naming the number of reversible layers and
    blocks and the worst layer by `max_rel_error`.

  Raises:
    ValueError: if the model holds no reversible layer, if `weights` or
      `state` do not match the model's structure, or if `weights` is given
      but `state` is None for an uninitialised model.
  """
  if weights is None:
    if not fastmath.tree_leaves(layer_or_model.weights):
      if state is not None:
        raise ValueError(
          'reconstruction_error: state given but weights None '
          'for an uninitialised model; pass both or neither.'
        )
      layer_or_model.init(shapes.signature(inputs))
    weights = layer_or_model.weights
  if state is None:
    state = layer_or_model.state
  if rng is None:
    rng = layer_or_model.rng

  leaves = list(_flat_leaves(layer_or_model, weights, state, rng, ()))
  if not any(isinstance(l, ReversibleLayer) for _, l, _, _, _ in leaves):
    raise ValueError(
      f'reconstruction_error: {layer_or_model.name} holds no reversible '
      'layer (trax.layers.ReversibleLayer); nothing to reconstruct.'
    )

  records: list[Any] = []
  # (path, layer, weights, state, new_state, rng, inputs, outputs,
  #  stack after the layer) for each layer of the current reversible run.
  block: list[tuple[Any, ...]] = []
  n_blocks = 0

  def close_block():
    nonlocal n_blocks
    if not block:
      return
    first_index = len(records)
    # Reversal starts from the whole stack after the block's last layer.
    stack = block[-1][8]
    out_records = []
    for path, layer, w, s, ns, r, x, y, _ in reversed(block):
      x_rec = _reverse(
        layer, cb.inputs_from_stack(stack, layer.n_out), w, s, ns, r
      )
      stack = cb.outputs_onto_stack(x_rec, stack, layer.n_out)
      abs_err, rel_err = _errors(cb.inputs_from_stack(stack, layer.n_in), x)
      local_abs, local_rel = _errors(_reverse(layer, y, w, s, ns, r), x)
      out_records.append(
        ReconstructionRecord(
          index=0,
          path=path,
          name=layer.name,
          block=n_blocks,
          max_abs_error=abs_err,
          max_rel_error=rel_err,
          local_max_abs_error=local_abs,
          local_max_rel_error=local_rel,
        )
      )
    for i, rec in enumerate(reversed(out_records)):
      records.append(dataclasses.replace(rec, index=first_index + i))
    block.clear()
    n_blocks += 1

  stack = inputs
  for path, layer, w, s, r in leaves:
    x = cb.inputs_from_stack(stack, layer.n_in)
    y, ns = layer.pure_fn(x, w, s, r, use_cache=True)
    if isinstance(layer, ReversibleLayer):
      block.append(
        (
          path,
          layer,
          w,
          s,
          ns,
          r,
          x,
          y,
          cb.outputs_onto_stack(y, stack, layer.n_in),
        )
      )
    else:
      close_block()
    stack = cb.outputs_onto_stack(y, stack, layer.n_in)
  close_block()

  worst = max(records, key=lambda rec: rec.max_rel_error)
  summary = (
    f'reconstruction_error: {len(records)} reversible layers in {n_blocks} '
    f'block(s); worst max_rel_error {worst.max_rel_error:.3g} '
    f'(max_abs_error {worst.max_abs_error:.3g}) at layer {worst.index} '
    f'{worst.name} (path {".".join(map(str, worst.path)) or "-"})'
  )
  return records, summary
