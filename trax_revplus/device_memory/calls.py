"""A step's calls on abstract arrays: its programs, once each, and its figure.

Every accounting of a step, trax_revplus's own
(`trainer._accounting.on_types`) and the replays of other trainers'
schedules (`stock_trainer`), goes through the two classes here:

  `Programs`: the programs compiled for calls, by call key (`call_key`:
    the function's id and the argument types), with their result types and
    XLA's memory analysis (`program.Analysis`), each read once. A call key
    seen again (equal layers share one jitted function; walks of several
    plans share programs) compiles nothing.
  `StepCalls`: the calls of one step in order, each with what the device
    and the host hold across it; `memory()` composes the step's
    `composition.StepMemory`.

A program the backend does not compile is kept as such, so that no other
walk compiles it again: a call of it raises `refusals.ProgramOutOfMemoryError`
(refused for memory: the plan does not fit this device) or
`refusals.ProgramCompileError`, naming the call.
"""

import concurrent.futures
from typing import Any, Callable, Hashable, NamedTuple, Protocol, Sequence

import jax

from trax_revplus.device_memory import composition
from trax_revplus.device_memory import program as program_lib
from trax_revplus.device_memory import refusals
from trax_revplus.typing import PyTree


class Lowerable(Protocol):
  """A function a step calls: `jax.jit`'s (a `jax.stages.Wrapped`, traced
  then lowered) or `jax.pmap`'s (only lowered)."""

  def __call__(self, *args: Any) -> Any: ...

  def lower(self, *args: Any) -> jax.stages.Lowered: ...


def call_key(fn: Callable, args: PyTree) -> Hashable:
  """The key of a call of `fn` with `args`: equal for calls that run one
  program (the function's id, `program.types_key` of the arguments)."""
  return (id(fn), program_lib.types_key(args))


class Programs:
  """Programs compiled for calls, by `call_key`.

  A program is added either compiled and analyzed at once (`analyzed`), or
  traced with its compilation under way elsewhere (`add_traced`, a future
  of the `jax.stages.Compiled`, raising where compiling failed); its memory
  analysis is read once, when first asked for (`analysis`). A program that
  did not compile raises its `refusals.ProgramCompileError` each time it
  is asked for, and is not compiled again.
  """

  def __init__(self):
    self._outputs = {}  # key -> result types
    self._compiled = {}  # key -> future of jax.stages.Compiled or None
    # key -> the function, kept alive so that its id in the key is not
    # reused by another.
    self._functions = {}
    self._analyses = {}  # key -> program.Analysis
    self._failed = {}  # key -> refusals.ProgramCompileError

  def __contains__(self, key: Hashable) -> bool:
    return key in self._outputs

  def add_traced(
    self,
    key: Hashable,
    fn: Callable,
    traced: jax.stages.Traced,
    compiled: concurrent.futures.Future,
  ) -> None:
    """Adds the program of `key`: `fn` traced for the call, and the future
    of its `jax.stages.Compiled` (raising what compiling raised)."""
    self._outputs[key] = traced.out_info
    self._functions[key] = fn
    self._compiled[key] = compiled

  def analyzed(self, fn: Lowerable, args: tuple) -> Hashable:
    """The key of a call of `fn` with `args`, its program compiled and
    analyzed now where it is not yet (`program.analyze`).

    Raises:
      refusals.ProgramCompileError: the backend did not compile it (a
        `refusals.ProgramOutOfMemoryError` where it refused it for memory),
        now or before; the error names no call.
      Whatever tracing or lowering `fn` raises for `args`; ValueError where
      the backend gives no memory analysis.
    """
    key = call_key(fn, args)
    failed = self._failed.get(key)
    if failed is not None:
      raise failed
    if key not in self:
      # Traced (or lowered) apart from compiling: only the backend's
      # compilation of the program can refuse it.
      staged: jax.stages.Traced | jax.stages.Lowered = (
        fn.trace(*args) if hasattr(fn, 'trace') else fn.lower(*args)
      )
      try:
        compiled = (
          staged.lower() if isinstance(staged, jax.stages.Traced) else staged
        ).compile()
      except Exception as e:  # pylint: disable=broad-except
        self._failed[key] = refusals.compile_failure(e)
        raise self._failed[key] from None
      memory = program_lib.ProgramMemory.from_compiled(compiled)
      self._outputs[key] = staged.out_info
      self._functions[key] = fn
      self._analyses[key] = program_lib.Analysis(
        memory,
        staged.out_info,
        program_lib.kept_arguments(compiled, args, memory)
        if hasattr(fn, 'trace')
        else None,
      )
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
      refusals.ProgramCompileError: the program did not compile (a
        `refusals.ProgramOutOfMemoryError` where the backend refused it for
        memory); the error names no call.
      ValueError: the backend gives no memory analysis.
    """
    if key in self._failed:
      raise self._failed[key]
    if key not in self._analyses:
      try:
        compiled = self._compiled[key].result()
      except Exception as e:  # pylint: disable=broad-except
        self._failed[key] = refusals.compile_failure(e)
        raise self._failed[key] from None
      memory = program_lib.ProgramMemory.from_compiled(compiled)
      self._analyses[key] = program_lib.Analysis(
        memory,
        self._outputs[key],
        program_lib.kept_arguments(compiled, args, memory),
      )
    return self._analyses[key]


class _Noted(NamedTuple):
  """One call as a walk met it."""

  name: str
  phase: str
  key: Hashable
  args: tuple
  held: list  # (part name, list of leaves) on the device across the call
  host_held: list  # (part name, list of leaves) on the host across it


def _leaves(tree: PyTree) -> list:
  return jax.tree_util.tree_leaves(tree)


class StepCalls:
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
  passed) with the call's program, and the host's parts of each call
  (each leaf counted once, whole: host arrays are not sharded).

  Attributes:
    programs: the `Programs` the calls run (shared where given).
    on_device: set of the ids of the abstract leaves marked as on the
      device.
    devices_on_host: devices of the process whose buffers are host memory
      (`composition.Call.devices_on_host`): the process's devices on the
      CPU backend, else 0.
  """

  def __init__(
    self, programs: Programs | None = None, devices_on_host: int = 0
  ):
    self.programs = Programs() if programs is None else programs
    self.on_device: set[int] = set()
    self.devices_on_host = devices_on_host
    self._noted: list[_Noted] = []

  def device(self, tree: PyTree) -> PyTree:
    """Marks the leaves of `tree` as device arrays; returns `tree`."""
    self.on_device.update(id(x) for x in _leaves(tree))
    return tree

  def host(self, tree: PyTree) -> PyTree:
    """A copy of `tree` with new abstract leaves, not on the device."""
    return jax.tree_util.tree_map(
      lambda x: (
        jax.ShapeDtypeStruct(
          x.shape, x.dtype, weak_type=getattr(x, 'weak_type', False)
        )
        if hasattr(x, 'shape')
        else x
      ),
      tree,
    )

  def note(
    self,
    name: str,
    phase: str,
    key: Hashable,
    args: tuple,
    held: list[tuple[str, PyTree]],
    host_held: Sequence[tuple[str, PyTree]] = (),
  ) -> None:
    """Records one call of the program of `key` with `args`.

    Args:
      name, phase: as `composition.Call`.
      key: its program's key in `programs`.
      args: tuple of its positional arguments.
      held: list of (part name, pytree) on the device across the call;
        their leaves are read now (the walk may change the trees after).
      host_held: list of (part name, pytree) on the host across the call,
        read now.
    """
    self._noted.append(
      _Noted(
        name,
        phase,
        key,
        args,
        [(part, _leaves(tree)) for part, tree in held],
        [(part, _leaves(tree)) for part, tree in host_held],
      )
    )

  def call(
    self,
    name: str,
    phase: str,
    fn: Lowerable,
    args: tuple,
    held: Sequence[tuple[str, PyTree]],
    host_held: Sequence[tuple[str, PyTree]] = (),
  ) -> PyTree:
    """Compiles jitted `fn` for `args` (once per call key) and notes the
    call.

    Args:
      name, phase: as `composition.Call`.
      fn: the jitted function the step calls.
      args: tuple of its positional arguments (abstract or concrete).
      held: list of (part name, pytree) on the device across the call; only
        leaves marked by `device` count.
      host_held: list of (part name, pytree) on the host across the call.

    Returns:
      The call's results (`jax.ShapeDtypeStruct`s, new objects), marked as
      device values.

    Raises:
      refusals.ProgramCompileError: the backend did not compile the program
        (`refusals.ProgramOutOfMemoryError`: refused it for memory), naming
        this call.
      As `Programs.analyzed` otherwise.
    """
    on_device = [
      (part, [x for x in _leaves(tree) if id(x) in self.on_device])
      for part, tree in held
    ]
    try:
      key = self.programs.analyzed(fn, args)
    except refusals.ProgramCompileError as e:
      raise e.named(
        name, sum(h.size_bytes for h in composition.held_parts(on_device, ()))
      ) from None
    self.note(name, phase, key, args, on_device, host_held)
    # New leaves per call.
    return self.device(self.host(self.programs.outputs(key)))

  @property
  def calls(self) -> list[composition.Call]:
    """The `composition.Call`s noted, in order.

    Raises:
      refusals.ProgramCompileError: a program did not compile, naming the
        first such call: where one did not for a reason other than memory,
        that one; else (`refusals.ProgramOutOfMemoryError`) the first the
        backend refused for memory, with the least bytes the step needs
        (the most of the compiler's figure, what the device holds across
        each refused call, and each other call's bytes).
      As `Programs.analysis` otherwise.
    """
    calls: list[composition.Call] = []
    # The calls whose programs did not compile: (name, error naming it).
    failed: list[tuple[str, refusals.ProgramCompileError]] = []
    least = 0
    for noted in self._noted:
      try:
        analysis = self.programs.analysis(noted.key, noted.args)
      except refusals.ProgramCompileError as e:
        held = composition.held_parts(noted.held, ())
        failed.append(
          (noted.name, e.named(noted.name, sum(h.size_bytes for h in held)))
        )
        continue
      call = composition.Call(
        noted.name,
        noted.phase,
        analysis.memory,
        composition.held_parts(noted.held, noted.args, analysis.kept),
        composition.held_parts(noted.host_held, (), whole=True),
        self.devices_on_host,
      )
      least = max(least, call.device_bytes)
      calls.append(call)
    other = [
      e
      for _, e in failed
      if not isinstance(e, refusals.ProgramOutOfMemoryError)
    ]
    if other:
      raise other[0]
    refused = [
      e for _, e in failed if isinstance(e, refusals.ProgramOutOfMemoryError)
    ]
    if refused:
      raise refused[0].named(
        failed[0][0], max([least] + [e.least_bytes or 0 for e in refused])
      )
    return calls

  def memory(self) -> composition.StepMemory:
    """The step's `composition.StepMemory`, from the calls noted.

    Raises:
      As `calls`; composition.AccountingError: the figures contradict each
      other.
    """
    return composition.compose(self.calls)
