"""The contracts between a step's walk and its parts, as `typing.Protocol`s.

`units.Units.walk` is the step's one schedule; what it walks, where the
updates go and who watches are each one of these contracts, so that a
step on placed arrays and a walk on their types (`on_types.AheadOfTime`)
are interchangeable wherever one is taken. What it runs on is a
`step_run.StepRun`, the base class of both (`step_context.StepContext`,
`on_types.AheadOfTime`), which holds the behaviour they share (a unit's
`run` argument below):

  Unit          any unit of a plan: the layers one compiled call runs
                (`unit_kinds.StandardUnit`, `ReversibleSegment`,
                `SelectSegment`, `LossUnit`).
  PassUnit      a unit run in the forward and the backward pass (all but
                `LossUnit`).
  LossProgram   the loss program (`unit_kinds.LossUnit`).
  Step          what an observer reads of a step on placed arrays
                (`step_context.StepContext`).
  UpdateSink    where each call's updates go on their way off the device
                (`commit.CommitQueue`, `host_types.HostTypes`).
  StepObserver  what a step notifies at the points of its walk
                (`observers.ReleaseHostMemory`, `observers.PhaseRecorder`).

Shapes are written for N devices in the per-device layout
(`placement.Layout`): a per-device value of per-device shape S is an array
of global shape (N,) + S on N > 1 devices, S on one; a replicated one has
its own shape on every device. On a walk on types every array below is a
`jax.ShapeDtypeStruct` of that shape.
"""

from typing import Any, Callable, NamedTuple, Protocol, runtime_checkable

from trax_revplus.typing import PyTree
from trax_revplus.typing import Stack


@runtime_checkable
class Unit(Protocol):
  """The layers one compiled call runs, and its compiled functions.

  Attributes:
    layers: list of int, layer indices in forward order.
    forward_fn: the compiled forward (a `jax.jit` function), or None where
      the unit has none (the loss program; a segment that only runs
      backward; a reordering run on the stacks themselves).
    backward_fn: the compiled backward that updates (forward-backward-
      update, reverse-backward-update, the loss program), or None where
      nothing is compiled.
    accumulate_fn: the backward of a micro-batch that only accumulates
      gradients (`step_fns.Update.ACCUMULATE`), or None without
      micro-batches.
  """

  layers: list[int]

  # Read-only (properties): a unit's compiled functions are fixed when it
  # is made, and `unit_kinds.LossUnit` derives its own.
  @property
  def forward_fn(self) -> Callable[..., Any] | None: ...

  @property
  def backward_fn(self) -> Callable[..., Any] | None: ...

  @property
  def accumulate_fn(self) -> Callable[..., Any] | None: ...


@runtime_checkable
class PassUnit(Unit, Protocol):
  """A unit run forward, then backward (`Unit`'s attributes, and these)."""

  def forward(self, stack: Stack, params: tuple, run: Any) -> Stack:
    """Runs the unit's layers on the top of `stack`.

    Args:
      stack: the data stack, per-device arrays of shape (B / N, ...) (one
        array or a tuple; trax's layout).
      params: (weights, slots) as `StepRun.params` returns them; slots
        unused.
      run: the `step_run.StepRun` that makes the call and keeps what the
        backward needs (`StepRun.keep_saved`).

    Returns:
      The stack after the unit's layers.
    """

  def backward(
    self,
    stack: Stack,
    grad_stack: Stack,
    params: tuple,
    run: Any,
  ) -> tuple[Stack, Stack]:
    """Backward and update of the unit's layers; hands the updates to
    `run.updated`.

    Args:
      stack: the stack after the unit's layers (its outputs on top).
      grad_stack: their cotangents, the same shapes and dtypes.
      params: (weights, slots) as `StepRun.params` returns them.
      run: the `step_run.StepRun`.

    Returns:
      (stack, grad_stack) with the unit's inputs and their cotangents in
      place of its outputs.
    """


@runtime_checkable
class LossProgram(Unit, Protocol):
  """The loss program: forward, backward and update of the loss layer and
  the layers fused into it (`Unit`'s attributes, and `backward`)."""

  def backward(self, stack: Stack, params: tuple, run: Any) -> Stack:
    """Runs the program on the top of `stack`; hands the updates to
    `run.updated`.

    Args:
      stack: the data stack after the forward pass.
      params: (weights, slots) as `StepRun.params` returns them.
      run: the `step_run.StepRun`.

    Returns:
      The cotangents of the program's inputs (the loss's cotangent is 1),
      the shapes and dtypes of those inputs (float32 for float inputs).
    """


class CallUpdates(NamedTuple):
  """One call's updates on their way off the device: lists over `layers`
  in commit (backward) order.

  Attributes:
    layers: list of int, the layers the call updated.
    weights: their replicated new weights; each None where the call only
      accumulated gradients (`step_fns.Update.ACCUMULATE`).
    slots: their replicated new slots; where the call only accumulated,
      the part's gradients where they wait on the host
      (`plan.StepPlan.grads_on_host`: the sink adds them up), else each
      None.
    states: their per-device new states.
    stats: their statistics, dicts of per-device scalars.
    part: the micro-batch's `batch_parts.Part` whose rows `states` hold,
      or None.
  """

  layers: list[int]
  weights: list[PyTree] | None
  slots: list[PyTree] | None
  states: list[PyTree]
  stats: list[dict]
  part: Any = None


@runtime_checkable
class UpdateSink(Protocol):
  """Where a walk hands each call's updates (`copy_back.CopyBack`)."""

  def readable(self, stats: PyTree) -> PyTree:
    """A call's statistics (per-device scalars) as the walk keeps them."""

  def start(self, updates: CallUpdates) -> Any:
    """`updates` are dispatched. Returns the token `commit` takes."""

  def commit(self, token: Any) -> None:
    """The updates of `token` leave the device."""

  def end_step(self) -> None:
    """Every update of the walk has left the device."""

  def held_on_host(self) -> list[tuple[str, PyTree]]:
    """What the sink keeps on the host now, as named pytrees."""


@runtime_checkable
class Step(Protocol):
  """What an observer reads of a step on placed arrays
  (`step_context.StepContext`).

  Attributes:
    phase: str, 'forward', 'loss' or 'backward'.
    stack: the data stack between units (per-device arrays), or None.
    grad_stack: its cotangents from the loss on, else None.
    unit_start_seconds: float, `time.time()` when the current unit's call
      began, or None.
  """

  phase: str
  stack: Stack | None
  grad_stack: Stack | None
  unit_start_seconds: float | None

  def backward_fn_of(self, unit: Unit) -> Callable[..., Any] | None:
    """The compiled backward `unit` calls in this part of the step, or
    None where it compiles none."""

  def host_working_set_bytes(self) -> int:
    """Host bytes the step's own device buffers take (0 off the CPU
    backend)."""

  def block(self, tree: PyTree) -> None:
    """Waits for the device arrays in `tree`."""


@runtime_checkable
class StepObserver(Protocol):
  """What a step notifies at the points of its walk; it reads the step and
  changes none of its arrays."""

  def unit_done(self, ctx: 'Step', unit: Unit) -> None:
    """`unit` ran in the pass `ctx.phase` ('forward' or 'backward')."""

  def pass_ends(self, ctx: 'Step', phase: str) -> None:
    """The pass `phase` ended: 'forward'; 'loss' (`ctx.grad_stack` set);
    'backward' (every update committed)."""
