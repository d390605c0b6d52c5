"""Device memory of a step of trax's default `trax.optimizers.Trainer`.

The default Trainer runs a whole step as one program: trax's
`_accelerate_update_fn` (forward, backward and optimizer update of
`model_with_loss`), `jax.jit`-ed on one device and `jax.pmap`-ed on more.
Its weights, state, optimizer slots and hyperparameters stay on the
device between steps and are arguments of that program; the batch and RNG
are placed for it. This module lowers the Trainer's own update function
with the argument types `Trainer.one_step` passes it and composes the
step's figure (`composition`).
"""

from typing import Any

import jax
import numpy as np

from trax_revplus.device_memory import composition
from trax_revplus.device_memory import program as program_lib

PyTree = Any


def _pmapped_update_fn(trainer):
  """The `jax.pmap`-ed function inside trax's multi-device update wrapper
  (`_accelerate_update_fn`), which repeats `step` over devices first."""
  wrapper = trainer._accelerated_update_fn  # pylint: disable=protected-access
  for cell in wrapper.__closure__ or ():
    fn = cell.cell_contents
    if hasattr(fn, 'lower'):
      return fn
  raise ValueError('trax Trainer: no pmap-ed update function found in '
                   '_accelerated_update_fn.')


def update_call_args(trainer, batch, rng=None, step=1) -> tuple:
  """The (abstract) arguments `trainer.one_step(batch, rng, step)` passes
  its compiled update function.

  Args:
    trainer: a `trax.optimizers.Trainer`.
    batch: tuple of arrays or `jax.ShapeDtypeStruct`s of shape (B, ...).
    rng: JAX PRNG key (uint32[2]) or None (an abstract one).
    step: int, the step number (a traced scalar, its value is not used).

  Returns:
    Tuple `((weights, slots), step, opt_params, batch, state, rng)` with
    `jax.ShapeDtypeStruct` array leaves; on N > 1 devices with the leading
    device axis trax's `one_step` gives them.
  """
  n = trainer._n_devices  # pylint: disable=protected-access
  model = trainer.accelerated_model_with_loss
  weights, state = model.weights, model.state
  slots = trainer._slots  # pylint: disable=protected-access
  opt_params = trainer._opt_params  # pylint: disable=protected-access
  batch = program_lib.abstract(batch)
  if rng is None:
    rng = jax.ShapeDtypeStruct((2,), np.uint32)
  if n > 1:
    def by_device(x):
      b = x.shape[0]
      if b % n:
        raise ValueError(f'{n} devices do not divide the batch size {b}.')
      return jax.ShapeDtypeStruct((n, b // n) + tuple(x.shape[1:]), x.dtype)
    batch = jax.tree_util.tree_map(by_device, batch)
    rng = jax.ShapeDtypeStruct((n, 2), np.uint32)
    step = jax.ShapeDtypeStruct((n,), np.int32)
  return ((program_lib.abstract(weights), program_lib.abstract(slots)),
          step, program_lib.abstract(opt_params), batch,
          program_lib.abstract(state), program_lib.abstract(rng))


def default_trainer_step(trainer, batch, rng=None, step=1
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
    rng: JAX PRNG key or None.
    step: int.

  Returns:
    `composition.StepMemory` with one call, phase 'step'.

  Raises:
    Whatever tracing, lowering or compiling trax's update function raises
    for these arguments (e.g. a batch the model cannot take).
  """
  args = update_call_args(trainer, batch, rng, step)
  if trainer._n_devices > 1:  # pylint: disable=protected-access
    fn = _pmapped_update_fn(trainer)
  else:
    fn = trainer._accelerated_update_fn  # pylint: disable=protected-access
  analysis = program_lib.analyze(fn, *args)
  kept = analysis.kept
  if kept is None:
    kept = jax.tree_util.tree_map(lambda _: True, args)
  (weights, slots), _, opt_params, _, state, _ = args
  (kept_w, kept_s), _, kept_p, _, kept_st, _ = kept
  n = trainer._n_devices  # pylint: disable=protected-access
  held = []
  for name, tree, k in (('weights', weights, kept_w), ('slots', slots, kept_s),
                        ('state', state, kept_st),
                        ('optimizer hyperparameters', opt_params, kept_p)):
    size = program_lib.tree_bytes(tree)
    passed = program_lib.tree_bytes(tree, k)
    # Per device: on N > 1 devices the leading axis is the devices'.
    held.append(composition.Held(name, size // n, passed // n))
  call = composition.Call('update (forward, backward, optimizer)', 'step',
                          analysis.memory, held)
  return composition.compose([call])


def weights_and_slots_bytes(trainer) -> tuple:
  """(weights bytes, slots bytes) of the model and optimizer, one copy."""
  weights = trainer.model_with_loss.weights
  slots = trainer.optimizer.slots
  return program_lib.tree_bytes(weights), program_lib.tree_bytes(slots)

