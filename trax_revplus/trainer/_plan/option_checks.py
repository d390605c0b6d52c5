"""The checks `options.TrainerOptions` makes of its settings, one line each.

A setting's value checked against its range (an int in [low, high], a
bool), and a settings mapping's names checked against the settings there
are. Apart from options.py, which lists the settings, their defaults and
their ranges, so that it stays the one place a setting is declared; these
checks know no setting by name. An accepted int or bool is stored back as
a Python int or bool.
"""

from typing import Any, Iterable, Mapping

import numpy as np

from trax_revplus import validation


def check_names(
  configurable: str, settings: Mapping[str, Any], names: Iterable[str]
) -> None:
  """Checks that every key of `settings` is one of `names`.

  Args:
    configurable: str, the gin configurable whose settings these are, as
      the error line names it.
    settings: {name: value} as given.
    names: the settings' names, in the order the error line lists them.

  Raises:
    validation.TrainerOptionError: a name that is not a setting (one that
      was removed says what replaced it), the first in sorted order.
  """
  names = tuple(names)
  unknown = sorted(set(settings) - set(names))
  removed = [n for n in unknown if n in validation.REMOVED_SETTINGS]
  if removed:
    name = removed[0]
    raise validation.TrainerOptionError(
      name,
      settings[name],
      None,
      message=validation.removed_setting_message(configurable, name),
    )
  if unknown:
    name = unknown[0]
    raise validation.TrainerOptionError(
      name,
      settings[name],
      None,
      message=(
        f'{configurable} has no setting {name!r}; its settings: '
        f'{", ".join(names)}.'
      ),
    )


def is_int(value: Any) -> bool:
  """Whether `value` is an int (Python's or numpy's), not a bool."""
  return isinstance(value, (int, np.integer)) and not isinstance(
    value, (bool, np.bool_)
  )


def check_int(
  options: Any,
  name: str,
  low: int,
  high: int | None = None,
  allowed: str | None = None,
) -> None:
  """Checks that setting `name` is an int in [low, high]; stores it as int.

  `allowed` describes the range in the error message (default: 'an int >=
  low').

  Raises:
    validation.TrainerOptionError: the setting is not such an int.
  """
  value = getattr(options, name)
  if not is_int(value) or value < low or (high is not None and value > high):
    raise validation.TrainerOptionError(
      name, value, allowed or f'an int >= {low}'
    )
  object.__setattr__(options, name, int(value))


def check_bool(options: Any, name: str) -> None:
  """Checks that setting `name` is a bool; stores it as a Python bool.

  Raises:
    validation.TrainerOptionError: the setting is not a bool.
  """
  value = getattr(options, name)
  if not isinstance(value, (bool, np.bool_)):
    raise validation.TrainerOptionError(name, value, 'True or False')
  object.__setattr__(options, name, bool(value))
