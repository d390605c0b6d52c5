"""What `train` binds, and reads, in the parsed gin config before trax builds.

Once the configs are parsed, `train` applies its flags as bindings
(`--implementation`, `--memory_log_every_n_steps`), shares process 0's seed
in a multi-process run, adds its progress printer to `train.callbacks` and
types the model's constructor errors: all by reading and binding gin values,
before `trainer_lib.train` builds the model and trainer. Kept apart from
`train`, which orders the run (flags, join, output dir, device, logging),
so that each change to the config it trains lives in one place.
"""

import copy
import functools
import inspect
import sys
from typing import Any, Sequence

import gin

from trax_revplus import trax_import
from trax_revplus.errors import UserError
from trax_revplus.cli import build_errors
from trax_revplus.cli import gin_config
from trax_revplus.multiprocess import training as processes

# The module a config imports to train with trax_revplus.
ACTIVATION_MODULE = 'trax_revplus.activate'


def select_implementation(implementation: str) -> None:
  """Applies --implementation after the configs are parsed.

  The model and trainer are built later, in trainer_lib.train, so they get
  the classes bound here whatever the config's activation line did.

  Args:
    implementation: 'config' (leave as parsed), 'stock' or 'revplus'.
  """
  # Here: it imports trax, which waits until the flags are checked.
  from trax_revplus import swap  # pylint: disable=g-import-not-at-top

  if implementation == 'stock':
    activation = sys.modules.get(ACTIVATION_MODULE)
    swap.deactivate()
    if activation is not None:
      # `deactivate` forgets the import, so that parsing the config again
      # activates again; but trax's Loop imports the config's modules
      # again itself, when it saves the operative config after step 1
      # (`Loop._save_gin`): the line stays without effect for the run.
      sys.modules[ACTIVATION_MODULE] = activation
  elif implementation == 'revplus':
    swap.activate()


def bind_memory_log(every_n_steps: int | None) -> None:
  """Applies --memory_log_every_n_steps (None: leave the config's)."""
  if every_n_steps is None:
    return
  # Registers the configurable; here: it imports trax, which waits until
  # the flags are checked.
  from trax_revplus import trainer  # pylint: disable=g-import-not-at-top

  del trainer
  gin.bind_parameter(
    'trax_revplus.ReversibleSerialTrainer.memory_log_every_n_steps',
    every_n_steps,
  )


def total_steps() -> int:
  """train.steps as bound, else `trainer_lib.train`'s default."""
  trainer_lib = trax_import.module('trax.supervised.trainer_lib')
  return gin_config.bound_value(
    'train.steps',
    inspect.signature(trainer_lib.train).parameters['steps'].default,
  )


def train_callbacks(
  every_n_steps: int, profile: Sequence[int] | None = None
) -> list[Any]:
  """train.callbacks as gin would pass them, plus a ProgressPrinter, and a
  StepProfiler of the steps `profile` (first, last) names.

  Raises:
    UserError (exit status 2): `profile` names a step past train.steps.
  """
  # Here: it imports trax, which waits until the flags are checked.
  from trax_revplus import progress  # pylint: disable=g-import-not-at-top

  profiler = []
  if profile is not None:
    steps = total_steps()
    if profile[1] > steps:
      raise UserError(
        f'--profile={profile} names steps past train.steps '
        f'= {steps}; give steps up to {steps}'
      )
    profiler.append(
      functools.partial(
        progress.StepProfiler, first_step=profile[0], last_step=profile[1]
      )
    )

  # Gin hands a configurable the deep copy of its bound value; the copy
  # turns `@Callback` references into the callables themselves.
  callbacks = list(
    copy.deepcopy(gin_config.bound_value('train.callbacks', None)) or []
  )
  callbacks += profiler
  if any(
    isinstance(c, type) and issubclass(c, progress.ProgressPrinter)
    for c in callbacks
  ):
    return callbacks
  callbacks.append(
    functools.partial(
      progress.ProgressPrinter,
      total_steps=total_steps(),
      every_n_steps=every_n_steps,
    )
  )
  return callbacks


def share_seed() -> None:
  """Binds train.random_seed to process 0's when the config sets none.

  Every process then initializes the same weights and draws the same
  per-step RNG (trax would seed each host differently and average the
  initial weights).
  """
  if gin_config.bound_value('train.random_seed', None) is None:
    gin.bind_parameter('train.random_seed', processes.shared_random_seed())


def typed_model() -> dict[str, Any]:
  """`{'model': ...}`: the bound model, its constructor's errors typed
  (`build_errors.typed_model`); empty where `train.model` is no reference
  to a constructor (gin then reports what is wrong with it)."""
  model = gin_config.bound_value('train.model', None)
  if not gin_config.is_reference(model) or str(model).endswith('()'):
    return {}
  # gin's deep copy of a reference is the configurable it names.
  return {'model': build_errors.typed_model(copy.deepcopy(model))}
