"""One training step's context: the walk's run on placed arrays.

`StepContext` is made once per step, in one place (`for_step`), from the
step's fixed plan: it carries the step number, its placed RNGs and step,
the data stack and what the forward pass keeps for the backward pass; it
runs the units on placed arrays (a `step_run.StepRun` whose sink is the
trainer's `commit.CommitQueue`). At the named points of the walk
(`units.Units.walk`) it is the one owner of what happens around the
units: it calls its observers (`observers`: the memory log's phase
records, host memory release), and where `free_accelerators_on_step` is
set it frees device buffers before the forward pass and after the loss.
"""

import time
from typing import Any, Callable, NamedTuple

import numpy as np
from trax.fastmath import numpy as jnp
from trax_revplus import memory as memory_lib
from trax_revplus import placement as placement_lib
from trax_revplus.trainer._step import batch_parts
from trax_revplus.trainer._step import commit as commit_lib
from trax_revplus.trainer._step import host_store as store_lib
from trax_revplus.trainer._step import observers as observers_lib
from trax_revplus.trainer._step import protocols
from trax_revplus.trainer._step import step_run as step_run_lib
from trax_revplus.trainer._step import units as units_lib
from trax_revplus.typing import Array
from trax_revplus.typing import Batch
from trax_revplus.typing import PRNGKey
from trax_revplus.typing import PyTree


class TrainerParts(NamedTuple):
  """The parts of a trainer that its steps use (made once by the trainer).

  Attributes:
    placement: `placement.Placement`.
    store: `store.LayerStore`.
    commits: `commit.CommitQueue`, the steps' `protocols.UpdateSink`.
    memory_log: `memory.MemoryLog`.
    release: `observers.ReleaseHostMemory`, or None when host memory is
      not released.
    free_accelerators: bool, free device buffers before the forward pass
      and after the loss (`free_accelerators_on_step`).
  """

  placement: placement_lib.Placement
  store: store_lib.LayerStore
  commits: commit_lib.CommitQueue
  memory_log: memory_lib.MemoryLog
  release: observers_lib.ReleaseHostMemory | None
  free_accelerators: bool


class StepContext(step_run_lib.StepRun):
  """One step's shared values; runs units on placed arrays.

  Attributes (besides `step_run.StepRun`'s):
    units: the plan's compiled `units.Units`, which the step walks.
    step: int, the training step.
    unit_start_seconds: time.time() when the current unit's parameters
      were ready (its call began).
    calling: the name of the last call dispatched (`step_run.call_name`),
      or None before the first: where a device error of the step arose.
    planned_peak_bytes: the step's accounted peak device bytes, or None
      where it was not accounted.
  """

  def __init__(
    self,
    planned: units_lib.PlannedStep,
    step: int,
    batch: Batch,
    rngs: list[PRNGKey],
    step_placed: Array,
    parts: TrainerParts,
  ):
    """Use `for_step`."""
    super().__init__(
      planned.plan,
      None,
      rngs,
      parts.store.opt_params,
      step_placed,
      parts.commits,
      parts.store.ties,
    )
    self.units = planned.units
    self.step = step
    self.unit_start_seconds: float | None = None
    self.calling: str | None = None
    self.planned_peak_bytes = (
      None if planned.memory is None else planned.memory.peak_device_bytes
    )
    self._unit: protocols.Unit | None = None
    # Placed when the walk begins (`begin`, `begin_part`); then None.
    self._batch: Batch | None = batch
    # The caller holds the batch for the whole step (`held_on_host`).
    self._host_batch = batch
    self._placement = parts.placement
    self._store = parts.store
    self._commits = parts.commits
    self._free_accelerators = parts.free_accelerators
    self._step_memory = planned.memory
    release = parts.release
    self._recorder = observers_lib.PhaseRecorder(
      step,
      planned.memory,
      parts.placement,
      parts.store.layers,
      parts.memory_log,
      release.released_bytes if release else None,
    )
    # In this order at each point: a release is counted in the phase
    # record that follows it.
    self._observers: list[protocols.StepObserver] = [
      o for o in (release, self._recorder) if o is not None
    ]

  @classmethod
  def for_step(
    cls,
    planned: units_lib.PlannedStep,
    step: int,
    rng: PRNGKey,
    batch: Batch,
    parts: TrainerParts,
  ) -> 'StepContext':
    """Places the step and its per-layer RNGs; starts timing phases. The
    batch is placed when the walk begins (`begin`).

    Args:
      planned: the `units.PlannedStep` of the batch's shapes (its plan and
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
    return cls(planned, step, batch, rngs, step_placed, parts)

  def host_working_set_bytes(self) -> int:
    """Host bytes the step's own device buffers take: its accounted peak
    on all devices where they are the host's memory (the CPU backend),
    else (or where not accounted) 0."""
    if self._placement.platform != 'cpu' or self._step_memory is None:
      return 0
    return self._step_memory.peak_device_bytes * self._placement.n_devices

  def host_figures(self, host_rss_backend_open_bytes: int) -> dict:
    """The fields of the memory log's 'step' record that a run's measured
    host peak is compared with: `peak_host_bytes`, the step's accounted
    host peak (where accounted), and `host_rss_backend_open_bytes`, the
    process's RSS when its trainer was made."""
    fields = {'host_rss_backend_open_bytes': host_rss_backend_open_bytes}
    if self._step_memory is not None:
      fields['peak_host_bytes'] = self._step_memory.peak_host_bytes
    return fields

  # The named points of the walk.

  def begin(self, n_parts: int) -> None:
    """Frees device buffers (where set); then places the batch (with
    micro-batches: its loss weights): once the forward phase's clock runs,
    so that the forward phase counts its bytes."""
    if self._free_accelerators:
      self._free_device_buffers(self._store.keep())
    if self.plan.params_on_device:
      # Placed once (no copy where they stayed on the device since the
      # last step's updates).
      layers = range(len(self._store.layers))
      weights, slots = self._store.params(list(layers), with_slots=True)
      assert slots is not None
      self.on_device = dict(
        zip(layers, self._placement.place_params(list(zip(weights, slots))))
      )
    batch = self._batch
    assert batch is not None  # the walk begins once
    if n_parts == 1:
      self.stack = self._placement.shard_batch(batch)
      self._batch = None
      return
    item = batch_parts.loss_weights_item(self._store.layers, len(batch))
    assert item is not None  # else micro-batches refused (`refusal`)
    self.loss_weights = self._placement.shard_batch(batch[item])

  def begin_part(self, index: int, n_parts: int) -> None:
    if n_parts == 1:
      return
    part, rows = batch_parts.part_of_batch(
      self._batch, index, n_parts, self._placement.n_local_devices
    )
    self.part = part
    self.stack = self._placement.shard_batch(rows)
    if part.last:
      self._batch = None

  def unit_done(self, unit: protocols.Unit) -> None:
    for observer in self._observers:
      observer.unit_done(self, unit)

  def end_pass(self, phase: str) -> None:
    for observer in self._observers:
      observer.pass_ends(self, phase)
    if phase == 'loss' and self._free_accelerators:
      # The activations and cotangents wait on the host meanwhile.
      self.stack, self.grad_stack = self._placement.gather_to_host(
        (self.stack, self.grad_stack)
      )
      self._free_device_buffers([self._store.keep()] + self._held_arrays())

  def _free_device_buffers(self, keep):
    """Frees the device buffers nothing alive reads besides `keep`
    (`placement.Placement.free_device_buffers`, as trax's Loop mode 2);
    a 'free' phase of the memory log."""
    freed_arrays, freed_bytes = self._placement.free_device_buffers(keep)
    self._recorder.end_phase(
      'free', freed_arrays=freed_arrays, freed_bytes=freed_bytes
    )

  def _held_arrays(self):
    """Every array the step holds now, on the device or waiting on the
    host (to keep when freeing)."""
    return [tree for _, tree in self.held()] + [
      waiting.arrays() for waiting in self.on_host.values()
    ]

  # The units' run on placed arrays.

  def place(
    self, layers: list[int], with_slots: bool
  ) -> tuple[list[PyTree], list[PyTree] | None]:
    weights, slots = self._store.params(layers, with_slots)
    if with_slots:
      return self._placement.place_params((weights, slots))
    return self._placement.place_params(weights), None

  def state(self, layers: list[int]) -> list[PyTree]:
    states = self._store.states(layers)
    if self.part is not None:
      states = [
        self.part.state(self._store.layers[i], state)
        for i, state in zip(layers, states)
      ]
    return self._placement.per_device(states)

  def call(self, fn: Callable[..., Any], args: tuple) -> PyTree:
    assert self._unit is not None  # each call's unit takes its `params`
    self.calling = step_run_lib.call_name(
      self.phase, self._unit, self._store.layers
    )
    return fn(*args)

  def host_params(self) -> PyTree:
    return step_run_lib.host_params(
      self._store.layers, self._store.optimizers, self.plan.params_on_device
    )

  def host_batch(self) -> PyTree:
    return self._host_batch

  def waiting_arrays(self, waiting: Any) -> PyTree:
    return waiting.arrays()

  def gradients_from_host(
    self, layers: list[int], weights: list[PyTree]
  ) -> list[PyTree]:
    del weights  # Placed as weights are: `Placement.place_params`.
    return self._placement.place_params(self._commits.take_gradients(layers))

  def duplicate(self, array: PyTree) -> PyTree:
    return jnp.copy(array)

  def params(
    self,
    unit: protocols.Unit,
    following: protocols.Unit | None,
    with_slots: bool,
  ) -> tuple[list[PyTree], list[PyTree] | None]:
    params = super().params(unit, following, with_slots)
    self._unit = unit
    self.unit_start_seconds = time.time()
    return params

  def to_host(self, entry: PyTree) -> placement_lib.WaitingOnHost:
    # Waits for the copy, so that the device buffers go (with the walk's
    # last reference) before the next call is dispatched, as accounted.
    return placement_lib.WaitingOnHost(entry, self._placement.transfers)

  def from_host(self, waiting: Any) -> PyTree:
    return waiting.place_back(self._placement.transfers)

  def block(self, tree: PyTree) -> None:
    """Waits for the device arrays in `tree`."""
    self._placement.block(tree)

  def loss_and_stats(self) -> tuple[Array, dict[str, Array]]:
    """(loss, stats) as `one_step` returns them."""
    joint_stats = {}
    for i, stat in enumerate(reversed(self.stats)):
      for k, v in stat.items():
        joint_stats[f'layer{i}/' + k] = v
    # With micro-batches each part's loss is its share of the batch's.
    return sum(self.part_losses, self.stats[0]['loss']), joint_stats
