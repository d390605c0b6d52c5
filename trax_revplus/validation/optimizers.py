"""Checks that the trainer is given an optimizer factory, not an optimizer.

`ReversibleSerialTrainer` makes one optimizer per layer, so it needs a
factory; these checks name the mistake either way round.
"""

import inspect
from typing import TYPE_CHECKING, Callable

from trax_revplus import trax_import
from trax_revplus.validation import errors

if TYPE_CHECKING:  # Annotations only: trax is imported inside the checks.
  from trax.optimizers import base as optimizer_base


def check_optimizer_factory(optimizer_fn: object) -> None:
  """Checks that `optimizer_fn` is a factory of optimizers, not an instance.

  `ReversibleSerialTrainer` makes one optimizer per layer, so it needs a
  factory (trax's memory-efficient `Loop` passes `TrainTask.optimizer`
  through, and `trainer_lib.train` passes `train.optimizer` uncalled in that
  mode). The reverse mistake, a factory that does not return an
  `Optimizer` (e.g. a function returning a learning rate), is caught when it
  is first called, by `make_optimizer`.

  Args:
    optimizer_fn: a `trax.optimizers.Optimizer` subclass or a callable with
      no required arguments returning an `Optimizer`.

  Raises:
    OptimizerFactoryError: if it is an `Optimizer` instance or not callable.
  """
  base = trax_import.module('trax.optimizers.base')
  if isinstance(optimizer_fn, base.Optimizer):
    name = type(optimizer_fn).__name__
    raise errors.OptimizerFactoryError(
      f'optimizer_fn is an optimizer instance ({name}(...)); the '
      f'memory-efficient trainer makes one optimizer per layer and needs '
      f'a factory: pass the class, e.g. trax.optimizers.{name}, not '
      f'trax.optimizers.{name}() (for settings use functools.partial or '
      f'gin bindings such as {name}.learning_rate).'
    )
  if not callable(optimizer_fn):
    raise errors.OptimizerFactoryError(
      f'optimizer_fn must be an optimizer class or a function returning '
      f'an optimizer, got {type(optimizer_fn).__name__} {optimizer_fn!r}; '
      f'pass e.g. trax.optimizers.Adam.'
    )


def make_optimizer(
  optimizer_fn: 'Callable[[], optimizer_base.Optimizer]',
  layer_index: int | None = None,
) -> 'optimizer_base.Optimizer':
  """Calls the factory and checks it returned an `Optimizer`.

  Args:
    optimizer_fn: as for `check_optimizer_factory`.
    layer_index: int or None, named in the error.

  Returns:
    The new `trax.optimizers.Optimizer`.

  Raises:
    OptimizerFactoryError: if the result is not an `Optimizer`, or calling
      with no arguments fails for lack of arguments.
  """
  base = trax_import.module('trax.optimizers.base')
  where = '' if layer_index is None else f' (for layer {layer_index})'
  try:
    inspect.signature(optimizer_fn).bind()
  except TypeError as e:
    raise errors.OptimizerFactoryError(
      f'optimizer_fn{where} must be callable with no arguments, but '
      f'{e}; bind its arguments with functools.partial or gin.'
    ) from None
  except ValueError:
    pass  # No signature to inspect (some builtins); just call it.
  optimizer = optimizer_fn()
  if not isinstance(optimizer, base.Optimizer):
    raise errors.OptimizerFactoryError(
      f'optimizer_fn{where} returned a {type(optimizer).__name__}, not a '
      f'trax.optimizers.Optimizer; pass an optimizer class such as '
      f'trax.optimizers.Adam or a function returning an instance of one.'
    )
  return optimizer
