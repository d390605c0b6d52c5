"""One training step's context: what its phases share, and its memory log.

`StepContext` is made once per step, in one place (`begin`), from the
step's fixed plan: it carries the step number, its placed RNGs and step,
the data stack and what the forward pass keeps for the backward pass; it
runs the units on placed arrays (a `run.Run`), hands each call's updates to
the commit queue when `run.CopyBack` says they leave the device, and times
the step's phases for the memory log.
"""

import time
from typing import Any, Callable, NamedTuple, Optional

import numpy as np
from trax_revplus import placement as placement_lib
from trax_revplus.trainer import run as run_lib


class TrainerParts(NamedTuple):
  """The parts of a trainer that its steps use (made once by the trainer).

  Attributes:
    placement: `placement.Placement`.
    store: `store.LayerStore`.
    commits: `commit.CommitQueue`.
    hooks: `hooks.StepHooks` (they observe the step; none changes it).
    memory_log: `memory.MemoryLog`.
    released_bytes: callable returning the host bytes released so far
      (`memory.host_release.HostMemoryReleaser`), or None when nothing is released.
  """
  placement: Any
  store: Any
  commits: Any
  hooks: Any
  memory_log: Any
  released_bytes: Optional[Callable[[], int]]


class _PhaseStart(NamedTuple):
  seconds: float  # time.time()
  transfers: tuple  # TransferCounter.snapshot()
  released_bytes: int


class StepContext(run_lib.Run):
  """One step's shared values; runs units on placed arrays.

  Attributes (besides `run.Run`'s):
    units: the plan's compiled `units.Units`, which the step walks.
    step: int, the training step.
    step_memory: `device_memory.StepMemory` of the plan on this batch's
      shapes, or None where it was not accounted: its peak goes into each
      recorded phase as peak_device_bytes.
  """

  def __init__(self, planned, step, stack, rngs, step_placed, parts):
    """Use `begin`."""
    super().__init__(planned.plan, stack, rngs, parts.store.opt_params,
                     step_placed)
    self.units = planned.units
    self.step = step
    self.step_memory = planned.memory
    self._placement = parts.placement
    self._store = parts.store
    self._commits = parts.commits
    self._hooks = parts.hooks
    self._log = parts.memory_log
    self._released_bytes = parts.released_bytes
    self._recording = self._log.should_record(step)
    self._per_layer = self._recording and self._log.per_layer
    self._unit_start_seconds = None
    self._phase_start = self._now()

  @classmethod
  def begin(cls, planned, step, rng, batch, parts):
    """Places the step and its per-layer RNGs, runs the hooks' `step_begins`,
    places the batch; starts timing phases.

    Args:
      planned: the `planner.Planned` of the batch's shapes (its plan and
        units are fixed for the step).
      step: int, the training step.
      rng: JAX PRNG key of the step, split into one per layer as trax does.
      batch: tuple of host arrays of shape (B, ...).
      parts: the trainer's `TrainerParts`.

    Returns:
      The `StepContext`.
    """
    placement = parts.placement
    step_placed = placement.replicate(np.asarray(step, dtype=np.int32))
    rngs = placement.place_rngs(rng, len(parts.store.layers))
    ctx = cls(planned, step, None, rngs, step_placed, parts)
    parts.hooks.step_begins(ctx)
    # Placed once the forward phase's clock runs (after any freeing): the
    # forward phase counts the batch's bytes.
    ctx.stack = placement.shard_batch(batch)
    return ctx

  # The units' run on placed arrays.

  def place(self, layers, with_slots):
    weights, slots = self._store.params(layers, with_slots)
    if with_slots:
      return self._placement.place_params((weights, slots))
    return self._placement.place_params(weights), None

  def state(self, layers):
    return self._placement.per_device(self._store.states(layers))

  def call(self, fn, args):
    return fn(*args)

  def params(self, unit, following, with_slots):
    params = super().params(unit, following, with_slots)
    self._unit_start_seconds = time.time()
    return params

  def forward_done(self, unit, outputs):
    self._hooks.forward_unit_done(unit, outputs)
    self._record_unit('forward', unit, self.stack)

  def updated(self, layers, weights, slots, states, stats):
    # Multi-process: every process reads every device's statistics (loss,
    # gradient norms), so all take the same decisions on them.
    super().updated(layers, weights, slots, states,
                    self._placement.replicated(stats))

  def to_host(self, entry):
    # Waits for the copy, so that the device buffers go (with the walk's
    # last reference) before the next call is dispatched, as accounted.
    return placement_lib.WaitingOnHost(entry, self._placement.transfers)

  def from_host(self, waiting):
    return waiting.place_back(self._placement.transfers)

  def start_copy_back(self, layers, weights, slots, states, stats):
    return self._commits.start(layers, weights, slots, states, stats)

  def leave(self, token):
    self._commits.commit(token)

  def backward_done(self, unit):
    self._hooks.backward_unit_done(unit)
    self._record_unit('backward', unit, self.grad_stack)

  def held_arrays(self):
    """Every array the step holds now, on the device or waiting on the
    host (to keep when freeing)."""
    return [tree for _, tree in self.held()] + [
        waiting.arrays() for waiting in self.on_host.values()]

  def block(self, tree):
    """Waits for the device arrays in `tree`."""
    self._placement.block(tree)

  # The memory log.

  @property
  def recording(self):
    """Whether the memory log records this step."""
    return self._recording

  def end_phase(self, phase, outputs=None, **fields):
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
      fields['host_released_bytes'] = (self._released_bytes() -
                                       start.released_bytes)
    peaks = {} if self.step_memory is None else self.step_memory.phase_peaks()
    if phase in peaks:
      fields['peak_device_bytes'] = self.step_memory.peak_device_bytes
      fields['phase_peak_device_bytes'] = peaks[phase]
    self._log.record(self.step, phase, seconds=time.time() - start.seconds,
                     h2d_bytes=h2d, d2h_bytes=d2h, **fields)
    self._phase_start = self._now()

  def _now(self):
    return _PhaseStart(
        time.time(), self._placement.transfers.snapshot(),
        0 if self._released_bytes is None else self._released_bytes())

  def _record_unit(self, phase, unit, outputs):
    """Per-layer record of a unit (a segment counts as one)."""
    if not self._per_layer:
      return
    self._placement.block(outputs)
    names = [self._store.layers[i].name for i in unit.layers]
    name = names[0] if len(names) == 1 else f'{names[0]}..{names[-1]}'
    self._log.record(self.step, phase, layer=unit.layers[0], layer_name=name,
                     n_layers=len(unit.layers),
                     seconds=time.time() - self._unit_start_seconds)

  def loss_and_stats(self):
    """(loss, stats) as `one_step` returns them."""
    joint_stats = {}
    for i, stat in enumerate(reversed(self.stats)):
      for k, v in stat.items():
        joint_stats[f'layer{i}/' + k] = v
    return self.stats[0]['loss'], joint_stats
