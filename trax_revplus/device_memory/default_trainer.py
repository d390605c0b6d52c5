"""Device memory of a step of trax's default `trax.optimizers.Trainer`.

The default Trainer runs a whole step as one program: trax's
`_accelerate_update_fn` (forward, backward and optimizer update of
`model_with_loss`), `jax.jit`-ed on one device. Its weights, state,
optimizer slots and hyperparameters stay on the device between steps and
are arguments of that program; the batch and RNG are placed for it. This
module lowers the Trainer's own update function with the argument types
`Trainer.one_step` passes it and composes the step's figure
(`composition`).

`start_default_trainer_step` traces that program on the calling thread and
starts its compilation on the compile threads (`compile_threads`: XLA
compiles without the GIL), so that other work goes on while it compiles;
the next `default_trainer_step` of the same trainer and argument types
composes the step from it (the same program, the same figures).

One device only: on more, trax replicates with `jax.device_put_replicated`
and `jax.pmap`s arrays committed to the CPU, which current JAX removed or
rejects: with trax_revplus active (whose `compat` stands in for the
first) its first step on 2 devices still fails ("ValueError: Sharding
passed to jit does not match the sharding on the respective arg").
"""

from typing import TYPE_CHECKING, Hashable

import jax
import numpy as np

from trax_revplus.device_memory import composition
from trax_revplus.device_memory import program as program_lib
from trax_revplus.device_memory import programs as programs_lib
from trax_revplus.device_memory import refusals
from trax_revplus.device_memory import started_steps
from trax_revplus.trax_door import trainers as trainer_door
from trax_revplus.typing import PRNGKey
from trax_revplus.typing import PyTree

if TYPE_CHECKING:  # Annotations only: accounting does not import trax.
  from trax import optimizers as trax_optimizers


def update_call_args(
  trainer: 'trax_optimizers.Trainer',
  batch: PyTree,
  rng: PRNGKey | jax.ShapeDtypeStruct | None = None,
  step: int = 1,
) -> tuple:
  """The (abstract) arguments `trainer.one_step(batch, rng, step)` passes
  its compiled update function on one device.

  Args:
    trainer: a `trax.optimizers.Trainer` on one device.
    batch: tuple of arrays or `jax.ShapeDtypeStruct`s of shape (B, ...).
    rng: JAX PRNG key (uint32[2]) or its `jax.ShapeDtypeStruct`, or None
      (an abstract one).
    step: int, the step number (a traced scalar, its value is not used).

  Returns:
    Tuple `((weights, slots), step, opt_params, batch, state, rng)` with
    `jax.ShapeDtypeStruct` array leaves.
  """
  model = trainer.accelerated_model_with_loss
  if rng is None:
    rng = jax.ShapeDtypeStruct((2,), np.uint32)
  return (
    (
      program_lib.abstract(model.weights),
      program_lib.abstract(trainer_door.default_trainer_slots(trainer)),
    ),
    step,
    program_lib.abstract(trainer_door.default_trainer_opt_params(trainer)),
    program_lib.abstract(batch),
    program_lib.abstract(model.state),
    program_lib.abstract(rng),
  )


def _check_one_device(trainer: 'trax_optimizers.Trainer') -> None:
  n = trainer_door.n_devices(trainer)
  if n != 1:
    raise composition.UnsupportedTrainerError(
      f'trax Trainer with n_devices={n}: its multi-device step needs '
      f'jax.device_put_replicated and jax.pmap of arrays committed to the '
      f'CPU, which current JAX removed or rejects; accounted on one device '
      f'only.'
    )


_NAME = 'update (forward, backward, optimizer)'

# Steps whose program `start_default_trainer_step` traced, by trainer.
_started = started_steps.StartedSteps()


def _traced(
  trainer: 'trax_optimizers.Trainer',
  batch: PyTree,
  rng: PRNGKey | jax.ShapeDtypeStruct | None,
  step: int,
  ahead: bool,
) -> tuple[programs_lib.Programs, started_steps.Compose]:
  """Traces the step's program now (where `ahead`, its compilation runs on
  the compile threads meanwhile); returns (the `Programs` it compiles in,
  the function that compiles it where not started and composes the
  step)."""
  _check_one_device(trainer)
  args = update_call_args(trainer, batch, rng, step)
  fn = trainer_door.default_trainer_update_fn(trainer)
  programs = programs_lib.Programs()
  key: Hashable | None = None
  if ahead and hasattr(fn, 'trace'):
    # Traced here (trax layers hold their weights while traced: one thread
    # at a time), lowered and compiled on a compile thread.
    key = programs_lib.call_key(fn, args)
    programs.add_traced(key, fn, fn.trace(*args), args)
    programs.compile([key])

  def compose() -> composition.StepMemory:
    try:
      analysis = programs.analysis(
        programs.analyzed(fn, args) if key is None else key, args
      )
    except refusals.ProgramCompileError as e:
      raise e.named(_NAME) from None
    return _composed(analysis, args, batch)

  return programs, compose


def start_default_trainer_step(
  trainer: 'trax_optimizers.Trainer',
  batch: PyTree,
  rng: PRNGKey | jax.ShapeDtypeStruct | None = None,
  step: int = 1,
) -> programs_lib.Programs:
  """Traces the program `trainer.one_step` runs, here, and starts its
  compilation on the compile threads; returns at once. The next
  `default_trainer_step` of `trainer` with the same arguments composes
  the step from that program.

  Returns:
    The `programs.Programs` it compiles in (its `compile_spans` time it).

  Raises:
    As `default_trainer_step` before compiling: UnsupportedTrainerError,
    whatever tracing raises.
  """
  programs, compose = _traced(trainer, batch, rng, step, ahead=True)
  _started.start(trainer, batch, (rng, step), compose)
  return programs


def default_trainer_step(
  trainer: 'trax_optimizers.Trainer',
  batch: PyTree,
  rng: PRNGKey | jax.ShapeDtypeStruct | None = None,
  step: int = 1,
) -> composition.StepMemory:
  """Composes the device memory of one step of trax's default Trainer.

  Lowers and compiles the program `trainer.one_step` runs (nothing is
  placed or run) and holds across it what the Trainer keeps on the device
  between steps: its weights, state, slots and optimizer hyperparameters,
  which are also the program's arguments; the batch and RNG are placed for
  the call. Where `start_default_trainer_step` started this step (the same
  trainer and arguments), composes it from that program.

  Args:
    trainer: a `trax.optimizers.Trainer`, built (its weights and slots
      initialized).
    batch: tuple of arrays or `jax.ShapeDtypeStruct`s of shape (B, ...), as
      `one_step` would get it.
    rng: JAX PRNG key or its `jax.ShapeDtypeStruct`, or None.
    step: int.

  Returns:
    `composition.StepMemory` with one call, phase 'step'.

  Raises:
    composition.UnsupportedTrainerError: the trainer runs on more than one
      device.
    refusals.ProgramCompileError: the backend did not compile trax's
      update function (`refusals.ProgramOutOfMemoryError`: refused it for
      memory: the step does not fit this device).
    Whatever tracing or lowering it raises for these arguments (e.g. a
    batch the model cannot take).
  """
  compose = _started.take(trainer, batch, (rng, step))
  if compose is not None:
    return compose()
  return _traced(trainer, batch, rng, step, ahead=False)[1]()


def _composed(
  analysis: program_lib.Analysis, args: tuple, batch: PyTree
) -> composition.StepMemory:
  """The step's `StepMemory` from its program's analysis."""
  kept = analysis.kept
  if kept is None:
    kept = jax.tree_util.tree_map(lambda _: True, args)
  (weights, slots), _, opt_params, _, state, _ = args
  (kept_w, kept_s), _, kept_p, _, kept_st, _ = kept
  held = []
  for name, tree, k in (
    ('weights', weights, kept_w),
    ('slots', slots, kept_s),
    ('state', state, kept_st),
    ('optimizer hyperparameters', opt_params, kept_p),
  ):
    held.append(
      composition.Held(
        name, program_lib.tree_bytes(tree), program_lib.tree_bytes(tree, k)
      )
    )
  # The host holds the batch; where the device is the host's memory (CPU),
  # the device's buffers too.
  host_held = composition.held_parts(
    [('batch', program_lib.host_types(batch))], (), whole=True
  )
  call = composition.Call(
    _NAME,
    'step',
    analysis.memory,
    tuple(held),
    tuple(host_held),
    composition.devices_on_host(jax.default_backend(), 1),
  )
  return composition.compose([call])


def weights_and_slots_bytes(
  trainer: 'trax_optimizers.Trainer',
) -> tuple[int, int]:
  """(weights bytes, slots bytes) of the model and optimizer, one copy."""
  weights = trainer.model_with_loss.weights
  slots = trainer.optimizer.slots
  return program_lib.tree_bytes(weights), program_lib.tree_bytes(slots)
