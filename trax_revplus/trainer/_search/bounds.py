"""What a plan needs on the device before all its programs compile: its
lower bound, its prediction, and the program to compile next to learn more.

Compiling is what planning costs; tracing a plan's functions and walking
its step on types (`on_types.AheadOfTime`) is cheap. `PlanBounds` reads, for
a plan of one batch's shapes, what is known without compiling the rest of
it:

  lower(plan)      device bytes every run of the plan needs at least: the
                   most over its calls of what the step holds across the
                   call (exact, from the walk) plus its program's bytes,
                   exact where the program compiled, else at least its
                   arguments and results (`device_memory.estimates`) and
                   the temporaries the rows rule gives (below); for a plan
                   whose programs were not traced, the same from a plan
                   that differs from it in its batch slices alone;
  predicted(plan)  the same with every uncompiled program's temporaries
                   predicted: from the same program at another slicing,
                   scaled in proportion to its rows, else estimated from
                   its jaxpr (`device_memory.estimates.temp_bytes`);
  probe(plan)      compiles the one program of the plan whose call is
                   predicted to need the most, so that its exact figure
                   can rule the plan out before the rest compiles.

The rows rule: a call's temporaries are a part that does not depend on its
rows plus a part in proportion to them, so the same program over 1/m of
the rows (m times the batch slices) needs at least 1/m of the temporaries;
what the step holds across the call and the program's arguments and
results do not change with the slicing (a sliced program takes and gives
each device's rows whole). So one compiled program of one slicing bounds
that call at every slicing with more slices.

The fused program: it runs every fused layer's forward and backward in one
program, and XLA keeps what each layer's backward reads of its forward (its
residuals, `stack_bytes.residual_bytes`) for all of them at once, as in
trax's default `Trainer`'s program (on the CPU backend, within 1% of the
fused program's temporaries on trax's enwik8 Reformer: docs/device-memory.md).
Its lower bound is its weights, slots and batch plus `FUSED_RESIDUAL_SHARE`
of its layers' residuals over its slice's rows (a backend may keep less:
another fusion, rematerialization), its prediction all of them: a model
whose residuals are many times a device's memory is ruled out without
compiling its whole-model program, which costs the most to compile and
grows with the model's depth.
"""

import dataclasses
from typing import Callable, Mapping, NamedTuple, Sequence

from trax_revplus import device_memory
from trax_revplus.device_memory import calls as calls_lib
from trax_revplus.device_memory import program as program_lib
from trax_revplus.device_memory import programs as programs_lib
from trax_revplus.trainer._accounting import on_types
from trax_revplus.trainer._plan import plan as plan_lib

# The share of the fused layers' residuals the fused program's lower bound
# counts (its prediction counts them all).
FUSED_RESIDUAL_SHARE = 0.5


class Bytes(NamedTuple):
  """A plan's figure in bytes: device (per device) and host (the
  process's)."""

  device: int
  host: int


class FusedFacts(NamedTuple):
  """What the fused program's bound reads, per layer index.

  Attributes:
    params_bytes: dict layer index -> bytes of its weights and slots.
    residual_bytes: list by layer index of the bytes its residuals take on
      one device's rows (`stack_bytes.StackTrace.residual_bytes`), or None
      where they were not traced.
    batch_bytes: bytes of the batch on one device.
    devices_on_host: devices whose buffers are host memory (CPU backend).
  """

  params_bytes: Mapping[int, int]
  residual_bytes: Sequence[int] | None
  batch_bytes: int
  devices_on_host: int


def is_fused(plan: plan_lib.StepPlan) -> bool:
  """Whether `plan` runs layers in its loss program besides the loss."""
  return plan.fused_from < plan.loss


class PlanBounds:
  """Lower bounds and predictions of the plans of one batch's shapes."""

  def __init__(
    self,
    slices: Sequence[int],
    walked: Callable[[plan_lib.StepPlan], on_types.AheadOfTime | None],
    walk: Callable[[plan_lib.StepPlan], on_types.AheadOfTime | None],
    programs: programs_lib.Programs,
    fused: FusedFacts,
  ):
    """Args:
    slices: the batch slice counts a plan of these shapes may take.
    walked: plan -> its walk on types where it was walked, else None.
    walk: plan -> its walk on types (walked now where it was not), or
      None where its step cannot be walked ahead.
    programs: the trainer's `device_memory.programs.Programs`.
    fused: `FusedFacts` of these shapes.
    """
    self._slices = sorted(slices)
    self._walked = walked
    self._walk = walk
    self._programs = programs
    self._fused = fused

  # The fused program.

  def _fused_bytes(self, plan: plan_lib.StepPlan, share: float) -> Bytes:
    facts = self._fused
    fused = range(plan.fused_from, plan.loss + 1)
    device = facts.batch_bytes + sum(
      facts.params_bytes.get(i, 0) for i in fused
    )
    if facts.residual_bytes is not None:
      device += int(
        share * sum(facts.residual_bytes[i] for i in fused) / plan.batch_slices
      )
    return Bytes(device, device * facts.devices_on_host)

  # Calls.

  def _relatives(
    self, plan: plan_lib.StepPlan, fewer_slices_only: bool
  ) -> list[tuple[int, on_types.AheadOfTime]]:
    """(slices, walk) of the walked plans that differ from `plan` in their
    batch slices alone, those with fewer slices first (nearest first)."""
    k = plan.batch_slices
    out = []
    for other in sorted(self._slices, key=lambda s: (s > k, abs(s - k))):
      if other == k or (fewer_slices_only and other > k):
        continue
      walk = self._walked(dataclasses.replace(plan, batch_slices=other))
      if walk is not None and walk.complete:
        out.append((other, walk))
    return out

  def _compiled(self, noted: calls_lib.NotedCall):
    """The program's `program.Analysis` where it compiled, else None.

    Raises:
      device_memory.ProgramCompileError: it did not compile (a
        `ProgramOutOfMemoryError` where refused for memory).
    """
    if not self._programs.done(noted.key):
      return None
    return self._programs.analysis(noted.key, noted.args)

  def _scaled(
    self,
    noted: calls_lib.NotedCall,
    position: int,
    k: int,
    relatives: list[tuple[int, on_types.AheadOfTime]],
    lower: bool,
  ) -> program_lib.ProgramMemory | None:
    """The program figures of call `position` (`noted`, at k slices) from
    the nearest relative whose same call compiled: its temporaries scaled
    by k' / k (`lower`: from fewer slices only, the rows rule)."""
    key = program_lib.types_key(noted.args)
    for other, walk in relatives:
      if lower and other > k:
        continue
      mates = walk.calls.noted
      if len(mates) <= position or mates[position].name != noted.name:
        continue
      mate = mates[position]
      if program_lib.types_key(mate.args) != key:
        continue
      try:
        analysis = self._compiled(mate)
      except device_memory.ProgramCompileError:
        continue
      if analysis is None:
        continue
      m = analysis.memory
      return dataclasses.replace(m, temp_bytes=int(m.temp_bytes * other / k))
    return None

  def _call_bytes(
    self,
    record: calls_lib.StepCalls,
    k: int,
    relatives: list[tuple[int, on_types.AheadOfTime]],
    lower: bool,
    record_slices: int | None = None,
  ) -> Bytes:
    """The most device and host bytes over the calls of `record` (a walk
    at `record_slices` slices, default k) for a plan at k slices: exact
    where compiled (at k), else as `lower` or predicted."""
    device = host = 0
    record_slices = k if record_slices is None else record_slices
    for position, noted in enumerate(record.noted):
      analysis = self._compiled(noted)
      kept = None
      if analysis is not None:
        program, kept = analysis.memory, analysis.kept
      else:
        scaled = self._scaled(noted, position, k, relatives, lower)
        figures = self._programs.uncompiled(noted.key)
        if lower:
          program = figures.lower
          if scaled is not None and scaled.call_bytes > program.call_bytes:
            program = scaled
        else:
          program = scaled if scaled is not None else figures.predicted
      if record_slices != k:
        # Another slicing's call: its temporaries in proportion to the
        # rows (a lower bound from fewer slices: the rows rule).
        program = dataclasses.replace(
          program, temp_bytes=int(program.temp_bytes * record_slices / k)
        )
      call = _call(record, noted, program, kept)
      device = max(device, call.device_bytes)
      host = max(host, call.host_bytes)
    return Bytes(device, host)

  # The figures.

  def lower(self, plan: plan_lib.StepPlan) -> Bytes:
    """Bytes every run of `plan` needs at least (0 where nothing is known).

    Raises:
      device_memory.ProgramOutOfMemoryError: a program of the plan that
        compiled (a probe's) was refused for memory: the plan fits no
        device budget.
      device_memory.ProgramCompileError: one did not compile otherwise.
    """
    found = Bytes(0, 0)
    if is_fused(plan):
      found = self._fused_bytes(plan, FUSED_RESIDUAL_SHARE)
    walk = self._walked(plan)
    if walk is not None and walk.complete:
      relatives = self._relatives(plan, fewer_slices_only=True)
      calls = self._call_bytes(walk.calls, plan.batch_slices, relatives, True)
      return Bytes(max(found.device, calls.device), max(found.host, calls.host))
    # Not walked: a walked plan that differs in its slices alone, with
    # fewer slices, holds what this one holds across each call and calls
    # programs of the same arguments and results.
    k = plan.batch_slices
    for other, walk in self._relatives(plan, fewer_slices_only=True):
      calls = self._call_bytes(walk.calls, k, [], True, record_slices=other)
      found = Bytes(
        max(found.device, calls.device), max(found.host, calls.host)
      )
    return found

  def predicted(
    self, plan: plan_lib.StepPlan, walk: bool = True
  ) -> Bytes | None:
    """The bytes `plan` is predicted to need, or None where not known.

    Args:
      plan: the `plan.StepPlan`.
      walk: walk the plan on types where it was not (tracing its programs);
        False predicts an unwalked plan from a walked one that differs in
        its batch slices alone, each call's temporaries in proportion to
        its rows (None where there is none).

    Raises:
      As `lower`.
    """
    fused = self._fused_bytes(plan, 1.0) if is_fused(plan) else None
    if fused is not None and self._fused.residual_bytes is not None:
      found = self._walked(plan)  # its residuals tell more than its trace
    elif walk:
      found = self._walk(plan)
    else:
      found = self._walked(plan)
      if found is None:
        k = plan.batch_slices
        for other, relative in self._relatives(plan, fewer_slices_only=False):
          return self._call_bytes(
            relative.calls, k, [], False, record_slices=other
          )
    if found is None or not found.complete:
      return fused
    walk_ = found
    relatives = self._relatives(plan, fewer_slices_only=False)
    calls = self._call_bytes(walk_.calls, plan.batch_slices, relatives, False)
    if fused is not None:
      return Bytes(max(fused.device, calls.device), max(fused.host, calls.host))
    return calls

  def probe(self, plan: plan_lib.StepPlan) -> str | None:
    """Compiles the program of `plan`'s call predicted to need the most
    device bytes among those not compiled yet (waiting for it); returns
    that call's name, or None where every program of the plan is compiled
    or compiling, or the plan cannot be walked ahead."""
    walk = self._walk(plan)
    if walk is None or not walk.complete:
      return None
    relatives = self._relatives(plan, fewer_slices_only=False)
    best: tuple[int, calls_lib.NotedCall] | None = None
    for position, noted in enumerate(walk.calls.noted):
      if self._programs.started(noted.key):
        continue
      scaled = self._scaled(
        noted, position, plan.batch_slices, relatives, lower=False
      )
      program = (
        scaled
        if scaled is not None
        else self._programs.uncompiled(noted.key).predicted
      )
      need = _call(walk.calls, noted, program, None).device_bytes
      if best is None or need > best[0]:
        best = (need, noted)
    if best is None:
      return None
    self._programs.compile([best[1].key])
    self._programs.wait([best[1].key])
    return best[1].name


def _call(
  record: calls_lib.StepCalls,
  noted: calls_lib.NotedCall,
  program: program_lib.ProgramMemory,
  kept: object,
) -> device_memory.Call:
  """`record.call_with(noted, program, kept)`; where the held arrays passed
  to the call hold more than `program`'s arguments (its figures are
  another slicing's program's, which dropped arguments this call's keeps
  or not), with every argument of the call counted as kept."""
  try:
    return record.call_with(noted, program, kept)
  except device_memory.AccountingError:
    every = program_lib.tree_bytes(noted.args)
    return record.call_with(
      noted,
      dataclasses.replace(
        program, argument_bytes=max(program.argument_bytes, every)
      ),
      None,
    )
