"""Checks of `train`'s gin settings, made before anything is built.

trax checks most of these late or not at all: `train.steps = 'abc'` fails
with a `TypeError` after the model is built, `train.eval_frequency = 0`
divides by zero at step 2, and two settings that exclude each other fail
only once training starts. Each check here names the binding, what it must
be, and, for a setting with a few allowed values, lists them.
"""

from typing import Any

import numpy as np

from trax_revplus.cli import gin_config
from trax_revplus.errors import UserError

# train()'s settings with a few allowed values: gin name -> the values (ints
# and bools compare equal: 1 is True).
ENUM_SETTINGS = {
  'train.use_memory_efficient_trainer': (False, True, 2),
}

# Pairs of train() settings of which at most one may be bound.
EXCLUSIVE_SETTINGS = (
  ('train.permanent_checkpoint_frequency', 'train.permanent_checkpoints_at'),
)


def _is_int(value: Any) -> bool:
  return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


_UNBOUND = object()


def _bound(name: str, unbound: Any = None) -> Any:
  """The literal bound to `name`; `unbound` when unbound or a reference."""
  value = gin_config.bound_value(name, _UNBOUND)
  if value is _UNBOUND or gin_config.is_reference(value):
    return unbound
  return value


def _check_positive_int(
  name: str, value: Any, allow_none: bool, default: Any
) -> None:
  if value is _UNBOUND:  # trax's default, which is valid.
    return
  if value is None and allow_none:
    return
  if not _is_int(value) or value < 1:
    unset = f' (or None: {default})' if allow_none else ''
    raise UserError(
      f'{name} = {value!r}: must be a positive int{unset}; '
      f"e.g. --config='{name} = 100'"
    )


def _check_step_list(name: str, value: Any) -> None:
  if value is None:
    return
  if not isinstance(value, (list, tuple)) or not all(
    _is_int(v) and v >= 1 for v in value
  ):
    raise UserError(
      f'{name} = {value!r}: must be a list of positive step '
      f"numbers, e.g. --config='{name} = [100, 200]'"
    )


def check_train_settings() -> None:
  """Checks the settings gin binds to `trax.supervised.trainer_lib.train`.

  Unbound settings keep trax's defaults, which are valid. Settings bound to
  a `@reference` are left to trax.

  Raises:
    UserError (exit status 2): `train.steps`, `train.eval_steps`,
      `train.eval_frequency` or `train.permanent_checkpoint_frequency` not a
      positive int (the last two may be None); `train.checkpoints_at` or
      `train.permanent_checkpoints_at` not a list of positive ints;
      `train.random_seed` neither an int nor None; an enum-like setting
      (`ENUM_SETTINGS`) bound to another value (the message lists the
      allowed ones); both settings of an `EXCLUSIVE_SETTINGS` pair bound
      (the message names both).
  """
  _check_positive_int(
    'train.steps', _bound('train.steps', _UNBOUND), False, None
  )
  _check_positive_int(
    'train.eval_steps', _bound('train.eval_steps', _UNBOUND), False, None
  )
  _check_positive_int(
    'train.eval_frequency',
    _bound('train.eval_frequency', _UNBOUND),
    True,
    'no evals after step 1',
  )
  _check_positive_int(
    'train.permanent_checkpoint_frequency',
    _bound('train.permanent_checkpoint_frequency', _UNBOUND),
    True,
    'no permanent checkpoints',
  )
  for name in ('train.checkpoints_at', 'train.permanent_checkpoints_at'):
    _check_step_list(name, _bound(name))
  seed = _bound('train.random_seed')
  if seed is not None and not _is_int(seed):
    raise UserError(
      f'train.random_seed = {seed!r}: must be an int, or None '
      f'for a seed from the clock'
    )
  for name, allowed in ENUM_SETTINGS.items():
    value = gin_config.bound_value(name, None)
    if value is None or gin_config.is_reference(value):
      continue
    if isinstance(value, float) or value not in allowed:
      raise UserError(
        f'{name} = {value!r}: must be one of {", ".join(map(repr, allowed))}'
      )
  for first, second in EXCLUSIVE_SETTINGS:
    if _bound(first) is not None and _bound(second) is not None:
      raise UserError(
        f'{first} and {second} are both set; they exclude each other: keep one'
      )
