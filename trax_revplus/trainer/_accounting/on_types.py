"""A step's walk on argument types: compiling ahead, accounting device memory.

`AheadOfTime` is a `step_run.StepRun` whose arrays are types: it walks a
plan's units (`units.Units.walk`) as the step will, traces each compiled
function with the argument types its call will get, and notes at each call
what the step holds on the device across it (`step_run.StepRun.held`, the
step's own description), in a `device_memory.calls.StepCalls`. The programs
live in the trainer's `device_memory.calls.Programs`, shared by every walk
of the trainer, so a program traced or compiled once (for one plan) is not
again (for another). It notes, too, what the step holds on the host across
each call (`step_run.StepRun.held_on_host`). Its updates go to
`host_types.HostTypes`, a sink that keeps only the types of what a real
step's commit queue keeps on the host: leaving the device, they only leave
what the walk holds.
A walk traces; it compiles nothing. `memory()` then compiles the programs
of the walk not compiled yet, beside each other on helper threads
(`device_memory.calls.Programs.compile`), and composes the step's
`device_memory.StepMemory`, device and host bytes, from XLA's memory
analysis of the very executables the step calls. A planner that weighs a
plan before compiling all of it reads the walk's calls (`calls`) and the
programs' figures before they compile.

A program the backend does not compile is not a miss: `memory()` raises
`device_memory.ProgramOutOfMemoryError` where the backend refused it for
memory (the plan does not fit this device), else
`device_memory.ProgramCompileError`, naming the call.

The walk stops at the first call whose argument types cannot be known
without placing its arguments, or which cannot be traced apart from its
call; it and the calls after it compile when called, and the step cannot be
accounted. A miss costs time, never correctness. Programs that hold
collectives are traced as any other: waiting for them is a matter of the
call (`Placement.sync_collectives`), not of the program.
"""

import time
from typing import Any, Callable, NamedTuple

from absl import logging
import jax
from trax import layers as tl
from trax.optimizers import base as optimizer_base

from trax_revplus import device_memory
from trax_revplus import layers as layers_lib
from trax_revplus import placement as placement_lib
from trax_revplus.device_memory import calls as calls_lib
from trax_revplus.device_memory import programs as programs_lib
from trax_revplus.trainer._accounting import host_types as host_types_lib
from trax_revplus.trainer._plan import plan as plan_lib
from trax_revplus.trainer._step import batch_parts
from trax_revplus.trainer._step import protocols
from trax_revplus.trainer._step import step_run as step_run_lib
from trax_revplus.trainer._step import ties as ties_lib
from trax_revplus.trainer._step import units as units_lib
from trax_revplus.typing import PyTree


class StepTypes(NamedTuple):
  """What a step's walk starts from, as the step will have it.

  Attributes:
    stack: the sharded batch's types (`placement.Placement.abstract_batch`).
    rngs: each layer's placed RNG (values unused).
    opt_params: each layer's placed optimizer hyperparameters.
    step: the step number, placed (value unused).
    host_batch: the batch's types as the host holds it (this process's
      rows, unsharded: `device_memory.program.host_types`), or None (a
      walk with micro-batches then stops: each part's types come from it).
  """

  stack: Any
  rngs: Any
  opt_params: Any
  step: Any
  host_batch: Any = None


class TypesUnknown(Exception):
  """A call's argument types are not known without running the step."""


_UNKNOWN = object()  # parameters placed ahead whose types are unknown


class AheadOfTime(step_run_lib.StepRun):
  """Walks a step on types, compiling its programs and noting what it holds.

  Use `account(units)`; then `complete` says whether it reached the step's end,
  and `memory()` composes its device memory.

  Attributes:
    complete: bool, whether the walk reached the step's end.
  """

  def __init__(
    self,
    plan: plan_lib.StepPlan,
    types: StepTypes,
    placement: placement_lib.Placement,
    layers: list[tl.Layer],
    optimizers: list[optimizer_base.Optimizer],
    programs: programs_lib.Programs,
    ties: ties_lib.Ties | None = None,
    keeps_replaced: bool = False,
  ):
    """Args:
    plan: the `plan.StepPlan` walked.
    types: `StepTypes` of the step.
    placement: the trainer's `placement.Placement`.
    layers, optimizers: lists by layer index (host weights, state, slots).
    programs: `device_memory.calls.Programs` shared by the trainer's
      walks.
    ties: `ties.Ties` of the layers (default: none shared).
    keeps_replaced: bool, whether the step keeps each replaced host
      weight, slot and state until its end (`on_non_finite='skip'`).
    """
    host_types = host_types_lib.HostTypes(layers, optimizers, keeps_replaced)
    super().__init__(
      plan,
      types.stack,
      types.rngs,
      types.opt_params,
      types.step,
      host_types,
      ties,
    )
    self._host_types = host_types
    self._placement = placement
    self._layers = layers
    self._optimizers = optimizers
    self._programs = programs
    self._host_batch = types.host_batch
    self._devices_are_host = devices_are_host(placement)
    self._record = calls_lib.StepCalls(
      programs, placement.n_local_devices if self._devices_are_host else 0
    )
    self._unit: protocols.Unit | None = None  # the unit called next
    self.complete = False

  def account(self, units: units_lib.Units) -> None:
    """Walks `units` on types (`units.walk(self)`), tracing each call's
    program and noting what the step holds across it; compiles nothing
    (`memory()` does)."""
    try:
      units.walk(self)
      self.complete = True
    except TypesUnknown:
      pass

  @property
  def calls(self) -> calls_lib.StepCalls:
    """The calls the walk noted, with what is held across each."""
    return self._record

  # The run on types.

  def place(
    self, layers: list[int], with_slots: bool
  ) -> tuple[list[PyTree], list[PyTree] | None]:
    p = self._placement
    weights = _known(
      p.abstract_params([self._layers[i].weights for i in layers])
    )
    slots = None
    if with_slots:
      slots = _known(
        p.abstract_params([self._optimizers[i].slots for i in layers])
      )
    return weights, slots

  def state(self, layers: list[int]) -> list[PyTree]:
    states = [self._layers[i].state for i in layers]
    if self.part is not None:
      states = [
        self.part.state(self._layers[i], state)
        for i, state in zip(layers, states)
      ]
    return [
      _known(self._placement.abstract_per_device(state)) for state in states
    ]

  def begin(self, n_parts: int) -> None:
    """With micro-batches, the batch's loss weights as the step places
    them; each part's rows come from the host batch's types (`begin_part`),
    as the step's from the host batch. Where the plan keeps weights and
    slots on the device, every layer's, as placed."""
    if self.plan.params_on_device:
      p = self._placement
      self.on_device = {
        i: (
          _known(p.abstract_params(layer.weights)),
          _known(p.abstract_params(self._optimizers[i].slots)),
        )
        for i, layer in enumerate(self._layers)
      }
    if n_parts == 1:
      return
    if self._host_batch is None:
      raise TypesUnknown()
    self.stack = None
    item = batch_parts.loss_weights_item(self._layers, len(self._host_batch))
    self.loss_weights = self._placement.abstract_batch(self._host_batch[item])

  def begin_part(self, index: int, n_parts: int) -> None:
    """The part's rows of the batch's types, as `shard_batch` would give
    them (`batch_parts.part_of_batch`, as the step)."""
    if n_parts == 1:
      return
    self.part, rows = batch_parts.part_of_batch(
      self._host_batch, index, n_parts, self._placement.n_local_devices
    )
    self.stack = self._placement.abstract_batch(rows)

  def place_ahead(self, unit: protocols.Unit, with_slots: bool) -> None:
    # A unit whose types are unknown stops the walk when it is called, after
    # the calls before it, as the step would meet them.
    try:
      super().place_ahead(unit, with_slots)
    except TypesUnknown:
      self._next = (unit, _UNKNOWN)

  def params(
    self,
    unit: protocols.Unit,
    following: protocols.Unit | None,
    with_slots: bool,
  ) -> tuple[list[PyTree], list[PyTree] | None]:
    self._unit = unit
    params = super().params(unit, following, with_slots)
    if params is _UNKNOWN:
      raise TypesUnknown()
    return params

  def host_params(self) -> PyTree:
    return step_run_lib.host_params(
      self._layers, self._optimizers, self.plan.params_on_device
    )

  def host_batch(self) -> PyTree:
    return self._host_batch

  def gradients_from_host(
    self, layers: list[int], weights: list[PyTree]
  ) -> list[PyTree]:
    # Taken off the host; placed as the weights are, new device arrays.
    self._host_types.take_gradients(layers)
    return _fresh(weights)

  def duplicate(self, array: PyTree) -> PyTree:
    # A device array of its own, as the step's copy is.
    return self._record.device(_fresh(array))

  def from_host(self, waiting: Any) -> PyTree:
    # Placed back, the arrays are new device arrays (`StepRun.to_host` left
    # their types out of what is held meanwhile).
    return _fresh(waiting)

  def call(self, fn: Callable[..., Any], args: tuple) -> PyTree:
    """Notes the call and what is held across it; traces `fn` for `args`
    and queues its compilation; returns its result types."""
    key = programs_lib.call_key(fn, args)
    programs = self._programs
    if key not in programs:
      if not hasattr(fn, 'trace'):
        raise TypesUnknown()
      # Tracing stays on this thread: trax layers hold their weights
      # while traced (`Layer.pure_fn`), so layers must not be traced
      # concurrently; lowering and compiling need no layer. A trace that
      # fails inside a layer leaves the layers as they were found.
      try:
        start = time.monotonic()
        with layers_lib.preserved(*self._layers):
          traced = fn.trace(*args)
      except Exception as e:  # pylint: disable=broad-except
        logging.info(
          'tracing a function ahead of the step failed (%s); it '
          'compiles when called.',
          e,
        )
        raise TypesUnknown() from e
      programs.add_traced(key, fn, traced, args, (start, time.monotonic()))
    self._record.note(
      self._name(),
      self.phase,
      key,
      args,
      self.held(),
      self.held_on_host(self._devices_are_host),
    )
    return _fresh(self._placement.per_device_types(programs.outputs(key)))

  def _name(self) -> str:
    assert self._unit is not None  # each call's unit takes its `params`
    return step_run_lib.call_name(self.phase, self._unit, self._layers)

  # The figures.

  def memory(self) -> device_memory.StepMemory:
    """The step's `device_memory.StepMemory`.

    Raises:
      device_memory.UnsupportedTrainerError: the walk stopped before the
        step's end (a call's argument types are not known ahead, or its
        trace failed).
      device_memory.ProgramOutOfMemoryError: the backend refused to
        compile a program of the step for memory.
      device_memory.ProgramCompileError: a program did not compile for
        another reason.
    """
    if not self.complete:
      raise device_memory.UnsupportedTrainerError(
        "the step's calls cannot all be compiled ahead of it here (their "
        'argument types are not known without running it), so its device '
        'memory cannot be accounted.'
      )
    return self._record.memory()


def devices_are_host(placement: placement_lib.Placement) -> bool:
  """Whether `placement`'s devices keep their buffers in host memory (the
  CPU backend's), so that the host's figure counts their bytes
  (`device_memory.devices_on_host`)."""
  return device_memory.devices_on_host(placement.platform, 1) == 1


def _known(tree):
  if tree is None:
    raise TypesUnknown()
  return tree


def _fresh(tree):
  """A copy of `tree` with new abstract leaves (shape, dtype, sharding), so
  that each call's results count as arrays of their own."""

  def leaf(x):
    if isinstance(x, jax.ShapeDtypeStruct):
      return jax.ShapeDtypeStruct(
        x.shape, x.dtype, sharding=x.sharding, weak_type=x.weak_type
      )
    return x

  return jax.tree_util.tree_map(leaf, tree)
