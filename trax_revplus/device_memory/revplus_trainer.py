"""The calls of one step of trax_revplus's `ReversibleSerialTrainer`.

The step's own walk (`trainer.units.Units.walk`) runs on argument types, as
compiling ahead does: `StepAccount` is `trainer.compilation.AheadOfTime`
that also notes, at each call, what the step holds on the device across it.
Each program's figures are the memory analysis of the very executable
compiled ahead for the step, so the accounted step and the step that runs
call the same programs with the same arguments.

Held across a call, per device, as the trainer keeps it on an accelerator:

  optimizer hyperparameters  placed once per step, for every layer
  step and RNGs              the step number and each layer's RNG
  stack                      the data stack between units
  cotangent stack            its cotangents, from the loss on
  saved block inputs and states
                             each standard layer's inputs and new state,
                             each reversible layer's old and new state
  weights placed ahead       the next unit's weights (and slots, backward)
  updates not yet copied back
                             results of calls whose copy to the host waits
                             (`n_async_layers`, the rule of
                             `trainer.commit.CommitQueue.push`)
  statistics                 each call's loss and gradient statistics
  kept activations           residuals a segment's forward keeps for its
                             backward (`store_activations`)

Host weights, slots and state count as device bytes where a call takes
them: the figures model an accelerator, where they are placed.
"""

import collections

import jax

from trax_revplus.device_memory import composition
from trax_revplus.device_memory import program as program_lib
from trax_revplus.trainer import commit as commit_lib
from trax_revplus.trainer import compilation
from trax_revplus.trainer import units as units_lib


def _fresh(tree):
  """A copy of `tree` with new abstract leaves (shape, dtype, sharding)."""
  def leaf(x):
    if isinstance(x, jax.ShapeDtypeStruct):
      return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding,
                                  weak_type=x.weak_type)
    return x
  return jax.tree_util.tree_map(leaf, tree)


def _array_leaves(tree):
  return [x for x in jax.tree_util.tree_leaves(tree)
          if hasattr(x, 'shape') and hasattr(x, 'dtype')]


# The rule lives with the queue it describes; the walk applies it too.
commit_waits = commit_lib.commit_waits


class _Noted:
  """One call as the walk met it: its program's key and what was held."""

  def __init__(self, name, phase, key, args, held):
    self.name = name
    self.phase = phase
    self.key = key
    self.args = args
    self.held = held  # list of (part name, array leaves)


class StepAccount(compilation.AheadOfTime):
  """Compiles a step ahead and notes what each of its calls holds.

  Use `step_memory(...)`; after `compile(walk)` (a complete walk),
  `memory()` composes the `composition.StepMemory`.
  """

  def __init__(self, placement, layers, optimizers, step_context,
               decide_backward, n_async_layers, programs=None):
    """Args:
      placement, layers, optimizers, step_context, decide_backward,
        programs: as `compilation.AheadOfTime`.
      n_async_layers: int, the trainer's `n_async_layers`.
    """
    super().__init__(placement, layers, optimizers, step_context,
                     decide_backward, programs)
    self._n_async_layers = n_async_layers
    self._layer_names = [layer.name for layer in layers]
    self._current = None  # (unit, phase) of the next call
    self._pending = collections.deque()  # (n layers, updates)
    self._stats = []
    self._noted = []

  # The walk on types, as compiling ahead runs it, with each call named.

  def prefetch(self, unit, with_slots):
    units_lib.Run.prefetch(self, unit, with_slots)

  def advance(self, unit, following, with_slots):
    self._current = (unit, 'backward' if with_slots else 'forward')
    return units_lib.Run.advance(self, unit, following, with_slots)

  def call(self, fn, args):
    unit, phase = self._current or (None, 'loss')
    self._current = None
    name = self._name(unit, phase)
    held = [
        ('optimizer hyperparameters', self.opt_params),
        ('step and RNGs', (self.step_placed, self.rngs)),
        ('stack', self.stack),
        ('cotangent stack', self.grad_stack),
        ('saved block inputs and states', self.saved),
        ('kept activations', self.kept),
        ('weights placed ahead', self.prefetched),
        ('updates not yet copied back', [u for _, u in self._pending]),
        ('statistics', self._stats),
    ]
    self._noted.append(_Noted(
        name, phase, self.call_key(fn, args), args,
        [(part, _array_leaves(tree)) for part, tree in held]))
    return _fresh(super().call(fn, args))

  def _name(self, unit, phase):
    if unit is None:
      i = len(self._layer_names) - 1  # the loss layer is the last
      return f'loss layer {i} ({self._layer_names[i]})'
    first, last = unit.layers[0], unit.layers[-1]
    if first == last:
      return f'{phase} layer {first} ({self._layer_names[first]})'
    return f'{phase} layers {first}..{last}'

  def updated(self, layers, weights, slots, states, stats):
    self._stats.extend(stats)
    self._pending.append((len(layers), (weights, slots, states)))
    keep = commit_waits([n for n, _ in self._pending], self._n_async_layers)
    while len(self._pending) > keep:
      self._pending.popleft()

  # The figures.

  def memory(self):
    """The step's `composition.StepMemory`.

    Raises:
      composition.UnsupportedTrainerError: the walk stopped before the
        step's end (a call's argument types are not known ahead, e.g. on
        several devices that wait for collectives), or a program did not
        compile.
    """
    if not self.complete:
      raise composition.UnsupportedTrainerError(
          "the step's calls cannot all be compiled ahead of it here (their "
          'argument types are not known without running it), so its device '
          'memory cannot be accounted.')
    analyses = {}
    calls = []
    for noted in self._noted:
      if noted.key not in analyses:
        traced, compiled = self.compiled(noted.key)
        if compiled is None:
          raise composition.UnsupportedTrainerError(
              f'the program of {noted.name} did not compile.')
        memory = program_lib.ProgramMemory.from_compiled(compiled)
        analyses[noted.key] = (memory, program_lib.kept_arguments(
            traced, noted.args, memory))
      memory, kept = analyses[noted.key]
      calls.append(composition.Call(
          noted.name, noted.phase, memory,
          _held_parts(noted.held, noted.args, kept)))
    return composition.compose(calls)


def _held_parts(held, args, kept):
  """`composition.Held` parts: each leaf counted once (in the first part
  listing it), the arguments the program keeps counted as passed."""
  arg_leaves = jax.tree_util.tree_leaves(args)
  flags = ([True] * len(arg_leaves) if kept is None
           else jax.tree_util.tree_leaves(kept))
  passed_ids = {id(x) for x, k in zip(arg_leaves, flags) if k}
  parts, seen = [], set()
  for name, leaves in held:
    leaves = [x for x in leaves if id(x) not in seen]
    seen.update(id(x) for x in leaves)
    size = sum(program_lib.leaf_bytes(x) for x in leaves)
    passed = sum(program_lib.leaf_bytes(x) for x in leaves
                 if id(x) in passed_ids)
    if size:
      parts.append(composition.Held(name, size, passed))
  return parts


def step_memory(placement, store, units, n_async_layers, step_context,
                programs=None):
  """Compiles a step of `units` ahead and composes its device memory.

  Args:
    placement: the trainer's `placement.Placement`.
    store: the trainer's `trainer.store.LayerStore`.
    units: the `trainer.units.Units` the step walks (its backward splits
      are decided on the way, as the first step decides them).
    n_async_layers: int, the trainer's `n_async_layers`.
    step_context: a `units.Run` with the step's placed batch (`stack`),
      RNGs, optimizer hyperparameters and step.
    programs: `trainer.compilation.Programs` shared between walks, or None.

  Returns:
    `composition.StepMemory` of the step.

  Raises:
    composition.UnsupportedTrainerError: see `StepAccount.memory`.
  """
  account = StepAccount(placement, store.layers, store.optimizers,
                        step_context, units.decide_backward, n_async_layers,
                        programs=programs)
  account.compile(units.walk)
  return account.memory()


def revplus_trainer_step(trainer, batch, rng=None, step=1):
  """The `composition.StepMemory` of one step of a trax_revplus
  `ReversibleSerialTrainer` on `batch`, without running it.

  Args:
    trainer: the trainer (its settings and plan; with a device memory
      budget, the plan that budget chooses for `batch`'s shapes).
    batch: tuple of host arrays as `one_step` takes them (their values are
      not read by the programs, only placed).
    rng: JAX PRNG key, or None (a fixed one).
    step: int, the step number.

  Returns:
    `composition.StepMemory`.

  Raises:
    composition.UnsupportedTrainerError: see `StepAccount.memory`.
  """
  return trainer.device_memory_of(batch, rng=rng, step=step)
