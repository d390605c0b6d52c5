"""Reversible layers: drop-in for trax.layers.reversible (placeholder)."""

from trax.layers import reversible as _stock


class ReversibleHalfResidual(_stock.ReversibleHalfResidual):
  pass


class ReversibleSerial(_stock.ReversibleSerial):
  pass


def reconstruction_error(layer_or_model, inputs, weights=None, state=None,
                         rng=None):
  raise NotImplementedError
