"""What one compiled call runs, and the step's one walk over a fixed plan.

A unit is a standard layer (`unit_kinds.StandardUnit`) or a reversible
segment (`unit_kinds.ReversibleSegment`), with a compiled forward and a
compiled backward (forward-backward-update, or reverse-backward-update);
the loss program is a `unit_kinds.LossUnit`: the forward, backward and
update of the layers from the plan's `fused_from` on and of the loss
layer. `Units` compiles the units of a `plan.StepPlan` and walks them:

  forward:  for unit in forward units: stack = unit.forward(stack)
            (keeping block inputs and layer states)
  loss:     loss unit forward + backward + update
  backward: for unit in backward units: reverse, backward, update

`Units.walk` is the step's one schedule: the only place that says forward,
loss, backward, in that order, and names the points between them where the
run may act (`step_run.StepRun.begin`, `begin_part`, `unit_done`,
`end_pass`, `end_part`).
It runs on a `step_run.StepRun`, which gives the units their arguments,
makes their calls and hands their updates to its sink:
`step_context.StepContext` on placed arrays (the step itself), or
`on_types.AheadOfTime` on their types (compiling ahead, accounting memory), so
all follow one traversal. Nothing in a walk
changes the plan or the units.

`PlannedStep` is what a step on one batch's shapes runs: its plan, its
units and its accounted device memory (the planner's answer, which the
step takes as given).
"""

from typing import NamedTuple

from trax_revplus import device_memory
from trax_revplus.trainer._plan import plan as plan_lib
from trax_revplus.trainer._step import protocols
from trax_revplus.trainer._step import step_run
from trax_revplus.trainer._step import unit_factory


class Units:
  """The compiled units of a `plan.StepPlan`, and the walks over them.

  Attributes:
    plan: the `plan.StepPlan` (fixed).
    forward_units: list of `unit_kinds.StandardUnit`s and
      `unit_kinds.ReversibleSegment`s run forward, in forward order (those
      before `plan.fused_from`).
    loss_unit: the `unit_kinds.LossUnit`.
    backward_units: list of the units run backward, in backward order.
  """

  def __init__(
    self, plan: plan_lib.StepPlan, factory: unit_factory.UnitFactory
  ) -> None:
    """Compiles the units of `plan` with `factory`
    (`unit_factory.UnitFactory`)."""
    self.plan = plan
    self.forward_units: list[protocols.PassUnit] = []
    self.backward_units: list[protocols.PassUnit] = []
    for std, segments in plan.blocks:
      unit: protocols.PassUnit
      if std < plan.fused_from:
        unit = factory.standard(std, plan)
        self.forward_units.append(unit)
        self.backward_units.append(unit)
      for segment in segments:
        if segment[0] >= plan.fused_from:
          continue
        unit = factory.segment(segment, plan)
        self.forward_units.append(unit)
        split = plan.backward[segment]
        self.backward_units.extend(
          [unit]
          if split == (segment,)
          else [factory.segment(s, plan, forward=False) for s in split]
        )
    self.backward_units.reverse()
    self.loss_unit = factory.loss(
      list(range(plan.fused_from, plan.loss + 1)), plan
    )

  def forward(self, run: step_run.StepRun) -> None:
    """The forward pass: `run.stack` through every forward unit."""
    run.phase = 'forward'
    units = self.forward_units
    if units:
      run.place_ahead(units[0], with_slots=False)
    assert run.stack is not None, 'the batch is placed before the walk'
    for unit, following in zip(units, units[1:] + [None]):
      run.stack = unit.forward(
        run.stack, run.params(unit, following, with_slots=False), run
      )
      run.unit_done(unit)

  def loss(self, run: step_run.StepRun) -> None:
    """The loss program: sets `run.grad_stack` (and places the first
    backward unit's parameters ahead, where the plan prefetches)."""
    run.phase = 'loss'
    following = self.backward_units[0] if self.backward_units else None
    params = run.params(self.loss_unit, following, with_slots=True)
    assert run.stack is not None, 'the forward pass leaves the stack'
    run.grad_stack = self.loss_unit.backward(run.stack, params, run)

  def backward(self, run: step_run.StepRun) -> None:
    """The backward pass, last unit first; empties `run.stack` and
    `run.grad_stack` (the batch's reconstruction and cotangents)."""
    run.phase = 'backward'
    units = self.backward_units
    assert run.stack is not None and run.grad_stack is not None, (
      'the loss program leaves the stack and its cotangents'
    )
    for unit, following in zip(units, units[1:] + [None]):
      run.stack, run.grad_stack = unit.backward(
        run.stack,
        run.grad_stack,
        run.params(unit, following, with_slots=True),
        run,
      )
      run.unit_done(unit)
    run.stack = run.grad_stack = None

  def walk(self, run: step_run.StepRun) -> None:
    """The step's schedule, whole: forward, loss, backward, every update
    off the device, with the run's named points between them; with
    micro-batches (the plan's), forward, loss and backward once per
    part of the batch, the updates in the last part.

    A real step records each pass's end at `end_pass` and may free device
    buffers at `begin` and at the loss's end; a walk on types does nothing
    at the points (`step_run.StepRun`).
    """
    n_parts = self.plan.micro_batches
    run.begin(n_parts)
    for part in range(n_parts):
      run.begin_part(part, n_parts)
      self.forward(run)
      run.end_pass('forward')
      self.loss(run)
      run.end_pass('loss')
      self.backward(run)
      run.end_part()
      run.end_pass('backward')


class PlannedStep(NamedTuple):
  """What a step on one batch's shapes runs.

  Attributes:
    plan: the `plan.StepPlan`.
    units: its compiled `Units`.
    memory: `device_memory.StepMemory` of the step, or None where it was
      not accounted (not compiled ahead, or not accountable here).
    while_compiling: bool, the plan steps run while a faster plan's
      programs compile, until the planner moves them to it
      (`planner.Planner.step_for`'s `ready_first`).
  """

  plan: plan_lib.StepPlan
  units: Units
  memory: device_memory.StepMemory | None
  while_compiling: bool = False
