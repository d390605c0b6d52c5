"""What `train`, `estimate` and `compare` check once the configs are parsed.

One check for the three commands, made before any model is built or any
program compiled, so that a setting `train` rejects is rejected by each of
them, with the same line and exit status (2), in seconds instead of after
minutes of compiling:

  * a model is configured (`train.model`);
  * `train`'s own settings (`settings.check_train_settings`);
  * the trainer's settings (`trax_revplus.ReversibleSerialTrainer.*`), as
    its constructor will check them
    (`gin_bindings.validate_gin_bindings`), and their names.

It also names the trainer settings that would have no effect on the run:
bound, but the run trains with trax's default `Trainer`
(`train.use_memory_efficient_trainer = False`, trax's default) or with
stock trax's trainer, which does not read them (`no_effect_warnings`).
"""

import inspect
from typing import TYPE_CHECKING

import gin

import trax_revplus
from trax_revplus import validation
from trax_revplus.cli import gin_config
from trax_revplus.cli import settings
from trax_revplus.errors import one_line
from trax_revplus.errors import UserError

if TYPE_CHECKING:
  from trax_revplus import validation

TRAINER = 'trax_revplus.ReversibleSerialTrainer'


def trainer_option_line(error: 'validation.TrainerOptionError') -> str:
  """The line of a `validation.TrainerOptionError` (`train` and the rest).

  Args:
    error: `validation.TrainerOptionError`.
  """
  if error.allowed is None:  # A name the trainer does not have.
    # Without gin's "In call to configurable ..." line where gin called the
    # trainer.
    return f'the trainer rejects its settings: {one_line(error)}'
  return (
    f'the trainer rejects its settings: {error.name} must be '
    f'{error.allowed}, got {error.value!r}; fix '
    f'{TRAINER}.{error.name} in the config'
  )


def _check_trainer_settings() -> None:
  """Checks the bound trainer settings as the trainer will.

  Raises:
    UserError (exit status 2): a setting out of its range, or a name that
      is neither a setting nor an argument of the trainer.
  """
  # Here: they import trax, which `compare`'s parent process never does.
  # pylint: disable=g-import-not-at-top
  from trax_revplus.trainer import gin_bindings
  from trax_revplus.trainer._plan import options
  from trax_revplus.trainer import trainer

  # pylint: enable=g-import-not-at-top
  arguments = set(
    inspect.signature(trainer.ReversibleSerialTrainer.__init__).parameters
  ) - {'self', 'settings'}
  names = set(options.TrainerOptions.field_names())
  unknown = sorted(set(gin.get_bindings(TRAINER)) - names - arguments)
  if unknown:
    raise UserError(
      f'the trainer rejects its settings: {TRAINER} has no setting '
      f'{unknown[0]!r}; its settings: '
      f'{", ".join(validation.settings_of("ReversibleSerialTrainer"))}'
    )
  try:
    gin_bindings.validate_gin_bindings()
  except validation.TrainerOptionError as e:
    raise UserError(trainer_option_line(e)) from None


def check_config() -> None:
  """Checks the parsed config before anything is built.

  Needs trax imported and the configs parsed (`gin_config`), with the
  implementation the run trains with activated.

  Raises:
    UserError (exit status 2): no model, or a setting that cannot work.
  """
  if gin_config.bound_value('train.model', None) is None:
    raise UserError(
      'no model configured: bind train.model, e.g. '
      "--config='train.model = @trax.models.ReformerLM'"
    )
  settings.check_train_settings()
  _check_trainer_settings()


def no_effect_warnings() -> list[str]:
  """Lines naming the trainer settings the run would not use.

  Returns:
    list of str (empty, or one line naming every such binding and why).
  """
  # Registers the configurable; here: it imports trax, which `compare`'s
  # parent process never does.
  from trax_revplus import trainer  # pylint: disable=g-import-not-at-top

  del trainer
  bound = sorted(gin.get_bindings(TRAINER))
  if not bound:
    return []
  mode = gin_config.bound_value('train.use_memory_efficient_trainer', False)
  if gin_config.is_reference(mode):
    return []
  if not trax_revplus.is_active():
    why = (
      "the run trains with stock trax's classes, which do not read "
      'them; add the line `import trax_revplus.activate` to the config '
      '(or run with --implementation=revplus)'
    )
  elif not mode:
    why = (
      "train.use_memory_efficient_trainer is False (trax's default), "
      "so the run trains with trax's default Trainer; set it to True "
      "(or 2) to train with trax_revplus's ReversibleSerialTrainer"
    )
  else:
    return []
  names = ', '.join(f'{TRAINER}.{name}' for name in bound)
  verb = 'has' if len(bound) == 1 else 'have'
  return [f'{names} {verb} no effect: {why}']
