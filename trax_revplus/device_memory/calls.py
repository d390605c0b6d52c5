"""A step's calls on abstract arrays, and the figure they compose to.

Every accounting of a step, trax_revplus's own
(`trainer._accounting.on_types`) and the replays of other trainers'
schedules (`stock_trainer`), notes its calls in a `StepCalls`: the calls of
one step in order, each with its program (in a `programs.Programs`) and
what the device and the host hold across it; `memory()` composes the
step's `composition.StepMemory`. A call of a program the backend did not
compile raises `refusals.ProgramOutOfMemoryError` (refused for memory: the
plan does not fit this device) or `refusals.ProgramCompileError`, naming
the call.
"""

from typing import Hashable, NamedTuple, Sequence

import jax

from trax_revplus.device_memory import composition
from trax_revplus.device_memory import program as program_lib
from trax_revplus.device_memory import programs as programs_lib
from trax_revplus.device_memory import refusals
from trax_revplus.device_memory.programs import Lowerable
from trax_revplus.typing import PyTree


class NotedCall(NamedTuple):
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
    self,
    programs: programs_lib.Programs | None = None,
    devices_on_host: int = 0,
  ):
    self.programs = programs_lib.Programs() if programs is None else programs
    self.on_device: set[int] = set()
    self.devices_on_host = devices_on_host
    self._noted: list[NotedCall] = []

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
      NotedCall(
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
  def noted(self) -> tuple[NotedCall, ...]:
    """The calls noted, in order."""
    return tuple(self._noted)

  def keys(self) -> list[Hashable]:
    """The programs of the calls noted, each once, in call order."""
    return list(dict.fromkeys(n.key for n in self._noted))

  def call_with(
    self,
    noted: NotedCall,
    program: program_lib.ProgramMemory,
    kept: PyTree | None = None,
  ) -> composition.Call:
    """The `composition.Call` of `noted` running a program of figures
    `program` that keeps the arguments `kept` (None: all of them).

    Raises:
      composition.AccountingError: the held arrays passed to it hold more
        than its argument bytes.
    """
    return composition.Call(
      noted.name,
      noted.phase,
      program,
      composition.held_parts(noted.held, noted.args, kept),
      composition.held_parts(noted.host_held, (), whole=True),
      self.devices_on_host,
    )

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
    # Every program not compiled yet compiles now, beside the others.
    self.programs.compile(self.keys())
    for noted in self._noted:
      try:
        analysis = self.programs.analysis(noted.key, noted.args)
      except refusals.ProgramCompileError as e:
        held = composition.held_parts(noted.held, ())
        failed.append(
          (noted.name, e.named(noted.name, sum(h.size_bytes for h in held)))
        )
        continue
      call = self.call_with(noted, analysis.memory, analysis.kept)
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
