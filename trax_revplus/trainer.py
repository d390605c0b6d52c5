"""ReversibleSerialTrainer: drop-in for trax.optimizers (placeholder)."""

from trax.optimizers import trainer as _stock


class ReversibleSerialTrainer(_stock.ReversibleSerialTrainer):
  pass


def init_reversible_blocks(blocks, loss_layer, input_signature, rng):
  return _stock.init_reversible_blocks(blocks, loss_layer, input_signature, rng)
