"""One training step's context: what its phases share, and its memory log.

`StepContext` is created once per step (`begin`). It carries the step
number, its placed RNGs and step, the data stack and what the forward pass
keeps for the backward pass; it runs the units on placed arrays (a
`units.Run`), sends each call's updates to the commit queue, and times the
step's phases for the memory log.
"""

import time
from typing import Any, Callable, NamedTuple, Optional

import numpy as np
from trax import fastmath
from trax.fastmath import numpy as jnp

from trax_revplus.trainer import units


class TrainerParts(NamedTuple):
  """The parts of a trainer that its steps use (made once by the trainer).

  Attributes:
    placement: `placement.Placement`.
    store: `store.LayerStore`.
    commits: `commit.CommitQueue`.
    hooks: `hooks.StepHooks`.
    memory_log: `memory.MemoryLog`.
    released_bytes: callable returning the host bytes released so far
      (`host_memory.HostMemoryReleaser`), or None when nothing is released.
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


class StepContext(units.Run):
  """One step's shared values; runs units on placed arrays.

  Attributes (besides `units.Run`'s):
    step: int, the training step.
    stats: list of each call's stats dicts, in commit order (the loss
      layer's first).
  """

  def __init__(self, step, rngs, step_placed, parts):
    """Use `begin`."""
    super().__init__(rngs, parts.store.opt_params, step_placed)
    self.step = step
    self.stats = []
    self._placement = parts.placement
    self._store = parts.store
    self._commits = parts.commits
    self._hooks = parts.hooks
    self._log = parts.memory_log
    self._released_bytes = parts.released_bytes
    self._recording = self._log.should_record(step)
    # device_memory.StepMemory of the step's plan and shapes, or None: its
    # peak goes into each recorded phase as peak_device_bytes.
    self.step_memory = None
    self._per_layer = self._recording and self._log.per_layer
    self._unit_start_seconds = None
    self._phase_start = self._now()

  @classmethod
  def begin(cls, step, rng, parts):
    """Places the step and its per-layer RNGs; starts timing phases.

    Args:
      step: int, the training step.
      rng: JAX PRNG key of the step, split into one per layer as trax does.
      parts: the trainer's `TrainerParts`.

    Returns:
      The `StepContext`.
    """
    step_placed = parts.placement.replicate(np.asarray(step, dtype=np.int32))
    rngs = _place_rngs(parts.placement, rng, len(parts.store.layers))
    return cls(step, rngs, step_placed, parts)

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

  def advance(self, unit, following, with_slots):
    params = super().advance(unit, following, with_slots)
    self._unit_start_seconds = time.time()
    return params

  def forward_done(self, unit, outputs):
    self._hooks.forward_unit_done(unit, outputs)
    self._record_unit('forward', unit, self.stack)

  def updated(self, layers, weights, slots, states, stats):
    # Multi-process: every process reads every device's statistics (loss,
    # gradient norms), so all take the same decisions on them.
    stats = self._placement.replicated(stats)
    self.stats.extend(stats)
    self._commits.push(layers, weights, slots, states, stats)

  def backward_done(self, unit):
    self._hooks.backward_unit_done(unit)
    self._record_unit('backward', unit, self.grad_stack)

  def held(self):
    """What the step holds on devices now (to keep when freeing)."""
    return [self.stack, self.grad_stack, self.saved, self.kept, self.rngs,
            self.step_placed, self.prefetched, self.stats,
            self._commits.device_arrays()]

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


def _place_rngs(placement, rng, n_layers):
  """Per-layer RNGs as trax: split(rng, n_layers); per device first."""
  n = placement.n_devices
  if n == 1:
    rows = np.asarray(fastmath.random.split(rng, n_layers))
    return placement.place_params(list(rows))
  per_device = fastmath.random.split(jnp.asarray(np.asarray(rng)), n)
  table = np.stack([np.asarray(fastmath.random.split(r, n_layers))
                    for r in per_device], axis=1)  # (layers, devices, 2)
  return placement.per_device_rows(list(table))
