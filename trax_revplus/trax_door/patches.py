"""What trax_revplus binds on trax's classes and objects, and why.

`PATCHES` lists every attribute of a trax class or object that
trax_revplus rebinds: on the class (every instance sees it, from
`activate()` to `deactivate()` or within a block) or on one instance (that
object only). The tests check that each still exists in the installed
trax with the parameters the replacement takes. The functions below hand
out trax's own `Loop` methods that `trax_revplus.swap` wraps.
"""

import dataclasses
from typing import Any, Callable

from trax.supervised import training

from trax_revplus.trax_door.loop import LOOP
from trax_revplus.trax_door.registry import METHOD
from trax_revplus.trax_door.registry import uses

CLASS_SCOPE = 'class'
INSTANCE_SCOPE = 'instance'


@dataclasses.dataclass(frozen=True)
class Patch:
  """One attribute of a trax class or object that trax_revplus rebinds.

  Attributes:
    owner: dotted path of the trax class (of the object, for
      INSTANCE_SCOPE).
    name: the attribute rebound.
    scope: CLASS_SCOPE or INSTANCE_SCOPE.
    by: the trax_revplus module that rebinds it.
    why: what the replacement adds.
    parameters: the parameters trax calls it with (a method's without
      `self`), which the replacement takes and hands on.
  """

  owner: str
  name: str
  scope: str
  by: str
  why: str
  parameters: tuple[str, ...]


_INIT = ('model', 'tasks', 'eval_model', 'eval_tasks', 'output_dir')
PATCHES = (
  Patch(
    LOOP,
    '__init__',
    CLASS_SCOPE,
    'trax_revplus.swap',
    'a memory-efficient Loop rejects an optimizer instance before it '
    'builds anything, and keeps the eval model given',
    _INIT,
  ),
  Patch(
    LOOP,
    '_init_trainer',
    CLASS_SCOPE,
    'trax_revplus.swap',
    "tells our trainer the Loop's output dir",
    ('task',),
  ),
  Patch(
    LOOP,
    '_init_evaluator',
    CLASS_SCOPE,
    'trax_revplus.swap',
    "evaluates the eval model given, on the trainer's device",
    ('eval_task',),
  ),
  Patch(
    LOOP,
    'save_checkpoint',
    CLASS_SCOPE,
    'trax_revplus.swap',
    'writes a verified checkpoint set (`trax_revplus.checkpoints`)',
    ('basename',),
  ),
  Patch(
    LOOP,
    'load_checkpoint',
    CLASS_SCOPE,
    'trax_revplus.swap',
    'loads a verified checkpoint set, RNG and data position included',
    ('directory', 'filename'),
  ),
  Patch(
    LOOP,
    '__init__',
    CLASS_SCOPE,
    'trax_revplus.cli.build_errors',
    "during a command's build: its errors typed (model, trainer, "
    'checkpoint), each reported in one line',
    _INIT,
  ),
  Patch(
    LOOP,
    '_init_trainer',
    INSTANCE_SCOPE,
    'trax_revplus.cli.build_errors',
    'during the build: a model or trainer settings error typed',
    ('task',),
  ),
  Patch(
    LOOP,
    'load_checkpoint',
    INSTANCE_SCOPE,
    'trax_revplus.cli.build_errors',
    'during the build: a checkpoint that does not fit or load typed',
    ('directory', 'filename'),
  ),
  Patch(
    LOOP,
    '_run_one_step',
    INSTANCE_SCOPE,
    'trax_revplus.progress.printer',
    "the progress lines see each step's loss",
    ('task_index', 'task_changed'),
  ),
  Patch(
    'trax.supervised.training.TrainTask',
    'next_batch',
    INSTANCE_SCOPE,
    'trax_revplus.progress.step_inputs',
    "the step report records each batch's signature",
    (),
  ),
  Patch(
    'trax.optimizers.trainer.ReversibleSerialTrainer',
    'one_step',
    CLASS_SCOPE,
    'trax_revplus.compat',
    "stock's step, run as the baseline: the Loop's RNG placed on the "
    "step's device, as current JAX requires",
    ('batch', 'rng', 'step', 'learning_rate'),
  ),
  Patch(
    'trax.layers.core.Dropout',
    'forward',
    CLASS_SCOPE,
    'trax_revplus.trainer._step.row_draws',
    'within a sliced or fixed-key call: masks drawn as the unsliced '
    'call draws them',
    ('x',),
  ),
  Patch(
    'trax.layers.base.Layer',
    'forward',
    INSTANCE_SCOPE,
    'trax_revplus.trainer._step.row_draws',
    'within a fixed-key call: attention draws from a fixed key',
    ('inputs',),
  ),
)


@uses(LOOP, '_init_trainer', METHOD, '', parameters=('task',))
def loop_init_trainer() -> Callable[..., Any]:
  """trax's `Loop._init_trainer` as bound on the class now."""
  return training.Loop._init_trainer  # pylint: disable=protected-access


@uses(
  LOOP,
  '_init_evaluator',
  METHOD,
  'called by `Loop.__init__` with (eval_task) per eval task, it returns '
  "the task's evaluator",
  parameters=('eval_task',),
)
def loop_init_evaluator() -> Callable[..., Any]:
  """trax's `Loop._init_evaluator` as bound on the class now."""
  return training.Loop._init_evaluator  # pylint: disable=protected-access
