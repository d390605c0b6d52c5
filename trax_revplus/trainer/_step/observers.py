"""What observes a step at the named points of its walk.

The step (`step_context.StepContext`) calls each of its observers, in
order, at the points of `units.Units.walk`: after each unit's call
(`unit_done`) and at the end of each pass (`pass_ends`). Observers read
the step and tidy host memory; none changes the step's arrays or plan.

  ReleaseHostMemory  gives free C-allocator memory back to the system after
                     compilations and twice per step.
  PhaseRecorder      the memory log's records of the step's phases and,
                     where asked, of each unit.
"""

import time
from typing import Any, Callable, NamedTuple, Sequence

from trax import layers as tl

from trax_revplus import device_memory
from trax_revplus import memory as memory_lib
from trax_revplus import placement as placement_lib
from trax_revplus.memory import host_release
from trax_revplus.trainer._step import protocols
from trax_revplus.typing import PyTree


class ReleaseHostMemory:
  """Gives the memory the C allocator holds free back to the system.

  After the first call of each compiled function (which compiled it, or
  was compiled ahead: the compiler's temporaries are free by then, and
  kept by the allocator they would stay under every later peak), once the
  loss has run (the forward pass's temporaries are free), and at the end of
  each step. Each release makes the next phase fault its pages in again, so
  not after every call, and within a step on the CPU backend only what
  grew beyond the step's own accounted device peak (its buffers live in
  host memory there, and the next phase takes them again).
  """

  def __init__(self):
    self._releaser = host_release.HostMemoryReleaser()
    self._first_calls_done = set()  # ids of compiled functions called

  def release(self, keep_bytes: int = 0) -> None:
    """Releases now, if host memory grew by more than `keep_bytes` and the
    releaser's minimum since the last release."""
    self._releaser.release(keep_bytes)

  def released_bytes(self) -> int:
    """int, host bytes released so far."""
    return self._releaser.released_bytes

  def unit_done(self, ctx: protocols.Step, unit: protocols.Unit) -> None:
    fn = unit.forward_fn if ctx.phase == 'forward' else ctx.backward_fn_of(unit)
    if fn is not None and id(fn) not in self._first_calls_done:
      self._first_calls_done.add(id(fn))
      self.release()

  def pass_ends(self, ctx: protocols.Step, phase: str) -> None:
    # Where the devices' memory is the host's (the CPU backend), the step's
    # own buffers come back with its next phase or step: returning them
    # only makes those fault their pages in again.
    keep = ctx.host_working_set_bytes()
    if phase == 'loss':
      ctx.block(ctx.grad_stack)
      self.release(keep)
    elif phase == 'backward':
      self.release(keep)


class _PhaseStart(NamedTuple):
  seconds: float  # time.time()
  transfers: tuple  # TransferCounter.snapshot()
  released_bytes: int


class PhaseRecorder:
  """The memory log's records of one step: each phase, and each unit
  where the log asks for per-layer records.

  A phase runs from the previous phase's end (or the recorder's making) to
  its own; its record counts the H2D/D2H bytes and the host bytes released
  meanwhile, and carries the step's accounted device and host peaks
  (`device_memory`).
  """

  def __init__(
    self,
    step: int,
    step_memory: device_memory.StepMemory | None,
    placement: placement_lib.Placement,
    layers: Sequence[tl.Layer],
    memory_log: memory_lib.MemoryLog,
    released_bytes: Callable[[], int] | None,
  ):
    """Starts the clock of the step's first phase.

    Args:
      step: int, the training step.
      step_memory: `device_memory.StepMemory` of the step's plan, or None
        where it was not accounted: its peaks go into each recorded phase.
      placement: the trainer's `placement.Placement` (transfer counters,
        waiting for arrays).
      layers: the trainer's layers, by index (their names).
      memory_log: `memory.MemoryLog`.
      released_bytes: callable returning the host bytes released so far,
        or None when nothing is released.
    """
    self._step = step
    self._step_memory = step_memory
    self._placement = placement
    self._layers = layers
    self._log = memory_log
    self._released_bytes = released_bytes
    self._recording = memory_log.should_record(step)
    self._per_layer = self._recording and memory_log.per_layer
    self._phase_start = self._now()

  def unit_done(self, ctx: protocols.Step, unit: protocols.Unit) -> None:
    """Per-layer record of a unit (a segment counts as one), timed from
    `ctx.unit_start_seconds`."""
    if not self._per_layer:
      return
    unit_start_seconds = ctx.unit_start_seconds
    assert unit_start_seconds is not None  # set as the unit's call began
    self._placement.block(
      ctx.stack if ctx.phase == 'forward' else ctx.grad_stack
    )
    names = [self._layers[i].name for i in unit.layers]
    name = names[0] if len(names) == 1 else f'{names[0]}..{names[-1]}'
    self._log.record(
      self._step,
      ctx.phase,
      layer=unit.layers[0],
      layer_name=name,
      n_layers=len(unit.layers),
      seconds=time.time() - unit_start_seconds,
    )

  def pass_ends(self, ctx: protocols.Step, phase: str) -> None:
    # Each pass's record waits for what the pass made last.
    self.end_phase(
      phase, {'forward': ctx.stack, 'loss': ctx.grad_stack}.get(phase)
    )

  def end_phase(
    self, phase: str, outputs: PyTree | None = None, **fields: Any
  ) -> None:
    """Records the phase that ends now, if this step is recorded.

    Args:
      phase: str, e.g. 'forward', 'loss', 'backward', 'free'.
      outputs: pytree of device arrays to wait for first, or None.
      **fields: more record fields (units in their names).
    """
    if not self._recording:
      return
    if outputs is not None:
      self._placement.block(outputs)
    start = self._phase_start
    h2d, d2h = self._placement.transfers.since(start.transfers)
    if self._released_bytes is not None:
      fields['host_released_bytes'] = (
        self._released_bytes() - start.released_bytes
      )
    step_memory = self._step_memory
    peaks = {} if step_memory is None else step_memory.phase_peaks()
    if step_memory is not None and phase in peaks:
      fields['peak_device_bytes'] = step_memory.peak_device_bytes
      fields['phase_peak_device_bytes'] = peaks[phase]
      fields['peak_host_bytes'] = step_memory.peak_host_bytes
      fields['phase_peak_host_bytes'] = step_memory.phase_host_peaks()[phase]
    self._log.record(
      self._step,
      phase,
      seconds=time.time() - start.seconds,
      h2d_bytes=h2d,
      d2h_bytes=d2h,
      **fields,
    )
    self._phase_start = self._now()

  def _now(self):
    return _PhaseStart(
      time.time(),
      self._placement.transfers.snapshot(),
      0 if self._released_bytes is None else self._released_bytes(),
    )
