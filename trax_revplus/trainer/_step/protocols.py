"""The contracts between a step's walk and its parts, as `typing.Protocol`s.

`units.Units.walk` is the step's one schedule; what it walks, what it runs
on, where the updates go and who watches are each one of these contracts,
so that a step on placed arrays and a walk on their types
(`on_types.AheadOfTime`) are interchangeable wherever one is taken:

  Unit          any unit of a plan: the layers one compiled call runs
                (`unit_kinds.StandardUnit`, `ReversibleSegment`,
                `SelectSegment`, `LossUnit`).
  PassUnit      a unit run in the forward and the backward pass (all but
                `LossUnit`).
  LossProgram   the loss program (`unit_kinds.LossUnit`).
  Run           what a walk runs on: the units' arguments, calls and
                updates (`step_run.StepRun`: `step_context.StepContext`,
                `on_types.AheadOfTime`).
  Step          a run on placed arrays, as its observers read it
                (`step_context.StepContext`).
  UpdateSink    where each call's updates go on their way off the device
                (`copy_back.UpdateSink`, `commit.CommitQueue`,
                `host_types.HostTypes`).
  StepObserver  what a step notifies at the points of its walk
                (`observers.ReleaseHostMemory`, `observers.PhaseRecorder`).

Shapes are written for N devices in the per-device layout
(`placement.Layout`): a per-device value of per-device shape S is an array
of global shape (N,) + S on N > 1 devices, S on one; a replicated one has
its own shape on every device. On a walk on types every array below is a
`jax.ShapeDtypeStruct` of that shape.
"""

from typing import Any, Callable, Protocol, runtime_checkable

from trax_revplus.typing import Array
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

  def forward(self, stack: Stack, params: tuple, run: 'Run') -> Stack:
    """Runs the unit's layers on the top of `stack`.

    Args:
      stack: the data stack, per-device arrays of shape (B / N, ...) (one
        array or a tuple; trax's layout).
      params: (weights, slots) as `Run.params` returns them; slots unused.
      run: the `Run` that makes the call and keeps what the backward needs
        (`Run.keep_saved`).

    Returns:
      The stack after the unit's layers.
    """

  def backward(
    self, stack: Stack, grad_stack: Stack, params: tuple, run: 'Run'
  ) -> tuple[Stack, Stack]:
    """Backward and update of the unit's layers; hands the updates to
    `run.updated`.

    Args:
      stack: the stack after the unit's layers (its outputs on top).
      grad_stack: their cotangents, the same shapes and dtypes.
      params: (weights, slots) as `Run.params` returns them.
      run: the `Run`.

    Returns:
      (stack, grad_stack) with the unit's inputs and their cotangents in
      place of its outputs.
    """


@runtime_checkable
class LossProgram(Unit, Protocol):
  """The loss program: forward, backward and update of the loss layer and
  the layers fused into it (`Unit`'s attributes, and `backward`)."""

  def backward(self, stack: Stack, params: tuple, run: 'Run') -> Stack:
    """Runs the program on the top of `stack`; hands the updates to
    `run.updated`.

    Args:
      stack: the data stack after the forward pass.
      params: (weights, slots) as `Run.params` returns them.
      run: the `Run`.

    Returns:
      The cotangents of the program's inputs (the loss's cotangent is 1),
      the shapes and dtypes of those inputs (float32 for float inputs).
    """


@runtime_checkable
class UpdateSink(Protocol):
  """Where a walk hands each call's updates (`copy_back.CopyBack`)."""

  def readable(self, stats: PyTree) -> PyTree:
    """A call's statistics (per-device scalars) as the walk keeps them."""

  def start(
    self,
    layers: list[int],
    weights: list[PyTree] | None,
    slots: list[PyTree] | None,
    states: list[PyTree],
    stats: list[dict],
    part: Any = None,
  ) -> Any:
    """One call's updates are dispatched: lists over `layers` in commit
    (backward) order of replicated weights and slots and per-device
    states; `part` the `Part` of the batch or None. Returns the token
    `commit` takes."""

  def commit(self, token: Any) -> None:
    """The updates of `token` leave the device."""

  def end_step(self) -> None:
    """Every update of the walk has left the device."""

  def held_on_host(self) -> list[tuple[str, PyTree]]:
    """What the sink keeps on the host now, as named pytrees."""


@runtime_checkable
class Run(Protocol):
  """What a walk over a plan's units runs on (`step_run.StepRun`).

  Attributes:
    plan: the `plan.StepPlan` walked.
    phase: str, 'forward', 'loss' or 'backward'.
    stack: the data stack between units: per-device arrays, one or a
      tuple, of shape (B / N, ...) per device; None where the walk holds
      none (after the backward pass; with micro-batches, before a part's
      rows are placed).
    grad_stack: the cotangents of `stack` from the loss on, else None.
    rngs: list by layer index of per-device uint32[2] RNG keys.
    opt_params: list by layer index of replicated optimizer
      hyperparameters.
    step_placed: the replicated step number, int32[].
    loss_weights: with micro-batches the whole batch's per-device loss
      weights, else None.
    part: the `Part` of the batch walked, or None.
    sink: the `UpdateSink` the updates go to.
  """

  plan: Any
  phase: str
  stack: Stack | None
  grad_stack: Stack | None
  rngs: list[Array]
  opt_params: list[PyTree]
  step_placed: Array
  loss_weights: Array | None
  part: Any
  sink: UpdateSink

  def params(
    self, unit: Unit, following: Unit | None, with_slots: bool
  ) -> tuple[list[PyTree], list[PyTree] | None]:
    """`unit`'s replicated (weights, slots), lists over `unit.layers`;
    places `following`'s ahead where the plan prefetches."""

  def place_ahead(self, unit: Unit, with_slots: bool) -> None:
    """Places `unit`'s parameters ahead of its call (plan prefetch)."""

  def state(self, layers: list[int]) -> list[PyTree]:
    """Per-device state of each of `layers` as its call takes it."""

  def call(self, fn: Callable[..., Any], args: tuple) -> PyTree:
    """Calls compiled function `fn` on `args`; returns its results."""

  def backward_fn_of(self, unit: Unit) -> Callable[..., Any] | None:
    """The compiled backward `unit` calls in this part of the step, or
    None where it compiles none."""

  def keep_saved(self, entries: dict[int, PyTree]) -> None:
    """Keeps what a forward saved for its backward, by layer index."""

  def take_saved(self, layers: list[int]) -> list[PyTree]:
    """The saved entries of `layers`, on the device, in their order."""

  def updated(
    self,
    layers: list[int],
    weights: list[PyTree],
    slots: list[PyTree],
    states: list[PyTree],
    stats: list[dict],
  ) -> None:
    """A call's updates, lists over `layers` in commit order."""

  def begin(self, n_parts: int) -> None:
    """Before the step's first forward pass, over `n_parts` micro-batches
    (1 without)."""

  def begin_part(self, index: int, n_parts: int) -> None:
    """Before micro-batch `index`'s forward pass (0 without), of
    `n_parts`."""

  def unit_done(self, unit: Unit) -> None:
    """After `unit`'s call in the forward or backward pass."""

  def end_pass(self, phase: str) -> None:
    """After the pass `phase`: 'forward', 'loss', 'backward'."""

  def end_part(self) -> None:
    """The end of a part's backward pass: every update leaves the
    device."""


@runtime_checkable
class Step(Run, Protocol):
  """A run on placed arrays, as its observers read it
  (`step_context.StepContext`).

  Attributes:
    unit_start_seconds: float, `time.time()` when the current unit's call
      began.
  """

  unit_start_seconds: float | None

  def host_working_set_bytes(self) -> int:
    """Host bytes the step's own device buffers take (0 off the CPU
    backend)."""

  def block(self, tree: PyTree) -> None:
    """Waits for the device arrays in `tree`."""


@runtime_checkable
class StepObserver(Protocol):
  """What a step notifies at the points of its walk; it reads the step and
  changes none of its arrays."""

  def unit_done(self, ctx: Step, unit: Unit) -> None:
    """`unit` ran in the pass `ctx.phase` ('forward' or 'backward')."""

  def pass_ends(self, ctx: Step, phase: str) -> None:
    """The pass `phase` ended: 'forward'; 'loss' (`ctx.grad_stack` set);
    'backward' (every update committed)."""
