"""What `train` would build from a parsed gin config, checked before
anything is compiled: its inputs' batch (one batch read, for its shapes),
that the batch splits over the devices and into the trainer's batch
slices, and that its model builds. Each mistake is reported as
`train` reports it (`failures`). `estimate` and `compare` run these checks.
"""

import copy
from typing import TYPE_CHECKING, Any

import trax_revplus
from trax_revplus import trax_import
from trax_revplus import validation
from trax_revplus.cli import build_errors
from trax_revplus.cli import failures
from trax_revplus.cli import gin_config
from trax_revplus.errors import EXIT_RUNTIME
from trax_revplus.errors import one_line
from trax_revplus.errors import UserError

if TYPE_CHECKING:  # trax is imported when a config is built
  from trax import layers as tl


def _bound(name: str, default: Any) -> Any:
  """The value gin would pass for `name`, references made callables."""
  return copy.deepcopy(gin_config.bound_value(name, default))


def _batch_types(inputs_fn):
  """The batch's `jax.ShapeDtypeStruct`s from the config's inputs."""
  jax = trax_import.jax
  inputs = inputs_fn() if callable(inputs_fn) else inputs_fn
  shapes, dtypes = inputs.example_shape_dtype
  return tuple(
    jax.ShapeDtypeStruct(tuple(s), d) for s, d in zip(shapes, dtypes)
  )


class Config:
  """What `train` would build from the parsed config."""

  def __init__(self, bindings: list[str]):
    tl = trax_import.module('trax.layers')
    optimizers = trax_import.module('trax.optimizers')
    trax_inputs = trax_import.module('trax.data.inputs')
    self.model_fn = _bound('train.model', None)
    if self.model_fn is None:
      raise UserError(
        'no model configured: bind train.model, e.g. '
        "--config='train.model = @trax.models.ReformerLM'"
      )
    self._tl = tl
    self.loss()  # fails here on a bad loss binding
    self.optimizer = _bound('train.optimizer', optimizers.Adafactor)
    inputs = _bound('train.inputs', trax_inputs.batcher)
    try:
      self.batch = _batch_types(inputs)
    except Exception as e:  # pylint: disable=broad-except
      # As `train` reports it (e.g. corpus files that match nothing).
      raise as_train_reports(e, bindings) or UserError(
        f"cannot read the config's inputs: {one_line(e)}", EXIT_RUNTIME
      ) from None

  def model(self) -> 'tl.Layer':
    """A new model (train mode)."""
    return self.model_fn(mode='train')

  def loss(self) -> 'tl.Layer':
    """A new loss layer."""
    return (
      _bound('train.loss_fn', None) or self._tl.WeightedCategoryCrossEntropy()
    )


def as_train_reports(error: Exception, bindings: list[str]) -> UserError | None:
  """`error` as `train` reports it when building its Loop, or None."""
  return failures.user_error(error, '', False, bindings)


def check_model(cfg: Config, bindings: list[str]) -> None:
  """Builds and initializes the config's model as `train` would.

  Before any trainer: a model the config cannot build is the config's
  mistake, reported as `train` reports it (the same line: the model is
  initialized the way `train`'s run initializes it, block by block for
  the memory-efficient trainer), not a trainer's row.

  Raises:
    UserError: as `train` (exit status 2 for a model its bindings cannot
      build), or exit status 1 for an error nobody could foresee.
  """
  fastmath = trax_import.module('trax.fastmath')
  stock_lib = trax_import.module('trax.optimizers.trainer')
  # Here: they import trax, which `compare`'s parent process never does.
  # pylint: disable=g-import-not-at-top
  from trax_revplus import three_trainers
  from trax_revplus import trainer as rev_lib

  # pylint: enable=g-import-not-at-top
  mode = gin_config.bound_value('train.use_memory_efficient_trainer', False)
  try:
    if mode and not gin_config.is_reference(mode):
      three_trainers.reversible_blocks(
        rev_lib if trax_revplus.is_active() else stock_lib, cfg
      )
    else:
      cfg.model().init(
        three_trainers.init_signature(cfg.batch),
        rng=fastmath.random.get_prng(0),
      )
  except Exception as e:  # pylint: disable=broad-except
    error = build_errors.as_model_error(e)
    raise as_train_reports(error, bindings) or UserError(
      f"cannot build the config's model: {one_line(e)}; fix the model "
      f'bindings (train.model, ...)',
      EXIT_RUNTIME,
    ) from None


def check_step_settings(
  cfg: Config,
  n_devices: int,
  device_memory_bytes: int | None,
  bindings: list[str],
) -> None:
  """Checks what a step on the config's batch needs, as the trainers will.

  The batch splits over `n_devices` (that many devices exist), the
  trainer's budget can be resolved, and the batch slices set to an int
  divide each device's rows (`dimensions.check_slicing`).

  Raises:
    UserError (exit status 2): as `train` reports each.
  """
  # Here: they import trax, which `compare`'s parent process never does.
  # pylint: disable=g-import-not-at-top
  from trax_revplus import placement as placement_lib
  from trax_revplus.trainer._search import budget as budget_lib
  from trax_revplus.trainer._plan import dimensions
  from trax_revplus.trainer import gin_bindings

  # pylint: enable=g-import-not-at-top
  options = gin_bindings.validate_gin_bindings()
  try:
    validation.check_n_devices(n_devices)
    validation.check_batch(cfg.batch, n_devices)
    setting = (
      options.device_memory_budget_bytes
      if device_memory_bytes is None
      else device_memory_bytes
    )
    budget_lib.budget_bytes(setting, placement_lib.Placement(n_devices))
    dimensions.check_slicing(options, cfg.batch[0].shape[0] // n_devices)
  except validation.ConfigurationError as e:
    raise as_train_reports(e, bindings) or e from None


def check_inputs_and_batch(
  bindings: list[str], n_devices: int, device_memory_bytes: int | None = None
) -> Config:
  """Reads one batch of the parsed config's inputs and checks it
  (`check_step_settings`) as `train`'s run will; returns the config to build
  from.

  Raises:
    UserError: as `train` reports the config's mistakes (exit status 2), or
      1 when the inputs cannot be read.
  """
  cfg = Config(bindings)
  check_step_settings(cfg, n_devices, device_memory_bytes, bindings)
  return cfg
