"""`StepRun`: what a walk over a plan's units runs on, and what it holds.

`units.Units.walk` walks its units on a `StepRun`, which gives the units
their arguments and makes their calls: `step_context.StepContext` on placed
arrays (the step itself), or `on_types.AheadOfTime` on their types (compiling
ahead and accounting device memory). Both are this class, so what a step
holds on the device across each call (`StepRun.held`) and on the host
(`StepRun.held_on_host`), when an update leaves the device (`CopyBack`) and
where what a forward keeps for its backward waits (`StepRun.keep_saved`,
`StepRun.take_saved`) are written once, for the step, the compile-ahead
walk and the accounting alike: what it holds in `step_holdings`, how it
gets arguments, makes calls and hands on updates here.

Each call's updates go to the run's `protocols.UpdateSink`: the commit
queue in a
real step (`commit.CommitQueue`), which copies them back to the host; in a
walk on types a sink that keeps only the types of what the host would
hold (`ahead`), where an update leaving the device only leaves
`StepRun.held`.
"""

import abc
from typing import Any, Callable, Sequence

from trax import layers as tl
from trax.optimizers import base as optimizer_base

from trax_revplus.trainer._step import protocols
from trax_revplus.trainer._step import step_holdings
from trax_revplus.trainer._step import ties as ties_lib
from trax_revplus.typing import PyTree


def call_name(
  phase: str, unit: protocols.Unit, layers: Sequence[tl.Layer]
) -> str:
  """What the memory figures and errors call a unit's call in `phase`, e.g.
  'backward layers 3..6', 'loss layer 9 (Serial)'.

  Args:
    phase: 'forward', 'loss' or 'backward'.
    unit: the unit called (its `layers`, indices in forward order).
    layers: the trainer's layers, by index.
  """
  first, last = unit.layers[0], unit.layers[-1]
  if phase == 'loss':
    return (
      f'loss layer {last} ({layers[last].name})'
      if first == last
      else f'loss program, layers {first}..{last}'
    )
  if first == last:
    return f'{phase} layer {first} ({layers[first].name})'
  return f'{phase} layers {first}..{last}'


class StepRun(step_holdings.StepHoldings, abc.ABC):
  """What a walk over a plan's units runs on; one per walk.

  A run sees each compiled call with its arguments (`call`) and what the
  step holds across it (`held`, from `step_holdings.StepHoldings`), so
  per-call accounting of device memory belongs in a run. Its attributes
  are those of `step_holdings.StepHoldings`.
  """

  # How the walk gets its arguments and makes its calls.

  @abc.abstractmethod
  def place(
    self, layers: list[int], with_slots: bool
  ) -> tuple[list[PyTree], list[PyTree] | None]:
    """Weights (and slots) of `layers` as their call takes them.

    Returns:
      (weights, slots): lists over `layers`; slots None without
      `with_slots`.
    """

  @abc.abstractmethod
  def state(self, layers: list[int]) -> list[PyTree]:
    """List of the state of each of `layers` as its call takes it."""

  @abc.abstractmethod
  def call(self, fn: Callable[..., Any], args: tuple) -> PyTree:
    """Calls compiled function `fn` on `args`; returns its results."""

  @property
  def accumulating(self) -> bool:
    """Whether the walk is in a micro-batch that only accumulates its
    gradients (any but the step's last)."""
    return self.part is not None and not self.part.last

  def backward_fn_of(self, unit: protocols.Unit) -> Callable[..., Any] | None:
    """The compiled backward `unit` calls in this part of the step, or
    None where it compiles none (a reordering of the stack)."""
    return unit.accumulate_fn if self.accumulating else unit.backward_fn

  def place_ahead(self, unit: protocols.Unit, with_slots: bool) -> None:
    """Places `unit`'s parameters ahead of its call, if the plan
    prefetches (H2D overlaps the current call's work)."""
    if self.plan.prefetch:
      self._next = (
        unit,
        self._params_of(unit.layers, with_slots and not self.accumulating),
      )

  def _params_of(
    self, layers: list[int], with_slots: bool
  ) -> tuple[list[PyTree], list[PyTree] | None]:
    """(weights, slots) of `layers` for their call: those kept on the
    device where the plan keeps them there (`on_device`), else placed
    (`place`)."""
    if not self.plan.params_on_device:
      return self.place(layers, with_slots)
    weights = [self.on_device[i][0] for i in layers]
    slots = [self.on_device[i][1] for i in layers] if with_slots else None
    return weights, slots

  def params(
    self,
    unit: protocols.Unit,
    following: protocols.Unit | None,
    with_slots: bool,
  ) -> tuple[list[PyTree], list[PyTree] | None]:
    """`unit`'s parameters, placed ahead or now; places `following`'s ahead
    (where the plan prefetches) before returning.

    Args:
      unit: the unit about to be called.
      following: the unit called next in this pass, or None.
      with_slots: bool, whether the call updates (takes slots).

    Returns:
      (weights, slots) as `place` returns them.
    """
    if self._next is not None:
      ahead_unit, params = self._next
      assert ahead_unit is unit, (ahead_unit, unit)
      self._next = None
    else:
      params = self._params_of(
        unit.layers, with_slots and not self.accumulating
      )
    if following is not None:
      self.place_ahead(following, with_slots)
    if with_slots and self.part is not None:
      params = self._with_gradients(unit.layers, params)
    if with_slots and self.ties:
      params = self._with_tied(unit.layers, params)
    return params

  def _with_gradients(self, layers, params):
    """A micro-batch's `params` (`step_fns.Update`): the gradients
    accumulated so far in the slots' place (an empty tuple in the first
    part, and in every part where they wait on the host), or beside the
    slots in the last part."""
    weights, slots = params
    if not self.plan.grads_on_host:
      grads = [self.grads.pop(i, ()) for i in layers]
    elif self.accumulating:
      grads = [()] * len(layers)
    else:
      grads = self.gradients_from_host(layers, weights)
    if self.accumulating:
      return weights, grads
    return weights, [(s, g) for s, g in zip(slots, grads)]

  def _with_tied(self, layers, params):
    """`params` of a call updating `layers`, with each weight those layers
    share with a layer updated by an earlier call taken from that update
    (`ties`: as trax's backward reads `layer.weights` its last update set).
    The update is still the copy-back's, which the call must not donate:
    the call gets a copy (`duplicate`)."""
    weights, slots = params
    weights = list(weights)
    for tie in self.ties.across(layers):
      k = layers.index(tie.layer)
      value = self.duplicate(self.tied.pop((tie.source, tie.source_leaf)))
      weights[k] = ties_lib.with_leaves(weights[k], {tie.leaf: value})
    return weights, slots

  @abc.abstractmethod
  def gradients_from_host(
    self, layers: list[int], weights: list[PyTree]
  ) -> list[PyTree]:
    """The gradients of `layers` accumulated on the host over the step's
    earlier micro-batches, placed as their `weights` are (a list over
    `layers`)."""

  @abc.abstractmethod
  def duplicate(self, array: PyTree) -> PyTree:
    """A copy of the device array `array` that a call may donate."""

  # What happens to a call's updates.

  def updated(
    self,
    layers: list[int],
    weights: list[PyTree],
    slots: list[PyTree],
    states: list[PyTree],
    stats: list[dict],
  ) -> None:
    """A call's updates, lists over `layers` in commit (backward) order:
    its statistics kept (as the sink reads them), the updates handed to
    the sink on their way off the device (`CopyBack`). In a micro-batch
    that accumulates, `slots` are the layers' accumulated gradients: kept
    on the device (`grads`), or where they wait on the host, handed to the
    sink with the states; its loss is kept (`part_losses`)."""
    stats = self.sink.readable(stats)
    if self.accumulating:
      for layer_stats in stats:
        if 'loss' in layer_stats:
          self.part_losses.append(layer_stats['loss'])
      none = [None] * len(layers)
      if not self.plan.grads_on_host:  # They stay on the device.
        self.grads.update(zip(layers, slots))
        slots = none
      self.copy_back.push(
        protocols.CallUpdates(layers, none, slots, states, stats, self.part)
      )
      return
    self.stats.extend(stats)
    for i in layers:
      # Given up to the call (donated): its results replace them on their
      # way through the copy-back (`_kept_on_device`).
      self.on_device.pop(i, None)
    if self.ties:
      for layer, layer_weights in zip(layers, weights):
        for tie in self.ties.read_from(layer):
          if tie.layer in layers:
            continue  # Read inside the call itself (`Ties.in_call`).
          self.tied[(layer, tie.source_leaf)] = ties_lib.leaf(
            layer_weights, tie.source_leaf
          )
    self.copy_back.push(
      protocols.CallUpdates(layers, weights, slots, states, stats, self.part)
    )

  # The named points of the walk (`units.Units.walk`), in its order. A walk
  # on types does nothing at them; the step records its phases there and
  # frees device buffers where its settings say so.

  def begin(self, n_parts: int) -> None:
    """Before the step's first forward pass, over `n_parts` parts of the
    batch (1 without micro-batches); after it, the stack holds the
    batch (with micro-batches: `loss_weights` hold the batch's loss
    weights, and `begin_part` places each part)."""

  def begin_part(self, index: int, n_parts: int) -> None:
    """Before part `index`'s forward pass, of `n_parts` (0 of 1 without
    micro-batches); with micro-batches, sets `part` and places the part's
    rows as the stack."""

  def unit_done(self, unit: protocols.Unit) -> None:
    """After `unit`'s call in the pass `phase` ('forward' or 'backward')."""

  def end_pass(self, phase: str) -> None:
    """After the pass `phase`: 'forward', 'loss', then 'backward' (once
    every update has left the device)."""

  def end_part(self) -> None:
    """The end of a part's backward pass (the step's, without
    micro-batches): every update leaves the device (the next part reads
    the states this one wrote); after the last part the sink hears the
    walk's end (`protocols.UpdateSink.end_step`)."""
    self.copy_back.drain()
    if self.part is None or self.part.last:
      self.sink.end_step()


def host_params(
  layers: Sequence[tl.Layer],
  optimizers: Sequence[optimizer_base.Optimizer],
  on_device: bool = False,
) -> PyTree:
  """(weights, state, slots) of `layers` and their `optimizers` (lists by
  layer index), as the host keeps them between steps: where weights and
  slots stay on the device (`on_device`: `plan.StepPlan.params_on_device`),
  the states alone."""
  states = [layer.state for layer in layers]
  if on_device:
    return states
  return (
    [layer.weights for layer in layers],
    states,
    [optimizer.slots for optimizer in optimizers],
  )
