"""Steps of trax's trainers traced ahead, kept until their accounting.

`default_trainer.start_default_trainer_step` and
`stock_trainer.start_stock_trainer_step` trace a trainer's step and start
its programs' compilation on the compile threads (`estimate` overlaps them
with trax_revplus's planning); the next accounting of that trainer's step
with the same arguments takes the function composing it from here rather
than tracing the step again. One `StartedSteps` per kind of trainer; a
trainer collected is forgotten with its step.
"""

from typing import Any, Callable, Hashable
import weakref

from trax_revplus.device_memory import composition
from trax_revplus.device_memory import program as program_lib
from trax_revplus.typing import PyTree

# Composes a started step's `composition.StepMemory` (compiling what is not
# compiled yet).
Compose = Callable[[], composition.StepMemory]


def _key(batch: PyTree, others: tuple) -> Hashable:
  """The step's arguments as a key: the batch's types, the others as
  given."""
  return program_lib.types_key((program_lib.abstract(batch),) + others)


class StartedSteps:
  """The one step started ahead per trainer, and the arguments it was
  started for."""

  def __init__(self) -> None:
    self._started: 'weakref.WeakKeyDictionary[Any, tuple[Hashable, Compose]]'
    self._started = weakref.WeakKeyDictionary()

  def __len__(self) -> int:
    """How many steps wait to be taken."""
    return len(self._started)

  def start(
    self, trainer: Any, batch: PyTree, others: tuple, compose: Compose
  ) -> None:
    """`trainer`'s step on `batch` (arrays or their types) and `others`
    (hashable: RNG types, step number) is started; `compose` composes it."""
    self._started[trainer] = (_key(batch, others), compose)

  def take(self, trainer: Any, batch: PyTree, others: tuple) -> Compose | None:
    """The `compose` of `trainer`'s step started for these arguments, taken
    out (a trainer's started step is taken once, whatever its arguments);
    None where none was started for them."""
    started = self._started.pop(trainer, None)
    if started is not None and started[0] == _key(batch, others):
      return started[1]
    return None
