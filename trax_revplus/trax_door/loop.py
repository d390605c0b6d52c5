"""A `trax.supervised.training.Loop`'s private attributes and methods.

trax's `Loop` keeps its tasks, trainers, RNG and output dir in private
attributes its constructor sets, and runs each step and builds each
trainer in private methods; these functions are the only way trax_revplus
reads, sets or wraps them. trax is not imported here: the command line
reads a Loop's attributes before it imports trax's modules itself.
"""

import contextlib
from typing import Any, Callable, Iterator, Sequence

from trax_revplus import trax_import
from trax_revplus.trax_door.registry import ATTRIBUTE
from trax_revplus.trax_door.registry import FUNCTION
from trax_revplus.trax_door.registry import METHOD
from trax_revplus.trax_door.registry import uses

LOOP = 'trax.supervised.training.Loop'


@contextlib.contextmanager
@uses(
  LOOP,
  '_output_dir',
  ATTRIBUTE,
  'the directory (str or None) `save_checkpoint` writes into, read '
  'when it is called',
  check=lambda v: v is None or isinstance(v, str),
)
def output_dir_set_to(loop: Any, output_dir: str) -> Iterator[None]:
  """Within the block, the Loop's output dir is `output_dir`; put back as
  found after it, also on an error.

  Reads and sets `Loop._output_dir`, which trax's `save_checkpoint` reads
  for where to write (`Loop.output_dir` has no setter).
  """
  found = loop._output_dir  # pylint: disable=protected-access
  loop._output_dir = output_dir  # pylint: disable=protected-access
  try:
    yield
  finally:
    loop._output_dir = found  # pylint: disable=protected-access


@uses(
  LOOP,
  '_rng',
  ATTRIBUTE,
  'the PRNG key `Loop.new_rng` splits once per step and per eval '
  'batch, replaced by the split',
  check=lambda v: tuple(v.shape) == (2,),
)
def rng(loop: Any) -> Any:
  """The Loop's PRNG key (`Loop._rng`), or None if it has none."""
  return getattr(loop, '_rng', None)


@uses(LOOP, '_rng', ATTRIBUTE, '')
def set_rng(loop: Any, key: Any) -> None:
  """Sets the key `Loop.new_rng` splits next (`Loop._rng`)."""
  loop._rng = key  # pylint: disable=protected-access


@uses(
  LOOP,
  '_tasks',
  ATTRIBUTE,
  "the training tasks, a list; each task's `next_batch` is what the "
  'Loop calls for its batch',
  check=lambda v: isinstance(v, list),
)
def tasks(loop: Any) -> Sequence:
  """The Loop's training tasks (`Loop._tasks`); () for another object."""
  return getattr(loop, '_tasks', ())


@uses(
  LOOP,
  '_eval_tasks',
  ATTRIBUTE,
  'the eval tasks, a list (None entries where a task has none)',
  check=lambda v: isinstance(v, list),
)
def eval_tasks(loop: Any) -> Sequence:
  """The Loop's eval tasks (`Loop._eval_tasks`), None entries included;
  () for another object."""
  return getattr(loop, '_eval_tasks', ())


@uses(
  LOOP,
  '_eval_at',
  ATTRIBUTE,
  'a function of the step number: whether the Loop runs its evals '
  'after that step',
  check=callable,
)
def eval_at(loop: Any) -> Callable[[int], bool] | None:
  """The Loop's `eval_at` function (`Loop._eval_at`), or None."""
  return getattr(loop, '_eval_at', None)


@uses(
  LOOP,
  '_trainer_per_task',
  ATTRIBUTE,
  'the trainers the Loop steps, one per task, a tuple',
  check=lambda v: isinstance(v, tuple),
)
def trainers(loop: Any) -> tuple:
  """The Loop's trainers, one per task (`Loop._trainer_per_task`); () for
  another object or before they are built."""
  return getattr(loop, '_trainer_per_task', ())


@uses(
  LOOP,
  '_use_memory_efficient_trainer',
  ATTRIBUTE,
  'the `use_memory_efficient_trainer` argument as given (False, True or 2)',
  check=lambda v: v in (False, True, 2),
)
def memory_efficient_mode(loop: Any) -> Any:
  """The Loop's `use_memory_efficient_trainer` argument
  (`Loop._use_memory_efficient_trainer`), or None for another object."""
  return getattr(loop, '_use_memory_efficient_trainer', None)


@uses(
  LOOP,
  '_model',
  ATTRIBUTE,
  'the training model, a `tl.Layer` whose weights and state the '
  'trainer updates',
  check=lambda v: hasattr(v, 'weights'),
)
def model(loop: Any) -> Any:
  """The Loop's training model (`Loop._model`)."""
  return loop._model  # pylint: disable=protected-access


@uses(
  LOOP,
  '_eval_model',
  ATTRIBUTE,
  'the model `_init_evaluator` evaluates, a `tl.Layer`; the memory-'
  'efficient Loop sets it to the training model',
  check=lambda v: hasattr(v, 'weights'),
)
def eval_model(loop: Any) -> Any:
  """The model the Loop evaluates (`Loop._eval_model`)."""
  return loop._eval_model  # pylint: disable=protected-access


@uses(LOOP, '_eval_model', ATTRIBUTE, '')
def set_eval_model(loop: Any, eval_model_: Any) -> None:
  """Sets the model `_init_evaluator` evaluates (`Loop._eval_model`)."""
  loop._eval_model = eval_model_  # pylint: disable=protected-access


@uses(
  LOOP,
  '_callbacks',
  ATTRIBUTE,
  'the callback instances the Loop calls at each step, a list',
  check=lambda v: isinstance(v, list),
)
def callbacks(loop: Any) -> Sequence:
  """The Loop's callback instances (`Loop._callbacks`); () for another
  object."""
  return getattr(loop, '_callbacks', ())


@uses(
  LOOP,
  '_run_one_step',
  METHOD,
  'called once per training step with (task_index, task_changed), it '
  'returns (loss, stats); the Loop calls it through the instance',
  parameters=('task_index', 'task_changed'),
)
def wrap_run_one_step(
  loop: Any, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]
) -> None:
  """Has this Loop's steps run `wrap(found)`, where `found` is its
  `Loop._run_one_step` as bound now (an attribute of the instance: other
  Loops are left as they are)."""
  loop._run_one_step = wrap(loop._run_one_step)  # pylint: disable=protected-access


@uses(
  LOOP,
  '_init_trainer',
  METHOD,
  'called by `Loop.__init__` with (task) through the instance, it '
  "builds and returns the task's trainer",
  parameters=('task',),
)
def wrap_init_trainer(
  loop: Any, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]
) -> None:
  """Has this Loop build its trainers with `wrap(found)`, where `found` is
  its `Loop._init_trainer` as bound now (an attribute of the instance,
  until `unwrap_init_trainer`)."""
  loop._init_trainer = wrap(loop._init_trainer)  # pylint: disable=protected-access


@uses(LOOP, '_init_trainer', METHOD, '')
def unwrap_init_trainer(loop: Any) -> None:
  """Undoes `wrap_init_trainer`: the class's `_init_trainer` again."""
  del loop._init_trainer  # pylint: disable=protected-access


TRAINING = 'trax.supervised.training'


@uses(
  TRAINING,
  '_match_by_shape',
  FUNCTION,
  '`Loop.load_checkpoint` calls it by its module-level name with (the '
  "model's flat arrays, the checkpoint's) for the slots, the weights and "
  'the state; it returns the arrays to load and raises IndexError where '
  'the checkpoint holds arrays it could not place',
  parameters=('full', 'partial'),
)
@uses(
  TRAINING,
  '_log',
  FUNCTION,
  '`Loop.load_checkpoint` reports through it by its module-level name, '
  'printing on stdout unless stdout=False',
  parameters=('s', 'stdout'),
)
@contextlib.contextmanager
def checkpoint_loading_through(
  match_by_shape: Callable[[list, list], list],
) -> Iterator[None]:
  """Meanwhile, trax's `Loop.load_checkpoint` matches the checkpoint's
  arrays to the model's with `match_by_shape(full, partial)` instead of its
  `_match_by_shape`, and its report lines go to absl's log only (the
  caller says what happened, in its own lines)."""
  training: Any = trax_import.module('trax.supervised.training')
  saved = (training._match_by_shape, training._log)  # pylint: disable=protected-access
  stock_log = saved[1]

  def log_only(s, stdout=True):
    del stdout
    stock_log(s, stdout=False)

  training._match_by_shape = match_by_shape  # pylint: disable=protected-access
  training._log = log_only  # pylint: disable=protected-access
  try:
    yield
  finally:
    training._match_by_shape, training._log = saved  # pylint: disable=protected-access
