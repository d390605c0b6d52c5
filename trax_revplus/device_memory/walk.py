"""A step's calls on abstract arrays: its programs, once each, and its figure.

Every accounting of a step, trax_revplus's own (`trainer.ahead`) and the
replays of other trainers' schedules (`stock_trainer`), goes through the
two classes here:

  `Programs`: the programs compiled for calls, by call key (`call_key`:
    the function's id and the argument types), with their result types and
    XLA's memory analysis (`program.Analysis`), each read once. A call key
    seen again (equal layers share one jitted function; walks of several
    plans share programs) compiles nothing.
  `StepWalk`: the calls of one step in order, each with what the device
    holds across it; `memory()` composes the step's `composition.StepMemory`.
"""

import concurrent.futures
from typing import Callable, Hashable, NamedTuple

import jax

from trax_revplus.device_memory import composition
from trax_revplus.device_memory import program as program_lib
from trax_revplus.typing import PyTree


def call_key(fn: Callable, args: PyTree) -> Hashable:
  """The key of a call of `fn` with `args`: equal for calls that run one
  program (the function's id, `program.types_key` of the arguments)."""
  return (id(fn), program_lib.types_key(args))


class Programs:
  """Programs compiled for calls, by `call_key`.

  A program is added either compiled and analyzed at once (`analyzed`), or
  traced with its compilation under way elsewhere (`add_traced`, a future
  of the `jax.stages.Compiled`, None where compiling failed); its memory
  analysis is read once, when first asked for (`analysis`).
  """

  def __init__(self):
    self._outputs = {}  # key -> result types
    self._compiled = {}  # key -> future of jax.stages.Compiled or None
    # key -> the function, kept alive so that its id in the key is not
    # reused by another.
    self._functions = {}
    self._analyses = {}  # key -> program.Analysis

  def __contains__(self, key: Hashable) -> bool:
    return key in self._outputs

  def add_traced(self, key: Hashable, fn: Callable,
                 traced: jax.stages.Traced,
                 compiled: concurrent.futures.Future) -> None:
    """Adds the program of `key`: `fn` traced for the call, and the future
    of its `jax.stages.Compiled` (None where compiling failed)."""
    self._outputs[key] = traced.out_info
    self._functions[key] = fn
    self._compiled[key] = compiled

  def analyzed(self, fn: Callable, args: tuple) -> Hashable:
    """The key of a call of `fn` with `args`, its program compiled and
    analyzed now where it is not yet (`program.analyze`).

    Raises:
      Whatever tracing, lowering or compiling `fn` raises for `args`;
      ValueError where the backend gives no memory analysis.
    """
    key = call_key(fn, args)
    if key not in self:
      analysis = program_lib.analyze(fn, *args)
      self._outputs[key] = analysis.outputs
      self._functions[key] = fn
      self._analyses[key] = analysis
    return key

  def outputs(self, key: Hashable) -> PyTree:
    """The result types of the program of `key` (`jax.ShapeDtypeStruct`s,
    as traced: the same objects each time)."""
    return self._outputs[key]

  def wait(self) -> None:
    """Waits for every compilation under way."""
    concurrent.futures.wait(list(self._compiled.values()))

  def analysis(self, key: Hashable, args: tuple) -> program_lib.Analysis:
    """The `program.Analysis` of the program of `key`; `args` are a call's
    arguments (for which ones the program keeps), read on the first ask.

    Raises:
      composition.UnsupportedTrainerError: the program did not compile.
      ValueError: the backend gives no memory analysis.
    """
    if key not in self._analyses:
      compiled = self._compiled[key].result()
      if compiled is None:
        raise composition.UnsupportedTrainerError(
            'a program of the step did not compile.')
      memory = program_lib.ProgramMemory.from_compiled(compiled)
      self._analyses[key] = program_lib.Analysis(
          memory, self._outputs[key],
          program_lib.kept_arguments(compiled, args, memory))
    return self._analyses[key]


class _Noted(NamedTuple):
  """One call as a walk met it."""
  name: str
  phase: str
  key: Hashable
  args: tuple
  held: list  # (part name, list of leaves) on the device across the call


def _leaves(tree: PyTree) -> list:
  return jax.tree_util.tree_leaves(tree)


class StepWalk:
  """A step's calls with abstract arrays, and what the device holds across
  each.

  A trainer's schedule is walked with `jax.ShapeDtypeStruct`s in place of
  arrays. `note(...)` records a call whose program is in `programs`, with
  the held trees' leaves as they are then. Replays of other trainers' steps
  use `call(...)`, which compiles the program, notes the call with only the
  leaves marked as on the device (`device(tree)`: placed arrays, call
  results) held, and returns its results as new device values. `memory()`
  composes the held parts of each call (each leaf counted once, in the
  first part listing it; the arguments its program keeps counted as
  passed) with the call's program.

  Attributes:
    programs: the `Programs` the calls run (shared where given).
    on_device: set of the ids of the abstract leaves marked as on the
      device.
  """

  def __init__(self, programs: Programs | None = None):
    self.programs = Programs() if programs is None else programs
    self.on_device = set()
    self._noted = []

  def device(self, tree: PyTree) -> PyTree:
    """Marks the leaves of `tree` as device arrays; returns `tree`."""
    self.on_device.update(id(x) for x in _leaves(tree))
    return tree

  def host(self, tree: PyTree) -> PyTree:
    """A copy of `tree` with new abstract leaves, not on the device."""
    return jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(
            x.shape, x.dtype, weak_type=getattr(x, 'weak_type', False))
        if hasattr(x, 'shape') else x, tree)

  def note(self, name: str, phase: str, key: Hashable, args: tuple,
           held: list[tuple[str, PyTree]]) -> None:
    """Records one call of the program of `key` with `args`.

    Args:
      name, phase: as `composition.Call`.
      key: its program's key in `programs`.
      args: tuple of its positional arguments.
      held: list of (part name, pytree) on the device across the call;
        their leaves are read now (the walk may change the trees after).
    """
    self._noted.append(_Noted(name, phase, key, args,
                              [(part, _leaves(tree)) for part, tree in held]))

  def call(self, name: str, phase: str, fn: Callable, args: tuple,
           held: list[tuple[str, PyTree]]) -> PyTree:
    """Compiles jitted `fn` for `args` (once per call key) and notes the
    call.

    Args:
      name, phase: as `composition.Call`.
      fn: the jitted function the step calls.
      args: tuple of its positional arguments (abstract or concrete).
      held: list of (part name, pytree) on the device across the call; only
        leaves marked by `device` count.

    Returns:
      The call's results (`jax.ShapeDtypeStruct`s, new objects), marked as
      device values.

    Raises:
      As `Programs.analyzed`.
    """
    key = self.programs.analyzed(fn, args)
    self.note(name, phase, key, args,
              [(part, [x for x in _leaves(tree) if id(x) in self.on_device])
               for part, tree in held])
    # New leaves per call.
    return self.device(self.host(self.programs.outputs(key)))

  @property
  def calls(self) -> list[composition.Call]:
    """The `composition.Call`s noted, in order.

    Raises:
      As `Programs.analysis`.
    """
    calls = []
    for noted in self._noted:
      analysis = self.programs.analysis(noted.key, noted.args)
      calls.append(composition.Call(
          noted.name, noted.phase, analysis.memory,
          composition.held_parts(noted.held, noted.args, analysis.kept)))
    return calls

  def memory(self) -> composition.StepMemory:
    """The step's `composition.StepMemory`, from the calls noted.

    Raises:
      As `calls`; composition.AccountingError: the figures contradict each
      other.
    """
    return composition.compose(self.calls)
