"""Device memory of a step of trax's default `trax.optimizers.Trainer`.

The default Trainer runs a whole step as one program: trax's
`_accelerate_update_fn` (forward, backward and optimizer update of
`model_with_loss`), `jax.jit`-ed on one device. Its weights, state,
optimizer slots and hyperparameters stay on the device between steps and
are arguments of that program; the batch and RNG are placed for it. This
module lowers the Trainer's own update function with the argument types
`Trainer.one_step` passes it and composes the step's figure
(`composition`).

One device only: on more, trax replicates with `jax.device_put_replicated`
and `jax.pmap`s arrays committed to the CPU, which current JAX removed or
rejects: with trax_revplus active (whose `compat` stands in for the
first) its first step on 2 devices still fails ("ValueError: Sharding
passed to jit does not match the sharding on the respective arg").
"""

from typing import TYPE_CHECKING

import jax
import numpy as np

from trax_revplus.device_memory import composition
from trax_revplus.device_memory import program as program_lib
from trax_revplus.device_memory import programs as programs_lib
from trax_revplus.device_memory import refusals
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
  the call.

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
  n = trainer_door.n_devices(trainer)
  if n != 1:
    raise composition.UnsupportedTrainerError(
      f'trax Trainer with n_devices={n}: its multi-device step needs '
      f'jax.device_put_replicated and jax.pmap of arrays committed to the '
      f'CPU, which current JAX removed or rejects; accounted on one device '
      f'only.'
    )
  args = update_call_args(trainer, batch, rng, step)
  fn = trainer_door.default_trainer_update_fn(trainer)
  name = 'update (forward, backward, optimizer)'
  programs = programs_lib.Programs()
  try:
    analysis = programs.analysis(programs.analyzed(fn, args), args)
  except refusals.ProgramCompileError as e:
    raise e.named(name) from None
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
    name,
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
