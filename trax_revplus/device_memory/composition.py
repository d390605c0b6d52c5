"""A step's peak device bytes, composed from its calls' programs.

A training step runs compiled programs one after the other. During a call
the device holds what the trainer keeps across it (the stack, saved block
inputs and states, pending copy-backs, replicated weights, ...) plus what
the call itself allocates. So, per device:

  call's device bytes = held bytes
                        + (argument bytes - held bytes passed to the call)
                        + output bytes + temp bytes - alias bytes
  step's peak device bytes = max over the step's calls

where argument, output, temp and alias bytes are XLA's for the call's
program (`program.ProgramMemory`), and an array that is held and also
passed to the call is counted once (`Held.passed_bytes`). Each held part is
named, so a figure can say what the peak is made of.

The host, per process, during a call holds what the step keeps there
(weights, slots and state between steps, the batch, saved block inputs
and states waiting on the host, gradients added up on the host, host
copies of updates being copied back: `Call.host_held`) and, where the
devices' buffers are host memory (the CPU backend), the call's device
bytes on each of the process's devices:

  call's host bytes = host held bytes + call's device bytes x devices on host
  step's peak host bytes = max over the step's calls

This is exact where every call's buffers are those XLA assigned and the
held arrays are those listed: the runtime allocates a program's temporary
block whole, arguments and results are whole arrays. Not counted: the
allocator's fragmentation and rounding, the runtime's own reserves, and
arrays held outside the trainer.
"""

import dataclasses
from typing import Any, Callable, Sequence

import jax

from trax_revplus.byte_sizes import format_bytes
from trax_revplus.device_memory import program as program_lib


class UnsupportedTrainerError(ValueError):
  """A trainer configuration whose step cannot be accounted (e.g. one that
  does not run on this JAX)."""


class AccountingError(ValueError):
  """Figures that contradict each other: a call's held arrays said to be
  passed to it hold more bytes than its program's arguments."""


@dataclasses.dataclass(frozen=True)
class Held:
  """Bytes held on the device across a call, per device.

  Attributes:
    name: what they are, e.g. 'stack', 'saved block inputs'.
    size_bytes: their bytes.
    passed_bytes: how many of them the call also takes as (kept)
      arguments, so that they are not counted twice.
  """

  name: str
  size_bytes: int
  passed_bytes: int = 0

  def __post_init__(self):
    if self.size_bytes < 0 or not 0 <= self.passed_bytes <= self.size_bytes:
      raise ValueError(
        f'held {self.name!r}: need 0 <= passed_bytes <= size_bytes, got '
        f'{self.passed_bytes} and {self.size_bytes}.'
      )


@dataclasses.dataclass(frozen=True)
class Call:
  """One call of a compiled program within a step.

  Attributes:
    name: which call, e.g. 'backward layers 3..6'.
    phase: the step's phase: 'forward', 'loss', 'backward' or 'step' (a
      trainer whose step is one program).
    program: XLA's figures for the called program.
    held: what the device holds across the call (named parts).
    host_held: what the host holds across the call (named parts, bytes of
      the process).
    devices_on_host: how many of the process's devices keep their
      buffers in host memory (the CPU backend's), so that the call's
      device bytes count on the host that many times; 0 on accelerators.
  """

  name: str
  phase: str
  program: program_lib.ProgramMemory
  # Given as any sequence, stored as a tuple.
  held: Sequence[Held] = ()
  host_held: Sequence[Held] = ()
  devices_on_host: int = 0

  def __post_init__(self) -> None:
    object.__setattr__(self, 'held', tuple(self.held))
    object.__setattr__(self, 'host_held', tuple(self.host_held))
    if self.passed_bytes > self.program.argument_bytes:
      raise AccountingError(
        f'call {self.name!r}: held arrays passed to it hold '
        f"{self.passed_bytes} bytes, more than its program's "
        f'{self.program.argument_bytes} argument bytes.'
      )

  @property
  def held_bytes(self) -> int:
    """Bytes held across the call, passed to it or not."""
    return sum(h.size_bytes for h in self.held)

  @property
  def passed_bytes(self) -> int:
    """Held bytes that are also arguments of the call."""
    return sum(h.passed_bytes for h in self.held)

  @property
  def fresh_argument_bytes(self) -> int:
    """Argument bytes not held across the call (placed for it)."""
    return self.program.argument_bytes - self.passed_bytes

  @property
  def device_bytes(self) -> int:
    """Device bytes in use during the call (see the module docstring)."""
    p = self.program
    return (
      self.held_bytes
      + self.fresh_argument_bytes
      + p.output_bytes
      + p.temp_bytes
      - p.alias_bytes
    )

  @property
  def host_bytes(self) -> int:
    """Host bytes in use during the call, for the whole process (see the
    module docstring)."""
    return (
      sum(h.size_bytes for h in self.host_held)
      + self.device_bytes * self.devices_on_host
    )

  def host_parts(self) -> dict:
    """`host_bytes` by part: each host part, then the devices' buffers
    where they are host memory; the values sum to `host_bytes`."""
    parts: dict[str, int] = {}
    for h in self.host_held:
      parts[h.name] = parts.get(h.name, 0) + h.size_bytes
    if self.devices_on_host:
      parts['device buffers (host memory here)'] = (
        self.device_bytes * self.devices_on_host
      )
    return parts

  def parts(self) -> dict:
    """`device_bytes` by part: each held part (the passed bytes included),
    then 'arguments placed for the call', 'outputs' (less the aliased ones)
    and 'temporaries'; the values sum to `device_bytes`."""
    parts: dict[str, int] = {}
    for h in self.held:
      parts[h.name] = parts.get(h.name, 0) + h.size_bytes
    p = self.program
    parts['arguments placed for the call'] = self.fresh_argument_bytes
    parts['outputs'] = p.output_bytes - p.alias_bytes
    parts['temporaries'] = p.temp_bytes
    return parts


@dataclasses.dataclass(frozen=True)
class StepMemory:
  """The calls of one training step and the peak they compose to.

  Attributes:
    calls: the step's calls in the order it runs them.
  """

  calls: tuple

  def __post_init__(self):
    object.__setattr__(self, 'calls', tuple(self.calls))
    if not self.calls:
      raise ValueError('a step needs at least one call.')

  @property
  def peak_call(self) -> Call:
    """The first call with the most device bytes."""
    return max(self.calls, key=lambda c: c.device_bytes)

  @property
  def peak_device_bytes(self) -> int:
    """Most device bytes in use during any call of the step."""
    return self.peak_call.device_bytes

  @property
  def peak_host_call(self) -> Call:
    """The first call with the most host bytes."""
    return max(self.calls, key=lambda c: c.host_bytes)

  @property
  def peak_host_bytes(self) -> int:
    """Most host bytes (the process's) in use during any call of the
    step."""
    return self.peak_host_call.host_bytes

  @property
  def largest_program_bytes(self) -> int:
    """Most `call_bytes` (argument + output + temp - alias) of any program
    the step runs, held bytes left out."""
    return max(c.program.call_bytes for c in self.calls)

  def phase_peaks(self) -> dict:
    """Peak device bytes per phase, in the order phases first run."""
    peaks: dict[str, int] = {}
    for c in self.calls:
      peaks[c.phase] = max(peaks.get(c.phase, 0), c.device_bytes)
    return peaks

  def phase_host_peaks(self) -> dict:
    """Peak host bytes per phase, in the order phases first run."""
    peaks: dict[str, int] = {}
    for c in self.calls:
      peaks[c.phase] = max(peaks.get(c.phase, 0), c.host_bytes)
    return peaks

  def describe(self) -> str:
    """One line: the peak, its call and what it is made of (MiB)."""
    call = self.peak_call
    return (
      f'peak {format_bytes(self.peak_device_bytes)} in {call.name} '
      f'({call.phase}): {_listed(call.parts())} MiB'
    )

  def describe_host(self) -> str:
    """One line: the host's peak, its call and what it is made of (MiB)."""
    call = self.peak_host_call
    return (
      f'host peak {format_bytes(self.peak_host_bytes)} in {call.name} '
      f'({call.phase}): {_listed(call.host_parts())} MiB'
    )


def _listed(parts: dict) -> str:
  return ', '.join(
    f'{name} {format_bytes(nbytes, suffix=False)}'
    for name, nbytes in parts.items()
    if nbytes
  )


def devices_on_host(platform: str, n_devices: int) -> int:
  """How many of a process's `n_devices` keep their buffers in host memory
  (`Call.devices_on_host`): all of them on the CPU backend, else none."""
  return n_devices if platform == 'cpu' else 0


def compose(calls: Sequence[Call]) -> StepMemory:
  """The `StepMemory` of calls run in this order."""
  return StepMemory(tuple(calls))


def held_parts(
  held: Sequence[tuple[str, Any]],
  args: Any,
  kept: Any | None = None,
  on_device: Callable[[Any], bool] | None = None,
  whole: bool = False,
) -> list[Held]:
  """`Held` parts of what a step holds across one call.

  Args:
    held: list of (part name, pytree) the device holds across the call.
    args: the call's positional arguments (pytree).
    kept: pytree of bool over `args`'s leaves, the arguments the program
      keeps (`program.kept_arguments`), or None: all of them.
    on_device: callable(leaf) -> bool, whether a held leaf is on the
      device, or None: every array leaf is.
    whole: bool, count each array whole (every device's data, as the host
      holds it) rather than one device's shard.

  Returns:
    List of `Held`, one per part with bytes: each leaf counted once (in the
    first part listing it, once however often that part lists it), the
    leaves the call also takes as kept arguments counted as passed.
  """
  arg_leaves = jax.tree_util.tree_leaves(args)
  flags = (
    [True] * len(arg_leaves)
    if kept is None
    else jax.tree_util.tree_leaves(kept)
  )
  passed_ids = {id(x) for x, k in zip(arg_leaves, flags) if k}
  parts, seen = [], set()
  for name, tree in held:
    leaves = []
    for x in jax.tree_util.tree_leaves(tree):
      # One array may be listed many times, in one part too (the optimizer
      # hyperparameters that equal optimizers share): it is held once.
      if (
        hasattr(x, 'shape')
        and hasattr(x, 'dtype')
        and id(x) not in seen
        and (on_device is None or on_device(x))
      ):
        seen.add(id(x))
        leaves.append(x)
    size = sum(program_lib.leaf_bytes(x, whole) for x in leaves)
    passed = sum(
      program_lib.leaf_bytes(x, whole) for x in leaves if id(x) in passed_ids
    )
    if size:
      parts.append(Held(name, size, passed))
  return parts
