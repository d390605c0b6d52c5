"""`StepRun`: what a walk over a plan's units runs on, and what it holds.

`units.Units.walk` walks its units on a `StepRun`, which gives the units
their arguments and makes their calls: `step_context.StepContext` on placed
arrays (the step itself), or `on_types.AheadOfTime` on their types (compiling
ahead and accounting device memory). Both are this class, so what a step
holds on the device across each call (`StepRun.held`) and on the host
(`StepRun.held_on_host`), when an update leaves the device (`CopyBack`) and
where what a forward keeps for its backward waits (`StepRun.keep_saved`,
`StepRun.take_saved`) are written once, here, for the step, the
compile-ahead walk and the accounting alike.

Each call's updates go to the run's `UpdateSink`: the commit queue in a
real step (`commit.CommitQueue`), which copies them back to the host; in a
walk on types a sink that keeps only the types of what the host would
hold (`ahead`), where an update leaving the device only leaves
`StepRun.held`.
"""

import abc
from typing import Any, Callable, Sequence

from trax import layers as tl
from trax.optimizers import base as optimizer_base

from trax_revplus.trainer import ties as ties_lib
from trax_revplus.trainer._plan import plan as plan_lib
from trax_revplus.trainer._step import batch_parts
from trax_revplus.trainer._step import copy_back as copy_back_lib
from trax_revplus.trainer._step import protocols
from trax_revplus.typing import Array
from trax_revplus.typing import PyTree
from trax_revplus.typing import Stack

# The copy-back rule and its sink (`copy_back`), by their names here too.
commit_waits = copy_back_lib.commit_waits
CopyBack = copy_back_lib.CopyBack
UpdateSink = copy_back_lib.UpdateSink


def call_name(phase: str, unit: protocols.Unit,
              layers: Sequence[tl.Layer]) -> str:
  """What the memory figures and errors call a unit's call in `phase`, e.g.
  'backward layers 3..6', 'loss layer 9 (Serial)'.

  Args:
    phase: 'forward', 'loss' or 'backward'.
    unit: the unit called (its `layers`, indices in forward order).
    layers: the trainer's layers, by index.
  """
  first, last = unit.layers[0], unit.layers[-1]
  if phase == 'loss':
    return (f'loss layer {last} ({layers[last].name})'
            if first == last else f'loss program, layers {first}..{last}')
  if first == last:
    return f'{phase} layer {first} ({layers[first].name})'
  return f'{phase} layers {first}..{last}'


class StepRun(abc.ABC):
  """What a walk over a plan's units runs on; one per walk (a
  `protocols.Run`).

  A run sees each compiled call with its arguments (`call`) and what the
  step holds across it (`held`), so per-call accounting of device memory
  belongs in a run.

  Attributes:
    plan: the `plan.StepPlan` walked (fixed for the walk).
    stack: the data stack between units (trax's layout: one array or a
      tuple); the walks replace it as they go (None where they hold none).
    grad_stack: the cotangents of `stack`, from the loss on.
    saved: dict, layer index -> (inputs, new state) of a standard layer,
      (old state, new state) of a reversible one: what the forward pass
      keeps for the backward pass on the device (`keep_saved`).
    on_host: dict, layer index -> what `to_host` returned for its entry:
      the entries waiting on the host (`plan.StepPlan.saved_on_host`),
      held on no device (`held_on_host`).
    rngs: list of each layer's placed RNG, by layer index.
    opt_params: list of each layer's placed optimizer hyperparameters.
    step_placed: the step number, placed (int32).
    stats: list of each call's stats dicts, in commit order (the loss
      layer's first).
    phase: the pass the walk is in: 'forward', 'loss' or 'backward'.
    sink: the `protocols.UpdateSink` each call's updates go to.
    ties: the `ties.Ties` of the trainer's layers (weights several layers
      share).
    tied: dict, (layer, leaf) -> that leaf of the layer's update this step,
      kept for the backward of the earlier layer sharing it (`params`).
    part: the micro-batch's `Part` walked, or None without micro-batches
      (the plan's).
    loss_weights: with micro-batches, the loss weights of the whole batch,
      placed (each part's loss call takes them); else None.
    grads: dict, layer index -> its weight gradients accumulated over the
      step's earlier micro-batches, on the device (empty where they wait
      on the host: `plan.StepPlan.grads_on_host`).
    part_losses: the losses of the step's earlier micro-batches (each its
      share of the batch's loss).
  """

  def __init__(self, plan: plan_lib.StepPlan, stack: Stack | None,
               rngs: list[Array], opt_params: list[PyTree],
               step_placed: Array, sink: protocols.UpdateSink,
               ties: ties_lib.Ties | None = None):
    self.plan = plan
    self.stack: Stack | None = stack
    self.grad_stack: Stack | None = None
    self.saved: dict[int, PyTree] = {}
    self.on_host: dict[int, Any] = {}
    self.rngs = rngs
    self.opt_params = opt_params
    self.step_placed = step_placed
    self.stats: list[dict] = []
    self.phase = 'forward'
    self.sink = sink
    self.copy_back = CopyBack(plan.n_async_layers, sink)
    self.ties = ties if ties is not None else ties_lib.Ties()
    self.tied: dict[tuple[int, int], PyTree] = {}
    self.part: batch_parts.Part | None = None
    self.loss_weights: Array | None = None
    self.grads: dict[int, PyTree] = {}
    self.part_losses: list[Array] = []
    # (unit, its params) placed ahead of its call.
    self._next: tuple[protocols.Unit, Any] | None = None

  # What the device holds: one description for the step, the freeing of
  # device buffers and the accounting.

  def held(self) -> list[tuple[str, Any]]:
    """What the step holds on the device now, as named parts (pytrees).

    Each array counts in the first part that lists it. Saved entries
    waiting on the host (`on_host`) are not listed; placed back, they are
    their backward call's arguments, and the stack's after it.
    """
    return [
        ('optimizer hyperparameters', self.opt_params),
        ('step and RNGs', (self.step_placed, self.rngs)),
        ('stack', self.stack),
        ('cotangent stack', self.grad_stack),
        ('loss weights of the batch', self.loss_weights),
        ('accumulated gradients', self.grads),
        ('saved block inputs and states', self.saved),
        ('weights placed ahead', self._next and self._next[1]),
        ('updates not yet copied back', self.copy_back.on_device()),
        ('shared weights updated for an earlier layer', self.tied),
        ('statistics', self.stats),
    ]

  def held_on_host(self, devices_are_host: bool) -> list[tuple[str, Any]]:
    """What the step holds on the host now, as named parts (pytrees).

    Each array counts once, whole (every device's data), in the first part
    that lists it: each layer's weights, state and slots (kept there
    between steps); the batch the step was given; saved entries waiting on
    the host (`on_host`); what the sink keeps there (the gradients it adds
    up over micro-batches, the arrays it keeps to undo a step:
    `UpdateSink.held_on_host`); and host copies of updates not yet copied
    back (`CopyBack`: their copies are under way), except where the
    devices' buffers are host memory (`devices_are_host`, the CPU
    backend), where those copies are the device buffers themselves.
    Weights placed ahead (prefetch) hold device bytes only; a micro-batch's
    rows are a view of the batch, or a copy placed at once.
    """
    parts = [('weights, slots and state', self.host_params()),
             ('batch', self.host_batch()),
             ('saved block inputs and states waiting on the host',
              [self.waiting_arrays(w) for w in self.on_host.values()])]
    parts += self.sink.held_on_host()
    if not devices_are_host:
      parts.append(('updates being copied back', self.copy_back.on_device()))
    return parts

  def host_params(self) -> PyTree:
    """Every layer's host weights, state and slots (here: none)."""

  def host_batch(self) -> PyTree:
    """The batch the step was given, on the host (here: none)."""

  def waiting_arrays(self, waiting: Any) -> PyTree:
    """The host arrays of an entry `to_host` returned (here: the entry)."""
    return waiting

  # What the forward pass keeps for the backward pass, and where it waits.

  def keep_saved(self, entries: dict[int, PyTree]) -> None:
    """Keeps what a unit's forward saved for its backward: on the device,
    or where the plan says so, on the host (`to_host`).

    Args:
      entries: dict, layer index -> its entry (see `saved`).
    """
    for i, entry in entries.items():
      if self.plan.saved_on_host:
        self.on_host[i] = self.to_host(entry)
      else:
        self.saved[i] = entry

  def take_saved(self, layers: list[int]) -> list[PyTree]:
    """The entries of `layers`, on the device, taken out of the run: an
    entry waiting on the host is placed back (`from_host`) now, just
    before its unit's backward call, which takes it as an argument.

    Args:
      layers: list of layer indices whose forward kept an entry.

    Returns:
      List of their entries, in the order of `layers`.
    """
    return [self.saved.pop(i) if i in self.saved else
            self.from_host(self.on_host.pop(i)) for i in layers]

  def to_host(self, entry: PyTree) -> Any:
    """Moves a saved entry off the device; returns what `from_host`
    takes (here: the entry; leaving `held` for `held_on_host` is all a
    walk on types needs)."""
    return entry

  def from_host(self, waiting: Any) -> PyTree:
    """The entry `to_host` moved, on the device again."""
    return waiting

  # How the walk gets its arguments and makes its calls.

  @abc.abstractmethod
  def place(self, layers: list[int],
            with_slots: bool) -> tuple[list[PyTree], list[PyTree] | None]:
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

  def backward_fn_of(self, unit: protocols.Unit
                     ) -> Callable[..., Any] | None:
    """The compiled backward `unit` calls in this part of the step, or
    None where it compiles none (a reordering of the stack)."""
    return unit.accumulate_fn if self.accumulating else unit.backward_fn

  def place_ahead(self, unit: protocols.Unit, with_slots: bool) -> None:
    """Places `unit`'s parameters ahead of its call, if the plan
    prefetches (H2D overlaps the current call's work)."""
    if self.plan.prefetch:
      self._next = (unit, self.place(unit.layers,
                                     with_slots and not self.accumulating))

  def params(self, unit: protocols.Unit, following: protocols.Unit | None,
             with_slots: bool) -> tuple[list[PyTree], list[PyTree] | None]:
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
      params = self.place(unit.layers, with_slots and not self.accumulating)
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
  def gradients_from_host(self, layers: list[int],
                          weights: list[PyTree]) -> list[PyTree]:
    """The gradients of `layers` accumulated on the host over the step's
    earlier micro-batches, placed as their `weights` are (a list over
    `layers`)."""

  @abc.abstractmethod
  def duplicate(self, array: PyTree) -> PyTree:
    """A copy of the device array `array` that a call may donate."""

  # What happens to a call's updates.

  def updated(self, layers: list[int], weights: list[PyTree],
              slots: list[PyTree], states: list[PyTree],
              stats: list[dict]) -> None:
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
      self.copy_back.push(layers, none, slots, states, stats, self.part)
      return
    self.stats.extend(stats)
    if self.ties:
      for layer, layer_weights in zip(layers, weights):
        for tie in self.ties.read_from(layer):
          if tie.layer in layers:
            continue  # Read inside the call itself (`Ties.in_call`).
          self.tied[(layer, tie.source_leaf)] = ties_lib.leaf(
              layer_weights, tie.source_leaf)
    self.copy_back.push(layers, weights, slots, states, stats, self.part)

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
    walk's end (`UpdateSink.end_step`)."""
    self.copy_back.drain()
    if self.part is None or self.part.last:
      self.sink.end_step()


def host_params(layers: Sequence[tl.Layer],
                optimizers: Sequence[optimizer_base.Optimizer]) -> PyTree:
  """(weights, state, slots) of `layers` and their `optimizers` (lists by
  layer index), as the host keeps them between steps."""
  return ([layer.weights for layer in layers],
          [layer.state for layer in layers],
          [optimizer.slots for optimizer in optimizers])
