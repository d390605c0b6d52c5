"""trax_revplus.run_classes: the trainer and reversible layers of a run, named
the same whichever of trax and trax_revplus is bound at the time."""

from trax import layers as tl

import trax_revplus
from trax_revplus import run_classes
from trax_revplus.compare import accounting

from conftest import reversible_lm


def _count(layer, classes):
  """How many of `layer` and its sublayers are of one of `classes`."""
  own = isinstance(layer, classes)
  return own + sum(_count(s, classes) for s in layer.sublayers)


def test_layers_are_named_by_the_class_they_were_built_with(stock_trax):
  del stock_trax
  stock = tl.Serial(reversible_lm(), tl.ReversibleSerial(tl.ReversibleSwap()))
  trax_revplus.activate()
  ours = tl.Serial(reversible_lm(), tl.ReversibleSerial(tl.ReversibleSwap()))
  stock_names = run_classes.reversible_layers(stock)
  ours_names = run_classes.reversible_layers(ours)
  trax_revplus.deactivate()
  # Bound to trax's or to ours now, the names are those of the classes the
  # layers are.
  assert run_classes.reversible_layers(stock) == stock_names
  assert run_classes.reversible_layers(ours) == ours_names
  n_half = _count(stock, tl.ReversibleHalfResidual)
  assert n_half == 2
  assert stock_names == (
    f'trax.layers.reversible.ReversibleHalfResidual x{n_half}, '
    'trax.layers.reversible.ReversibleSerial x1'
  )
  assert ours_names == (
    f'trax_revplus.layers.ReversibleHalfResidual x{n_half}, '
    'trax_revplus.layers.ReversibleSerial x1'
  )
  # A list of layers (a trainer's) is walked as a model is.
  assert run_classes.reversible_layers(list(stock.sublayers)) == stock_names
  assert run_classes.reversible_layers(tl.Dense(3)) == 'none'


def test_trainers_are_named_as_compare_knows_them(stock_trax):
  """Each trainer's name is one compare's accounting maps to its side."""
  del stock_trax
  from trax.optimizers import trainer as trax_trainer  # pylint: disable=g-import-not-at-top

  from trax_revplus import trainer as our_trainer  # pylint: disable=g-import-not-at-top

  names = {
    'default': run_classes.qualified_name(trax_trainer.Trainer),
    'stock': run_classes.qualified_name(trax_trainer.ReversibleSerialTrainer),
    'revplus': run_classes.qualified_name(our_trainer.ReversibleSerialTrainer),
  }
  for side, name in names.items():
    assert accounting.TRAINER_CLASSES[name] == side
  assert run_classes.trainer_name([]) is None
  classes = run_classes.of_trainers_and_model([], None)
  assert classes == run_classes.RunClasses(None, None)
