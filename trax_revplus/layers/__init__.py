# coding=utf-8
"""Reversible layers: drop-in replacements for `trax.layers.reversible`'s.

`ReversibleHalfResidual` and `ReversibleSerial` have the constructor
signatures, `n_in`/`n_out`, weights and state structure, sublayers and forward
computation (including per-sublayer rng splitting) of trax 1.4.1's classes of
the same names, so checkpoints and weights move between the two unchanged and
`trax.optimizers.trainer.extract_reversible_blocks` treats them alike. On top
of stock they

- implement `ReversibleHalfResidual.reverse` (stock raises
  `NotImplementedError`), so `reverse(forward(x))` works for every layer of a
  Reformer/Terraformer stack;
- check that `weights`, `state` and `new_state` passed to `reverse` and
  `reverse_and_grad` have one entry per sublayer (stock silently truncates a
  short tuple with `zip` and returns wrong results) and raise `ValueError`
  otherwise;
- rematerialise the residual in the backward pass too when weights are
  sharded (`trax.layers.base.N_WEIGHTS_SHARDS > 1`), not only in `forward`;
- take numpy arrays as well as jax arrays for weights, state and
  cotangents, also with efficient attention running `lax.fori_loop` (stock
  raises `TracerArrayConversionError` there).

`reconstruction_error` walks a layer or a whole model and reports, per
reversible layer, how far the inputs reconstructed from the outputs are from
the true inputs.

Modules, one job each:

  half_residual   `ReversibleHalfResidual`
  serial          `ReversibleSerial`
  reconstruction  `reconstruction_error`, `ReconstructionRecord`
  arguments       checking and preparing the arguments of `reverse`
  attention       `forward_and_or_backward` for attention layers without one
  cotangents      adding cotangents; float0/None ones of int/bool items
  preserved       tracing layers outside their call, leaving them as found

Stack layout (trax convention): a layer with `n_in` inputs takes the top
`n_in` items of the data stack, as a single array when `n_in == 1` and as a
tuple otherwise; item 0 is the top of the stack.
"""

from trax.layers import reversible as _trax_reversible

from trax_revplus.layers.half_residual import ReversibleHalfResidual
from trax_revplus.layers.preserved import preserved
from trax_revplus.layers.reconstruction import ReconstructionRecord
from trax_revplus.layers.reconstruction import reconstruction_error
from trax_revplus.layers.serial import ReversibleSerial

ReversibleLayer = _trax_reversible.ReversibleLayer

# The public home of each name, as `repr`, the memory log and the CLI name
# the classes (e.g. 'trax_revplus.layers.ReversibleHalfResidual').
for _public in (
  ReversibleHalfResidual,
  ReversibleSerial,
  ReconstructionRecord,
  reconstruction_error,
):
  _public.__module__ = __name__
del _public

__all__ = [
  'ReconstructionRecord',
  'ReversibleHalfResidual',
  'ReversibleLayer',
  'ReversibleSerial',
  'preserved',
  'reconstruction_error',
]
