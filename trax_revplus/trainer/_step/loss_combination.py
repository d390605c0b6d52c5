"""How parts of a loss combine: slices of the rows, chunks of the sequence.

trax's weighted means (`WeightedCategoryCrossEntropy`,
`WeightedCategoryAccuracy`, `CrossEntropyLoss`,
`CrossEntropyLossWithLogSoftmax`, `L2Loss`, `SmoothL1Loss`) are combined by
their weight sums, sum_s mean_s * den(w_s) / den(w), with the layer's own
denominator, and weighted sums (`WeightedSum`, `CrossEntropySum`) by adding,
where the loss's weights are the deepest stack item it reads, untouched by
the layers before it. For any other loss `loss_combination` is None: it
runs whole.
"""

from typing import Callable, Sequence

from jax import numpy as jnp
from trax import layers as tl

from trax_revplus.trainer._step import chains
from trax_revplus.trax_door import functions as trax_functions
from trax_revplus.typing import Array

# (slice weights, all weights) -> the factor of the loss on the slice.
Combination = Callable[[Array, Array], Array]


def _per_core_weights(w):
  return trax_functions.n_weights_per_core(w)


# Final loss layers (by trax's layer name) that are weighted means, with the
# denominator they divide by.
_WEIGHTED_MEANS = {
  'WeightedCategoryCrossEntropy': _per_core_weights,
  'WeightedCategoryAccuracy': _per_core_weights,
  '_WeightedMean': _per_core_weights,
  'L2Loss': jnp.sum,
  'SmoothL1Loss': jnp.sum,
}
_WEIGHTED_SUMS = frozenset({'WeightedSum'})
# trax loss parts that mix rows (a dot product over the batch).
_MIXING_ROWS = frozenset({'_BinaryCrossEntropy'})


def _leaves(layer):
  """`layer` flattened through `tl.Serial`s (reversible layers stay whole)."""
  if type(layer).__name__ == 'Serial' and layer.sublayers:
    return [leaf for sub in layer.sublayers for leaf in _leaves(sub)]
  return [layer]


def loss_combination(layers: Sequence[tl.Layer]) -> Combination | None:
  """How slices of a loss program combine, or None if they cannot.

  Args:
    layers: the layers of the loss program, in forward order (the loss
      layer last).

  Returns:
    None where the loss is not a known weighted mean or sum of its
    weights' rows, or its weights are not the deepest stack item the
    program reads, untouched by the layers before the final one; else a
    function `(slice weights, all weights) -> factor` such that the loss
    is the sum over slices of factor times the loss on the slice.
  """
  flat = [leaf for layer in layers for leaf in _leaves(layer)]
  if any(leaf.name in _MIXING_ROWS for leaf in flat):
    return None
  final = flat[-1]
  if final.name in _WEIGHTED_SUMS:
    den = None
  elif final.name in _WEIGHTED_MEANS:
    den = _WEIGHTED_MEANS[final.name]
  else:
    return None
  depth = chains.chain_depth(flat)
  for layer in flat[:-1]:
    if layer.n_in > depth - 1:
      return None
    depth += layer.n_out - layer.n_in
  if final.n_in != depth:
    return None
  if den is None:
    return lambda w_slice, w_all: jnp.ones((), jnp.float32)
  return lambda w_slice, w_all: den(w_slice) / den(w_all)
