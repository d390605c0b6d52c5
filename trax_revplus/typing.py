"""Type aliases of trax_revplus's public signatures (as optax's `base.py`).

They document what a value is; none is checked at run time.
"""

from typing import Any, Sequence, Tuple, Union

import jax
import numpy as np

# A nested structure of tuples, lists and dicts whose leaves are arrays (or
# scalars), as `jax.tree_util` walks it: weights, state, slots, a batch.
PyTree = Any
# An array on a device (or in host memory as the CPU device's).
Array = jax.Array
# An array in host memory, owned by numpy.
HostArray = np.ndarray
# A JAX PRNG key, uint32[2].
PRNGKey = jax.Array
# A batch as trax's data pipelines give it: host arrays of shape (B, ...),
# e.g. (inputs, targets, weights).
Batch = Union[HostArray, Tuple[HostArray, ...]]
# trax's data stack between layers: one array, or a tuple of them
# (`trax.layers.combinators.inputs_from_stack`).
Stack = Union[Array, Tuple[Array, ...]]
# Trainer blocks as trax's `extract_reversible_blocks` gives them: pairs of
# (standard layers, reversible layers), each a list of `trax.layers.Layer`.
Blocks = Sequence[Tuple[Sequence[Any], Sequence[Any]]]
