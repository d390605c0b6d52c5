"""The Loop's random key across restarts, so dropout resumes exactly.

trax's `Loop` splits its RNG once per step (`Loop.new_rng`) and, after a
restart, starts again from the seed, so a resumed run's dropout masks
differ from an uninterrupted run's. A checkpoint set keeps the key its next
step will find, and the load restores it.
"""

from typing import Any

import numpy as np

from trax import fastmath
from trax import layers as tl
from trax.fastmath import numpy as jnp
from trax.supervised import training

from trax_revplus.checkpoints import pending_evals
from trax_revplus.trax_door import loop as loop_door


def rng_at_next_step(loop: training.Loop) -> Any:
  """The Loop's RNG as a run without restart has it when its next step begins.

  A run resumed from this checkpoint starts with the next step, so the keys
  the evals of this step would still take (`pending_evals`) are taken here,
  as `Loop.new_rng` takes them, for dropout after a restart to be what it
  would have been without one.

  Returns:
    The PRNG key (uint32[2]), or None if the Loop has none.
  """
  rng = loop_door.rng(loop)
  if rng is None:
    return None
  for _ in range(pending_evals.batches(loop)):
    rng, _ = fastmath.random.split(rng)
  return rng


def as_json(loop: training.Loop) -> list[int] | None:
  """`rng_at_next_step` as a manifest keeps it: a list of uint32, or None."""
  rng = rng_at_next_step(loop)
  return None if rng is None else np.asarray(rng).astype(np.uint32).tolist()


def restore(loop: training.Loop, rng: list[int]) -> None:
  """Sets the Loop's RNG to a key a manifest kept (`as_json`)."""
  key = jnp.asarray(np.asarray(rng, dtype=np.uint32))
  # As `Loop.new_rng` keeps it: in host memory for the memory-efficient
  # trainer.
  if loop_door.memory_efficient_mode(loop):
    key = tl.on_cpu(key)
  loop_door.set_rng(loop, key)
