"""`StepInputs`: what each training step was handed, to say why it compiled.

JAX compiles a jitted function again when its arguments differ from every
earlier call's in shape or dtype (e.g. a new input length), and also when
they are placed differently: a host numpy array (uncommitted) and an array
committed to a device compile to separate programs although their shapes
and dtypes are equal. trax's trainers hit the second case at step 2 on a
machine without an accelerator: the default `Trainer` gets its weights and
slots partly uncommitted (host numpy or uncommitted JAX arrays, as the
Loop initialized them) at step 1 and as its own committed outputs from
step 2 on; stock trax's `ReversibleSerialTrainer` gets them as the
committed arrays its initializers returned at step 1 and as the host numpy
copies it makes after each update (`np.asarray`) from step 2 on.

A layer's state that changes shape between steps compiles again too:
trax's `ConcatWithPadding` layers (in every `ConfigurableTerraformer`)
initialize an int32 scalar and return it with shape (1,), so trax's default
`Trainer` and stock's `ReversibleSerialTrainer` compile again at step 2
(trax_revplus's trainer keeps each state leaf's shape, `state_shapes`).

`StepInputs` records per step the batch's shapes and dtypes (observed on
the Loop's training tasks' `next_batch`), how the trainer's weights and
optimizer slots are placed, and the shapes and dtypes of its layers'
state when the step begins, so that a step that compiles can be explained
by what changed since the step before, rather than by a guess.
"""

from typing import Any, Callable

import jax
import numpy as np
from trax import fastmath

from trax_revplus import state_shapes
from trax_revplus.trax_door import loop as loop_door
from trax_revplus.trax_door import trainers as trainer_door


def batch_signature(batch: Any) -> tuple[str, ...]:
  """The batch's arrays as 'dtype[shape]' strings, e.g. ('int32[8, 256]',)."""
  return tuple(
    f'{np.dtype(x.dtype).name}{list(np.shape(x))}'
    for x in jax.tree_util.tree_leaves(batch)
  )


def _placement_of_leaf(x: Any) -> str | None:
  if isinstance(x, jax.Array):
    if x.committed:
      return 'arrays committed to a device'
    return 'uncommitted JAX arrays'
  if isinstance(x, (np.ndarray, np.generic)):
    return 'host numpy arrays'
  return None


def placement(tree: Any) -> str | None:
  """How the array leaves of `tree` are placed, in words: 'host numpy
  arrays', 'arrays committed to a device', 'uncommitted JAX arrays', or
  those joined by ' and ' where they are mixed; None without arrays."""
  kinds = {_placement_of_leaf(x) for x in jax.tree_util.tree_leaves(tree)}
  return ' and '.join(sorted(k for k in kinds if k is not None)) or None


def trainer_arrays(trainer: Any) -> Any:
  """The weights and optimizer slots `trainer` passes its compiled step
  programs: trax's default `Trainer`'s accelerated model weights and
  slots, a memory-efficient trainer's layers' weights; None for another
  trainer."""
  if hasattr(trainer, 'accelerated_model_with_loss'):  # trax's Trainer
    return (
      trainer.accelerated_model_with_loss.weights,
      trainer_door.default_trainer_slots(trainer),
    )
  layers = getattr(trainer, 'all_layers', None)
  if layers is not None:
    return [layer.weights for layer in layers]
  return None


def _trainer_state(trainer: Any) -> tuple[Any, Any] | None:
  """(layer or layers, state) of what `trainer` hands its step programs:
  trax's default `Trainer`'s model and its state, a memory-efficient
  trainer's layers and their states; None for another trainer."""
  if hasattr(trainer, 'accelerated_model_with_loss'):  # trax's Trainer
    model = trainer.accelerated_model_with_loss
    return model, model.state
  layers = getattr(trainer, 'all_layers', None)
  if layers is None:
    return None
  layers = list(layers)
  return layers, [layer.state for layer in layers]


def state_signature(trainer: Any) -> list[str] | None:
  """'dtype[shape]' of each leaf of the state `trainer` hands its step
  programs (`_trainer_state`), in trax's flat order; None for another
  trainer."""
  found = _trainer_state(trainer)
  if found is None:
    return None
  return [state_shapes.signature(x) for x in fastmath.tree_flatten(found[1])]


def _state_change(
  trainer: Any, now: list[str], before: list[str], prev: int
) -> str | None:
  """'the state of NAME is SIG now and was SIG at step PREV' for the first
  leaf that changed, named by the layer holding it in `trainer`, with a
  count of the others; None where none did."""
  if len(now) != len(before):
    return (
      f'the state has {len(now)} arrays now and had {len(before)} at step '
      f'{prev}'
    )
  changed = [k for k, (sig, old) in enumerate(zip(now, before)) if sig != old]
  if not changed:
    return None
  # Named only now: naming walks the model, and a step compiles rarely.
  found = _trainer_state(trainer)
  if found is None:
    return f'a state array changed at step {prev}'
  names = [name for name, _ in state_shapes.named_leaves(*found)]
  k = changed[0]
  more = len(changed) - 1
  others = (
    f' (and {more} more state array{"s" if more > 1 else ""})' if more else ''
  )
  return (
    f'the state of {names[k]} is {now[k]} now and was {before[k]} at step '
    f'{prev}{others}'
  )


class StepInputs:
  """Batch signature and weight placement of each step of one Loop."""

  def __init__(self, loop: Any):
    """Observes `loop`'s training tasks' batches (their `next_batch`; the
    batches are handed on unchanged)."""
    self._loop = loop
    self._records: dict[int, dict[str, Any]] = {}
    self._step: int | None = None
    # The last training batch's `jax.ShapeDtypeStruct`s (`last_batch`).
    self.last_batch: Any = None
    for task in loop_door.tasks(loop):
      if hasattr(task, 'next_batch'):
        task.next_batch = self._observed(task.next_batch)

  def _observed(self, next_batch: Callable[[], Any]) -> Callable[[], Any]:
    def observed() -> Any:
      batch = next_batch()
      self.last_batch = jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(np.shape(x), np.dtype(x.dtype)), batch
      )
      if self._step is not None:
        self._records[self._step]['batch'] = batch_signature(batch)
      return batch

    return observed

  def begin(self, step: int) -> None:
    """Records the trainer's weight placement as `step` begins."""
    trainers = loop_door.trainers(self._loop) or (None,)
    arrays = trainer_arrays(trainers[0])
    self._records[step] = {
      'batch': None,
      'placement': None if arrays is None else placement(arrays),
      'state': state_signature(trainers[0]),
    }
    self._step = step
    for old in [s for s in self._records if s < step - 1]:
      del self._records[old]  # Only the step before is compared.

  def cause(self, step: int) -> str | None:
    """Why `step` compiled, from what changed since the step before it:
    one clause, or None where there is no step before to compare with."""
    now, before = self._records.get(step), self._records.get(step - 1)
    if now is None or before is None or now['batch'] is None:
      return None
    prev = step - 1
    if now['batch'] != before['batch']:
      return (
        f'the batch has new shapes or dtypes '
        f'({", ".join(now["batch"])}; step {prev}: '
        f'{", ".join(before["batch"] or ("?",))})'
      )
    same = f'same batch shapes as step {prev}'
    if now['state'] is not None and before['state'] is not None:
      trainers = loop_door.trainers(self._loop)
      change = _state_change(trainers[0], now['state'], before['state'], prev)
      if change is not None:
        return (
          f'{same}, but {change}: a layer returned its state in another '
          f'shape than it was handed'
        )
    if (
      now['placement'] is not None
      and before['placement'] is not None
      and now['placement'] != before['placement']
    ):
      return (
        f'{same}, but the trainer handed its weights over as '
        f'{before["placement"]} at step {prev} and as '
        f'{now["placement"]} now, and JAX compiles a separate program '
        f'for each placement'
      )
    return f'{same}; the weights placed and the state shaped as then'
