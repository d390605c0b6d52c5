"""The names of the classes a run trained with: trainer, reversible layers.

Every place that says which implementation ran names it through here: the
summary `trax-revplus train` prints, `run_stats.json` (and from it
`compare`'s table and `compare.json`), and the 'start' record of the
trainer's memory log. Names are 'module.QualifiedName', e.g.
'trax.optimizers.trainer.ReversibleSerialTrainer' (stock trax's
memory-efficient trainer), 'trax.optimizers.trainer.Trainer' (trax's
default `Trainer`), 'trax_revplus.trainer.ReversibleSerialTrainer'.

The reversible layers are the swappable classes (`ReversibleHalfResidual`,
`ReversibleSerial`), trax's and trax_revplus's, by class and count; the
reversible layers both implementations share (`ReversibleSwap`, ...) are not
counted. The check is by class, never by what a trax module binds at the
time: `swap.activate()` rebinds `trax.layers.reversible.ReversibleSerial`
and the rest to trax_revplus's classes, so a test of the module's binding
would see none of a stock model's layers while trax_revplus is active.
"""

from typing import Any, NamedTuple, Sequence

from trax.layers import reversible as _trax_reversible

from trax_revplus import compat
from trax_revplus import layers as _layers
from trax_revplus.trax_door import loop as loop_door

# trax's own classes, taken when this module is first imported. `swap`
# imports this module before it can rebind anything, so these are trax's
# whatever `activate()` and `deactivate()` did since.
STOCK_REVERSIBLE_CLASSES = (
  _trax_reversible.ReversibleHalfResidual,
  _trax_reversible.ReversibleSerial,
)
REVPLUS_REVERSIBLE_CLASSES = (
  _layers.ReversibleHalfResidual,
  _layers.ReversibleSerial,
)
REVERSIBLE_CLASSES = STOCK_REVERSIBLE_CLASSES + REVPLUS_REVERSIBLE_CLASSES
NO_REVERSIBLE_LAYERS = 'none'


class RunClasses(NamedTuple):
  """The classes a run trained with, by name.

  Attributes:
    trainer: str or None, the first trainer's class, e.g.
      'trax_revplus.trainer.ReversibleSerialTrainer'; None where there is
      no trainer yet.
    reversible_layers: str or None, `reversible_layers` of the model, e.g.
      'trax.layers.reversible.ReversibleHalfResidual x8,
      trax.layers.reversible.ReversibleSerial x1'; None where there is no
      model.
    trainer_fix: str or None, what of stock's trainer was changed for
      current JAX (`compat.stock_baseline_fix`), e.g. "its Loop's RNG on
      the step's device"; None: the trainer as its library ships it.
  """

  trainer: str | None
  reversible_layers: str | None
  trainer_fix: str | None = None


def qualified_name(cls: type) -> str:
  """The name of a class as the package prints it.

  Args:
    cls: a class, e.g. the type of a Loop's trainer.

  Returns:
    str, 'module.QualifiedName'.
  """
  return f'{cls.__module__}.{cls.__qualname__}'


def trainer_name(trainers: Sequence[Any]) -> str | None:
  """The name of the first trainer's class.

  Args:
    trainers: a Loop's trainers, one per task (e.g. `loop_door.trainers`).

  Returns:
    str, `qualified_name` of the first trainer's class; None without any.
  """
  trainers = list(trainers)
  return qualified_name(type(trainers[0])) if trainers else None


def reversible_layers(layers: Any) -> str:
  """The reversible layers among `layers` and their sublayers, by class.

  Args:
    layers: a trax layer (e.g. a Loop's model), or a list or tuple of them
      (e.g. a trainer's layers).

  Returns:
    str, e.g. 'trax_revplus.layers.ReversibleHalfResidual x8,
    trax_revplus.layers.ReversibleSerial x1': each class of
    `REVERSIBLE_CLASSES` (or a subclass) found, by `qualified_name`, with
    its count, sorted by name; 'none' where there is none.
  """
  counts: dict[str, int] = {}

  def walk(layer):
    if isinstance(layer, (list, tuple)):
      for item in layer:
        walk(item)
      return
    if isinstance(layer, REVERSIBLE_CLASSES):
      name = qualified_name(type(layer))
      counts[name] = counts.get(name, 0) + 1
    for sublayer in getattr(layer, 'sublayers', None) or ():
      walk(sublayer)

  walk(layers)
  return ', '.join(f'{name} x{n}' for name, n in sorted(counts.items())) or (
    NO_REVERSIBLE_LAYERS
  )


def of_trainers_and_model(trainers: Sequence[Any], model: Any) -> RunClasses:
  """The classes that train `model` with `trainers`, by name.

  Args:
    trainers: the Loop's trainers, one per task (may be empty).
    model: the Loop's training model, or None.

  Returns:
    `RunClasses`.
  """
  return RunClasses(
    trainer_name(trainers),
    None if model is None else reversible_layers(model),
    compat.stock_baseline_fix(trainers),
  )


def of_loop(loop: Any) -> RunClasses:
  """The classes a trax `training.Loop` trains with, by name.

  Args:
    loop: a `trax.supervised.training.Loop`, once its trainers are built.

  Returns:
    `RunClasses` of its trainers and its training model.
  """
  return of_trainers_and_model(
    loop_door.trainers(loop), getattr(loop, 'model', None)
  )
