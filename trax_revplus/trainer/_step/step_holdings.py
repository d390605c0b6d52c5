"""What a step holds across its calls, on the device and on the host.

`StepHoldings`, the base of `step_run.StepRun`, keeps the walk's state
(stacks, saved entries, accumulated gradients, statistics) and lists what
the step holds on the device (`held`) and on the host (`held_on_host`),
and where what a forward keeps for its backward waits (`keep_saved`,
`take_saved`). Separate from `step_run`, which gets the units' arguments,
makes their calls and hands on their updates, because the accounting of
memory reads the holdings alone.
"""

from typing import Any

from trax_revplus.trainer._plan import plan as plan_lib
from trax_revplus.trainer._step import batch_parts
from trax_revplus.trainer._step import protocols
from trax_revplus.trainer._step import ties as ties_lib
from trax_revplus.trainer._step.copy_back import CopyBack
from trax_revplus.typing import Array
from trax_revplus.typing import PyTree
from trax_revplus.typing import Stack


class StepHoldings:
  """What a walk's run holds, on the device and on the host (the base of
  `step_run.StepRun`).

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
    on_device: dict, layer index -> (weights, slots) kept on the device
      across steps (`plan.StepPlan.params_on_device`; empty otherwise):
      every layer's from the walk's `begin`, but while its update is on
      its way (`copy_back`: from its call until it leaves, it is the
      call's results), when it returns here.
  """

  def __init__(
    self,
    plan: plan_lib.StepPlan,
    stack: Stack | None,
    rngs: list[Array],
    opt_params: list[PyTree],
    step_placed: Array,
    sink: protocols.UpdateSink,
    ties: ties_lib.Ties | None = None,
  ):
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
    self.copy_back = CopyBack(
      plan.n_async_layers,
      sink,
      self._kept_on_device if plan.params_on_device else None,
    )
    self.on_device: dict[int, tuple[PyTree, PyTree]] = {}
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
      ('weights and slots kept on the device', self.on_device),
    ]

  def _kept_on_device(
    self, layers: list[int], weights: list[PyTree], slots: list[PyTree]
  ) -> None:
    """An update of `layers` left the copy-back: its weights and slots
    stay on the device (`on_device`)."""
    for i, w, s in zip(layers, weights, slots):
      self.on_device[i] = (w, s)

  def held_on_host(self, devices_are_host: bool) -> list[tuple[str, Any]]:
    """What the step holds on the host now, as named parts (pytrees).

    Each array counts once, whole (every device's data), in the first part
    that lists it: each layer's weights, state and slots (kept there
    between steps; its state alone where weights and slots stay on the
    device: `plan.StepPlan.params_on_device`); the batch the step was
    given; saved entries waiting on the host (`on_host`); what the sink
    keeps there (the gradients it adds up over micro-batches, the arrays
    it keeps to undo a step:
    `UpdateSink.held_on_host`); and host copies of updates not yet copied
    back (`CopyBack`: their copies are under way), except where the
    devices' buffers are host memory (`devices_are_host`, the CPU
    backend), where those copies are the device buffers themselves.
    Weights placed ahead (prefetch) hold device bytes only; a micro-batch's
    rows are a view of the batch, or a copy placed at once.
    """
    parts = [
      ('weights, slots and state', self.host_params()),
      ('batch', self.host_batch()),
      (
        'saved block inputs and states waiting on the host',
        [self.waiting_arrays(w) for w in self.on_host.values()],
      ),
    ]
    parts += self.sink.held_on_host()
    if not devices_are_host:
      pending = self.copy_back.on_device()
      if self.plan.params_on_device:  # Their states alone come back.
        pending = [states for _, _, states in pending]
      parts.append(('updates being copied back', pending))
    return parts

  def host_params(self) -> PyTree:
    """Every layer's host weights, state and slots; its state alone where
    the plan keeps weights and slots on the device (here: none)."""

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
    return [
      self.saved.pop(i)
      if i in self.saved
      else self.from_host(self.on_host.pop(i))
      for i in layers
    ]

  def to_host(self, entry: PyTree) -> Any:
    """Moves a saved entry off the device; returns what `from_host`
    takes (here: the entry; leaving `held` for `held_on_host` is all a
    walk on types needs)."""
    return entry

  def from_host(self, waiting: Any) -> PyTree:
    """The entry `to_host` moved, on the device again."""
    return waiting
