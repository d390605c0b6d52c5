"""Replays a trainer's step with abstract arrays, recording its calls.

Used by the per-trainer accounting modules: the schedule they mirror says
which jitted function each call runs, with which arguments, and which
values stay on the device across it; `StepWalk` compiles each distinct
program once (`program.analyze`) and turns the held values into named
`composition.Held` parts.
"""

import jax

from trax_revplus.device_memory import composition
from trax_revplus.device_memory import program as program_lib


def _leaves(tree):
  return jax.tree_util.tree_leaves(tree)


class StepWalk:
  """Records a step's calls with abstract arrays, and what the device holds
  across each.

  A trainer's schedule is replayed with `jax.ShapeDtypeStruct`s in place of
  arrays. `device(tree)` marks values as resident on the device (placed
  arrays, call results); `call(...)` compiles a jitted function for its
  arguments, records a `composition.Call` whose held parts are the device
  leaves of the named trees given, each counted once (the first part that
  lists a leaf gets it), with the arguments the program keeps counted as
  passed, and returns the results as new device values. Analyses are
  memoized by (function, argument types).

  Attributes:
    calls: list of `composition.Call`, in the order recorded.
  """

  def __init__(self):
    self.calls = []
    self.on_device = set()  # ids of abstract leaves resident on the device
    # (id(fn), argument types) -> Analysis: trainers share one jitted
    # function between equal layers, so repeated layers compile once.
    self._analyses = {}

  def device(self, tree):
    """Marks the leaves of `tree` as device arrays; returns `tree`."""
    self.on_device.update(id(x) for x in _leaves(tree))
    return tree

  def host(self, tree):
    """A copy of `tree` with new abstract leaves, not on the device."""
    return jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(
            x.shape, x.dtype, weak_type=getattr(x, 'weak_type', False))
        if hasattr(x, 'shape') else x, tree)

  def call(self, name, phase, fn, args, held):
    """Records one call of jitted `fn` with `args`.

    Args:
      name, phase: as `composition.Call`.
      fn: the jitted function the step calls.
      args: tuple of its positional arguments (abstract or concrete).
      held: list of (part name, pytree) on the device across the call; only
        leaves marked by `device` count.

    Returns:
      The call's results (`jax.ShapeDtypeStruct`s, new objects), marked as
      device values.
    """
    key = (id(fn), program_lib.types_key(args))
    if key not in self._analyses:
      self._analyses[key] = program_lib.analyze(fn, *args)
    analysis = self._analyses[key]
    parts = composition.held_parts(
        held, args, analysis.kept,
        on_device=lambda x: id(x) in self.on_device)
    self.calls.append(composition.Call(name, phase, analysis.memory, parts))
    return self.device(self.host(analysis.outputs))  # new leaves per call
