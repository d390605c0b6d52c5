"""Private attributes of trax's trainers.

trax's default `trax.optimizers.Trainer` and stock
`trax.optimizers.ReversibleSerialTrainer` keep their device count, slots,
optimizer hyperparameters and compiled functions in private attributes;
the device memory accounting of their steps (`trax_revplus.device_memory`)
and the step inputs report (`trax_revplus.progress`) read them here.
"""

import dataclasses
from typing import Any

from trax_revplus.trax_door.registry import ATTRIBUTE
from trax_revplus.trax_door.registry import uses

TRAINER = 'trax.optimizers.trainer.Trainer'
STOCK = 'trax.optimizers.trainer.ReversibleSerialTrainer'


def _is_int(v):
  return isinstance(v, int)


def _is_list(v):
  return isinstance(v, list)


@uses(
  TRAINER,
  '_n_devices',
  ATTRIBUTE,
  'the number of devices its step runs on, an int',
  check=_is_int,
)
@uses(
  STOCK,
  '_n_devices',
  ATTRIBUTE,
  'the number of devices its step runs on, an int',
  check=_is_int,
)
def n_devices(trainer: Any) -> int:
  """The devices trax's `Trainer` or stock `ReversibleSerialTrainer` runs
  its step on (their `_n_devices`)."""
  return trainer._n_devices  # pylint: disable=protected-access


@uses(
  TRAINER,
  '_slots',
  ATTRIBUTE,
  "the optimizer slots its compiled update takes, as the weights' tree",
)
def default_trainer_slots(trainer: Any) -> Any:
  """trax's `Trainer`'s optimizer slots (`Trainer._slots`); None for
  another object."""
  return getattr(trainer, '_slots', None)


@uses(
  TRAINER,
  '_opt_params',
  ATTRIBUTE,
  'the optimizer hyperparameters its compiled update takes, a dict',
  check=lambda v: isinstance(v, dict),
)
def default_trainer_opt_params(trainer: Any) -> dict:
  """trax's `Trainer`'s optimizer hyperparameters (`Trainer._opt_params`)."""
  return trainer._opt_params  # pylint: disable=protected-access


@uses(
  TRAINER,
  '_accelerated_update_fn',
  ATTRIBUTE,
  'the compiled update `one_step` calls with ((weights, slots), step, '
  'opt_params, batch, state, rng)',
  check=callable,
)
def default_trainer_update_fn(trainer: Any) -> Any:
  """trax's `Trainer`'s compiled update function
  (`Trainer._accelerated_update_fn`)."""
  return trainer._accelerated_update_fn  # pylint: disable=protected-access


@dataclasses.dataclass(frozen=True)
class StockTrainerParts:
  """What stock `ReversibleSerialTrainer.one_step` works with, per block
  (b) and layer, as its constructor sets them.

  Attributes:
    blocks: list of (standard layer, list of reversible layers).
    n_layers: int, all layers, the loss layer included.
    accelerated_layer_fns: per block (standard forward, [reversible
      forwards]), compiled.
    fbos: per block (standard forward-backward-optimizer, [reversible
      ones]), compiled.
    optimizers: per block (standard layer's optimizer, [reversible
      layers' optimizers]).
    replicated_opt_params: per block (standard layer's hyperparameters,
      [reversible layers' ones]).
    loss_layer: the loss layer.
    loss_opt: its optimizer.
    loss_fbo: its compiled forward-backward-optimizer.
    replicated_loss_opt_params: its optimizer's hyperparameters.
  """

  blocks: Any
  n_layers: int
  accelerated_layer_fns: Any
  fbos: Any
  optimizers: Any
  replicated_opt_params: Any
  loss_layer: Any
  loss_opt: Any
  loss_fbo: Any
  replicated_loss_opt_params: Any


@uses(
  STOCK,
  '_blocks',
  ATTRIBUTE,
  'list of (standard layer, list of reversible layers)',
  check=_is_list,
)
@uses(STOCK, '_n_layers', ATTRIBUTE, 'all its layers, an int', check=_is_int)
@uses(
  STOCK,
  '_accelerated_layer_fns',
  ATTRIBUTE,
  'per block (standard forward, [reversible forwards])',
  check=_is_list,
)
@uses(
  STOCK,
  '_fbos',
  ATTRIBUTE,
  'per block (standard forward-backward-optimizer, [reversible ones])',
  check=_is_list,
)
@uses(
  STOCK,
  '_optimizers',
  ATTRIBUTE,
  'per block (standard optimizer, [reversible optimizers])',
  check=_is_list,
)
@uses(
  STOCK,
  '_replicated_opt_params',
  ATTRIBUTE,
  'per block (standard hyperparameters, [reversible ones])',
  check=_is_list,
)
@uses(
  STOCK,
  '_loss_layer',
  ATTRIBUTE,
  'the loss layer, a `tl.Layer`',
  check=lambda v: hasattr(v, 'n_in'),
)
@uses(
  STOCK,
  '_loss_opt',
  ATTRIBUTE,
  "the loss layer's optimizer",
  check=lambda v: hasattr(v, 'slots'),
)
@uses(
  STOCK,
  '_loss_fbo',
  ATTRIBUTE,
  "the loss layer's compiled forward-backward-optimizer",
  check=callable,
)
@uses(
  STOCK,
  '_replicated_loss_opt_params',
  ATTRIBUTE,
  "the loss optimizer's hyperparameters, a dict",
  check=lambda v: isinstance(v, dict),
)
def stock_trainer_parts(trainer: Any) -> StockTrainerParts:
  """The parts of stock `ReversibleSerialTrainer` its step works with."""
  # pylint: disable=protected-access
  return StockTrainerParts(
    blocks=trainer._blocks,
    n_layers=trainer._n_layers,
    accelerated_layer_fns=trainer._accelerated_layer_fns,
    fbos=trainer._fbos,
    optimizers=trainer._optimizers,
    replicated_opt_params=trainer._replicated_opt_params,
    loss_layer=trainer._loss_layer,
    loss_opt=trainer._loss_opt,
    loss_fbo=trainer._loss_fbo,
    replicated_loss_opt_params=trainer._replicated_loss_opt_params,
  )
