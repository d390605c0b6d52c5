"""trax's errors while `train` builds its Loop, typed by what was being built.

`trainer_lib.train` builds a `training.Loop`, whose constructor initializes
the model, builds the trainer and loads the checkpoint of the output dir,
in one call that raises trax's or Python's plain errors. While
`watch_loop_build` is active, the parts of a Loop's construction re-raise
an error they can raise for a known reason as the `BuildError` of that part
(its `cause` the error itself): `failures` then maps each type to its line.
`estimate` and `compare` build the model themselves and type its errors the
same way (`as_model_error`), and `typed_model` types the errors of the
model's constructor, which `trainer_lib.train` calls before the Loop. An
error of trax_revplus's own types passes through as raised: its type says
what went wrong already. What else `trainer_lib.train` calls before the
Loop (the inputs, the tasks) is not one part, so its plain errors stay
untyped.

Only the standard library is imported at the top: trax is imported once a
Loop or a model is being built.
"""

import contextlib
import functools
from typing import Any, Callable, Iterator

from trax_revplus import trax_import
from trax_revplus.trax_door import loop as loop_door

# What a model's code raises for a binding it cannot take (a layer's own
# error, trax's `LayerError`, wraps any of these raised while it
# initializes).
_MODEL_ERRORS = (TypeError, ValueError, IndexError, KeyError, AssertionError)
# What a trainer's constructor raises for settings it rejects.
_TRAINER_ERRORS = (ValueError, TypeError)
# What loading weights of another shape or structure raises.
_CHECKPOINT_ERRORS = (IndexError, ValueError, KeyError)
# What stock trax 1.4.1's load raises on current JAX for a checkpoint that
# fits: it compares its memory-efficient trainer's slots, device arrays,
# with () (`fastmath.tree_unflatten`), which JAX refuses.
_LOAD_ERRORS = (TypeError,)


class BuildError(Exception):
  """An error raised while building a part of a training run.

  Attributes:
    cause: the exception the part raised.
  """

  def __init__(self, cause: BaseException):
    super().__init__(str(cause))
    self.cause = cause


class ModelError(BuildError):
  """The model could not be built or initialized from its bindings."""


class TrainerSettingsError(BuildError):
  """Building the trainer failed on its settings (its constructor or its
  optimizer rejected them)."""


class CheckpointFitError(BuildError):
  """The checkpoint in the output dir cannot be loaded into this model."""


class CheckpointLoadError(BuildError):
  """Loading the checkpoint in the output dir failed otherwise."""


def _ours(error: BaseException) -> bool:
  """Whether `error`'s type is trax_revplus's own (e.g. a checkpoint's
  `CheckpointMismatchError`, a `ConfigurationError`), reported as itself."""
  return type(error).__module__.startswith('trax_revplus.')


def _layer_error() -> type[Exception]:
  return trax_import.module('trax.layers.base').LayerError


def as_model_error(error: Exception) -> Exception:
  """`error`, raised while building or initializing a model, as a
  `ModelError` when a model's bindings can cause it; else `error` itself.
  """
  if not _ours(error) and isinstance(error, (_layer_error(),) + _MODEL_ERRORS):
    return ModelError(error)
  return error


def _typed(
  method: Callable[..., Any],
  catches: tuple[type[BaseException], ...],
  error_type: type,
) -> Callable[..., Any]:
  """`method`, whose errors of types `catches` become `error_type`s."""

  @functools.wraps(method)
  def typed(*args, **kwargs):
    try:
      return method(*args, **kwargs)
    except catches as e:
      if _ours(e):
        raise
      raise error_type(e) from e

  return typed


def typed_model(model_fn: Callable[..., Any]) -> Callable[..., Any]:
  """`model_fn` (e.g. `trax.models.ReformerLM`), whose errors are typed.

  Args:
    model_fn: the model's constructor, as `train.model` binds it.

  Returns:
    A callable taking `model_fn`'s arguments that returns its model and
    raises what `model_fn` raises, as `as_model_error` types it.
  """
  return _typed(model_fn, (_layer_error(),) + _MODEL_ERRORS, ModelError)


class LoopBuild:
  """What `watch_loop_build` saw of the Loop being built.

  Attributes:
    loop: the `training.Loop` whose construction began last, or None: its
      trainers hold memory logs to close even when it failed half-built.
  """

  def __init__(self):
    self.loop = None


@contextlib.contextmanager
def watch_loop_build() -> Iterator[LoopBuild]:
  """Types the errors of each `training.Loop` built meanwhile, by part.

  While a Loop is constructed, its `_init_trainer` (initializing the
  model's blocks, then building the trainer) raises a `ModelError` for a
  layer that cannot initialize and a `TrainerSettingsError` for settings
  rejected; its `load_checkpoint` raises a `CheckpointFitError` (or, for
  stock trax's failure on current JAX, a `CheckpointLoadError`); any other
  layer error of its construction (the model's or the eval model's
  initialization) is a `ModelError`. Once it is built, the Loop's methods
  are its class's again, so an error while training is not typed here.
  Whatever `training.Loop.__init__` is (trax_revplus's when activated), it
  is wrapped as found and restored on exit.

  Yields:
    `LoopBuild`, naming the Loop once its construction has begun.
  """
  training = trax_import.module('trax.supervised.training')
  layer_error = _layer_error()
  build = LoopBuild()
  init = vars(training.Loop)['__init__']

  @functools.wraps(init)
  def typed_init(loop, *args, **kwargs):
    build.loop = loop
    # On the instance: only this construction's calls are typed.
    loop_door.wrap_init_trainer(
      loop,
      lambda init_trainer: _typed(
        _typed(init_trainer, (layer_error,), ModelError),
        _TRAINER_ERRORS,
        TrainerSettingsError,
      ),
    )
    loop.load_checkpoint = _typed(
      _typed(loop.load_checkpoint, _CHECKPOINT_ERRORS, CheckpointFitError),
      _LOAD_ERRORS,
      CheckpointLoadError,
    )
    try:
      init(loop, *args, **kwargs)
    except layer_error as e:  # The model's or the eval model's init.
      raise ModelError(e) from e
    finally:
      loop_door.unwrap_init_trainer(loop)
      del loop.load_checkpoint

  training.Loop.__init__ = typed_init
  try:
    yield build
  finally:
    training.Loop.__init__ = init
