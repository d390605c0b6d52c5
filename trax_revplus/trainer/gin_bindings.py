"""The trainer's settings bound in gin, checked without making a trainer.

A command line parses its config and checks the settings bound there
before it builds a model, so that a bad one is rejected in seconds instead
of after the model's initialization. Apart from options.py, which declares
the settings and needs no gin: this reads gin's bindings.
"""

import gin

from trax_revplus.trainer._plan import options as options_lib


def validate_gin_bindings() -> options_lib.TrainerOptions:
  """Checks the settings bound in gin for the trainer, without making one.

  Reads the unscoped bindings of `trax_revplus.ReversibleSerialTrainer`
  (after `gin.parse_config...`) and checks those of `TrainerOptions`
  exactly as the trainer's constructor will; trax's own arguments and
  scoped bindings are left to the constructor. Imports no model, places
  nothing and touches no device, so a command line can call it right after
  parsing its config.

  Returns:
    `TrainerOptions`: the bound settings, defaults for the rest.

  Raises:
    validation.TrainerOptionError: a bound setting is out of its range.
  """
  bound = gin.get_bindings(options_lib.GIN_CONFIGURABLE)
  names = set(options_lib.TrainerOptions.field_names())
  return options_lib.TrainerOptions(
    **{k: v for k, v in bound.items() if k in names}
  )
