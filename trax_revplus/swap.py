"""Swap trax's reversible layers and trainer for trax_revplus's, and back.

trax's own modules reach the classes through many names
(`trax.layers.ReversibleSerial`, `trax.layers.reversible.ReversibleSerial`,
`trax.optimizers.ReversibleSerialTrainer`, `optimizers.trainer.
init_reversible_blocks` as called by `training.Loop`, ...). Rather than list
them, `activate()` walks every loaded `trax.*` module and replaces each
attribute that *is* a stock object by its replacement, remembering what it
replaced so that `deactivate()` restores exactly the previous bindings.
Methods of trax's `training.Loop` that ours extend are swapped the same way:
the binding found at `activate()` is remembered and put back (each is
listed, with why, in `trax_door.patches.PATCHES`).
"""

import inspect
import sys
import threading
from typing import Any
import weakref

from absl import logging
from trax import fastmath as _fastmath
from trax.layers import acceleration as _stock_acceleration
from trax.layers import reversible as _stock_reversible
from trax.optimizers import base as _optimizer_base
from trax.optimizers import trainer as _stock_trainer
from trax.supervised import training as _training

from trax_revplus import checkpoints
from trax_revplus import compat
from trax_revplus import evaluation
from trax_revplus import layers
from trax_revplus import run_classes
from trax_revplus import trainer as trainer_lib
from trax_revplus import validation
from trax_revplus.trax_door import functions as trax_functions
from trax_revplus.trax_door import loop as loop_door
from trax_revplus.trax_door import patches as trax_patches

_lock = threading.Lock()
# (module, attribute name, stock object) for every binding we replaced.
_replaced: list[tuple[Any, str, Any]] = []
_stock_init_trainer = trax_patches.loop_init_trainer()
_stock_loop_init = _training.Loop.__init__
_stock_init_evaluator = trax_patches.loop_init_evaluator()
# The eval model each memory-efficient Loop was given, kept for
# `_init_evaluator_with_eval_model` (trax replaces it by the training model).
_eval_model_given: weakref.WeakKeyDictionary[Any, Any] = (
  weakref.WeakKeyDictionary()
)


def _replacements():
  """Maps each stock object (by id) to (stock object, replacement)."""
  pairs = [
    (_stock_reversible.ReversibleHalfResidual, layers.ReversibleHalfResidual),
    (_stock_reversible.ReversibleSerial, layers.ReversibleSerial),
    (
      _stock_trainer.ReversibleSerialTrainer,
      trainer_lib.ReversibleSerialTrainer,
    ),
    (_stock_trainer.init_reversible_blocks, trainer_lib.init_reversible_blocks),
    # Helpers of trax's Loop that current JAX broke or deprecated.
    (_fastmath.tree_unflatten, compat.tree_unflatten),
    (_stock_acceleration.for_n_devices, compat.for_n_devices),
    (trax_functions.bound_accelerate(), compat.accelerate),
    (_training.init_host_and_devices, compat.init_host_and_devices),
    (_stock_acceleration.on_cpu, compat.on_cpu),
  ]
  return {id(stock): (stock, ours) for stock, ours in pairs}


def _trax_modules():
  return [
    m
    for name, m in list(sys.modules.items())
    if m is not None and (name == 'trax' or name.startswith('trax.'))
  ]


def _init_trainer_with_output_dir(loop, task):
  """`training.Loop._init_trainer`, then tells our trainer the Loop's dir.

  The memory log needs `Loop.output_dir` to write `memory.jsonl` and
  TensorBoard scalars; stock `Loop` does not pass it to the trainer. Its
  'start' record names the trainer and the Loop's model's reversible layers
  (`run_classes`), as the summary and run_stats.json do.
  """
  trainer = _stock_init_trainer(loop, task)
  set_output_dir = getattr(trainer, 'set_output_dir', None)
  if set_output_dir is not None:
    set_output_dir(loop.output_dir)
  memory_log = getattr(trainer, 'memory_log', None)
  if memory_log is not None:
    classes = run_classes.of_trainers_and_model(
      [trainer], getattr(loop, 'model', None)
    )
    memory_log.set_run_classes(classes.trainer, classes.reversible_layers)
  return trainer


def _optimizer_instance_message(mode, index, optimizer):
  name = type(optimizer).__name__
  return (
    f'training.Loop(use_memory_efficient_trainer={mode!r}): the optimizer '
    f'of task {index} is an optimizer instance ({name}(...)), but the '
    f'memory-efficient trainer makes one optimizer per layer and needs a '
    f'factory: pass TrainTask(..., optimizer=trax.optimizers.{name}), not '
    f'trax.optimizers.{name}() (settings with functools.partial or gin '
    f'bindings such as {name}.learning_rate).'
  )


def _loop_init(loop, *args, **kwargs):
  """`training.Loop.__init__`, with two changes for the memory-efficient mode.

  Before anything is built or initialized, each task's optimizer must be a
  factory (the trainer calls it once per layer); an optimizer instance,
  which trax's memory-efficient trainer rejects only after the model is
  initialized, fails here. And the `eval_model` given is kept for
  evaluation (`_init_evaluator`), where trax evaluates the training model.

  Raises:
    validation.OptimizerFactoryError: in the memory-efficient mode, a task's
      optimizer is an `Optimizer` instance or not callable.
  """
  arguments = (
    inspect.signature(_stock_loop_init).bind(loop, *args, **kwargs).arguments
  )
  mode = arguments.get('use_memory_efficient_trainer', False)
  if mode:
    tasks = arguments.get('tasks')
    tasks = tasks if isinstance(tasks, (list, tuple)) else [tasks]
    for index, task in enumerate(tasks):
      optimizer = getattr(task, 'optimizer', None)
      if isinstance(optimizer, _optimizer_base.Optimizer):
        raise validation.OptimizerFactoryError(
          _optimizer_instance_message(mode, index, optimizer)
        )
      validation.check_optimizer_factory(optimizer)
    _eval_model_given[loop] = arguments.get('eval_model')
  _stock_loop_init(loop, *args, **kwargs)


def _init_evaluator_with_eval_model(loop, eval_task):
  """`training.Loop._init_evaluator`, evaluating the eval model on the device.

  trax's memory-efficient `Loop` replaces the `eval_model` it was given by
  the training model, so its evals ran with dropout and other train-mode
  behaviour. Here the eval model given (e.g. `mode='eval'`, as
  `trainer_lib.train` passes it) is evaluated, with the training model's
  weights and state: the same host arrays, not a copy, which `run_evals`
  passes to the evaluator at every eval. Without an eval model, or if its
  weights do not fit the training model's, the training model is
  evaluated, as trax does.

  trax evaluates on the host's CPU device; with trax_revplus's trainer the
  evaluator is an `evaluation.DeviceEvaluator`: the eval runs on the
  trainer's (first) device, planned under its step's device memory budget.
  """
  eval_model = _eval_model_given.get(loop)
  memory_efficient = loop_door.memory_efficient_mode(loop)
  if (
    memory_efficient
    and eval_model is not None
    and loop_door.eval_model(loop) is not eval_model
  ):
    try:
      eval_model.weights = loop_door.model(loop).weights
      eval_model.state = loop_door.model(loop).state
    except ValueError as e:
      logging.warning(
        'eval_model does not take the weights of the model '
        '(%s); evaluating the training model instead.',
        e,
      )
    else:
      loop_door.set_eval_model(loop, eval_model)
  trainer = loop_door.trainers(loop)[0]
  if memory_efficient and isinstance(
    trainer, trainer_lib.ReversibleSerialTrainer
  ):
    model_with_metrics = trax_functions.model_with_metrics(
      loop_door.eval_model(loop), eval_task
    )
    return trax_functions.evaluator(
      weights=compat.on_cpu(model_with_metrics.weights[1]),
      state=compat.on_cpu(model_with_metrics.state[1]),
      metrics_fn=evaluation.DeviceEvaluator(
        model_with_metrics, trainer.placement, trainer.planner.budget_bytes
      ),
    )
  return _stock_init_evaluator(loop, eval_task)


def _loop_methods():
  """Maps names of `training.Loop` methods to trax_revplus's versions."""
  return {
    '__init__': _loop_init,
    '_init_trainer': _init_trainer_with_output_dir,
    '_init_evaluator': _init_evaluator_with_eval_model,
    'save_checkpoint': checkpoints.save_checkpoint,
    'load_checkpoint': checkpoints.load_checkpoint,
  }


def activate() -> None:
  """Makes trax resolve its reversible classes to trax_revplus's.

  After this call `trax.layers.ReversibleHalfResidual`,
  `trax.layers.ReversibleSerial`, `trax.optimizers.ReversibleSerialTrainer`
  and `trax.optimizers.trainer.init_reversible_blocks` (and every other name
  a loaded trax module binds to them) are the trax_revplus versions, so
  models built afterwards (e.g. `trax.models.ReformerLM`) and
  `training.Loop(use_memory_efficient_trainer=...)` use them. It also
  binds `trax_revplus.compat`'s current-JAX versions of trax's
  `fastmath.tree_unflatten` (checkpoint restore of optimizer slots),
  `layers.for_n_devices` (multi-device replication),
  `training.init_host_and_devices` and `acceleration._accelerate` (no
  deprecated `jax.host_count` or `jit(..., device=...)`), and
  `training.Loop.save_checkpoint` / `load_checkpoint` to
  `trax_revplus.checkpoints`' (checkpoint files written and loaded as a
  consistent set; the Loop's RNG and data position resumed). The
  memory-efficient `Loop` then rejects an optimizer instance before it
  initializes anything (`_loop_init`) and evaluates the `eval_model` it is
  given, e.g. dropout off, rather than the training model, on the
  trainer's device rather than the host's CPU, planned under the
  trainer's device memory budget (`_init_evaluator_with_eval_model`,
  `evaluation.DeviceEvaluator`). Layers built before the call keep
  their classes. Calling it twice is harmless.
  """
  with _lock:
    if _replaced:
      return
    table = _replacements()
    for module in _trax_modules():
      for name, value in list(vars(module).items()):
        hit = table.get(id(value))
        if hit is not None and hit[0] is value:
          setattr(module, name, hit[1])
          _replaced.append((module, name, value))
    for name, ours in _loop_methods().items():
      _replaced.append((_training.Loop, name, vars(_training.Loop)[name]))
      setattr(_training.Loop, name, ours)


def deactivate() -> None:
  """Restores every binding `activate()` replaced; stock trax again.

  Also forgets the import of the `trax_revplus.activate` module, so that a
  later `import trax_revplus.activate` (a gin config parsed again) runs it,
  and activates, again.
  """
  with _lock:
    while _replaced:
      module, name, stock = _replaced.pop()
      setattr(module, name, stock)
    # Python runs a module once per process: without this, the gin
    # one-liner after a deactivate() would find the module imported and
    # leave stock trax bound.
    sys.modules.pop('trax_revplus.activate', None)


def is_active() -> bool:
  """Returns True between `activate()` and `deactivate()`."""
  return bool(_replaced)
