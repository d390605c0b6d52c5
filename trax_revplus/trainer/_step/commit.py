"""Committing updated weights, slots and state to the host, and the NaN guard.

The copy-back rule, stated here once: a compiled call's updates start their
device-to-host copies at once (`placement.Placement.start_to_host`), and
are committed (set on the layers and optimizers) when they leave the
device, once calls updating at least `n_async_layers` layers were
dispatched after them (0: at once), so the host work of committing overlaps
the device work of those calls (trax's "lazy unreplication").
`copy_back.commit_waits` computes it, and `copy_back.CopyBack` follows it
for the step and the accounting alike. `CommitQueue` is a real step's
`protocols.UpdateSink`, which copies and commits. Before a layer's
update is committed, the queue's `NonFiniteGuard` applies the
`on_non_finite` policy to its loss and gradient norm.
"""

from typing import Any, Callable, NamedTuple

from absl import logging
import jax
import numpy as np

from trax_revplus import placement as placement_lib
from trax_revplus import validation
from trax_revplus.trainer._step import copy_back
from trax_revplus.trainer._step import host_store
from trax_revplus.trainer._step import protocols
from trax_revplus.typing import PyTree

# What a layer update's results are checked for when `on_non_finite` is not
# 'ignore': the loss (loss layer) and the optimizer's gradient norm.
CHECKED_STATS = ('loss', 'gradients_l2')


class NonFiniteGuard:
  """Applies `on_non_finite` to each layer's update before its commit.

  'raise': the first update with a NaN/Inf loss or gradient norm raises
  `validation.NonFiniteError`. 'skip': the step commits nothing more and
  `end_step` puts back every weight, slot and state it replaced. 'ignore':
  nothing is checked.
  """

  def __init__(
    self,
    policy: str,
    store: host_store.LayerStore,
    describe_last_checkpoint: Callable[[], str],
  ):
    """Args:
    policy: 'raise', 'skip' or 'ignore' (`options.ON_NON_FINITE`).
    store: the trainer's `host_store.LayerStore` (layer names; rollback).
    describe_last_checkpoint: callable returning one clause on the last
      good checkpoint, for the error message (e.g. 'no checkpoint
      directory is set').
    """
    self._policy = policy
    self._store = store
    self._describe_last_checkpoint = describe_last_checkpoint
    self._step: int | None = None
    # (layer, what) once a skipped step went bad.
    self._skipping: tuple[int, str] | None = None
    # (layer, weights, slots, state) replaced this step.
    self._rollback: list[tuple[int, PyTree, PyTree, PyTree]] = []

  def begin_step(self, step: int) -> None:
    """Checks from now on belong to training step `step` (int)."""
    self._step = step

  def values_to_check(self, stats: dict) -> dict | None:
    """The values of a layer's `stats` to check, or None ('ignore')."""
    if self._policy == 'ignore':
      return None
    return {k: stats[k] for k in CHECKED_STATS if k in stats}

  def admits(self, i: int, values: dict | None) -> bool:
    """Whether layer i's update (checked `values`) may be committed.

    Returns:
      False once this step is being skipped; True otherwise.

    Raises:
      validation.NonFiniteError: policy 'raise' and a value is not finite.
    """
    if self._skipping is not None:
      return False
    if values is None:
      return True
    what = validation.first_non_finite(values)
    if what is None:
      return True
    if self._policy == 'skip':
      self._skipping = (i, what)
      return False
    raise self._error(i, what, values[what])

  def replacing(self, i: int) -> None:
    """Layer i's update is about to be committed (kept to undo a skip)."""
    if self._policy == 'skip':
      self._rollback.append((i,) + self._store.get(i))

  def kept_to_undo(self) -> list:
    """The replaced (weights, slots, state) kept to undo this step."""
    return [kept[1:] for kept in self._rollback]

  def end_step(self) -> None:
    """Undoes a skipped step's committed updates; forgets the rollback."""
    rollback, self._rollback = self._rollback, []
    if self._skipping is None:
      return
    i, what = self._skipping
    self._skipping = None
    for j, weights, slots, state in reversed(rollback):
      self._store.set(j, weights, slots, state)
    logging.warning(
      'step %d skipped: %s is not finite (layer %d %s); '
      'weights, slots and state are as before the step.',
      self._step,
      what,
      i,
      self._store.layers[i].name,
    )

  def _error(self, i, what, value):
    n_layers = len(self._store.layers)
    phase = 'loss' if i == n_layers - 1 else 'backward'
    value = np.asarray(value).ravel()
    value = value[~np.isfinite(value)][0]
    if phase == 'loss':
      kept = 'no weight was updated in this step'
    else:
      kept = (
        f'layers {i + 1}..{n_layers - 1} were already updated in '
        f'memory, layers 0..{i} were not'
      )
    given_up = self._store.given_up()
    if given_up:
      # Their calls replaced them on the device (`params_on_device`).
      kept += (
        f'; the weights and slots of layers {_spans(given_up)} kept on the '
        f'device were given up to calls of this step and are lost: this '
        f'trainer cannot step again (load the last checkpoint)'
      )
    step = self._step
    return validation.NonFiniteError(
      f'{what} is {value} at step {step} (phase {phase}, layer {i} '
      f'{self._store.layers[i].name}); {kept}; '
      f'{self._describe_last_checkpoint()}; lower the learning rate, '
      f'clip gradients (e.g. Adam.clip_grad_norm), check the data, or set '
      f"trax_revplus.ReversibleSerialTrainer.on_non_finite = 'skip'.",
      step=step,
      phase=phase,
      layer=i,
      what=what,
    )


def _spans(indices: list[int]) -> str:
  """Layer indices in words, runs as 'a..b': e.g. '0..3, 7'."""
  runs: list[list[int]] = []
  for i in indices:
    if runs and i == runs[-1][1] + 1:
      runs[-1][1] = i
    else:
      runs.append([i, i])
  return ', '.join(f'{a}' if a == b else f'{a}..{b}' for a, b in runs)


class _Staying(NamedTuple):
  """Updated weights or slots that stay on the device (`plan.StepPlan.
  params_on_device`): collected as they are, where a `placement.HostCopy`
  would copy them."""

  tree: PyTree

  def collect(self) -> PyTree:
    return self.tree


class _Pending(NamedTuple):
  """One compiled call's updates on their way to the host."""

  layers: list[int]  # commit (backward) order
  weights: Any  # placement.HostCopy (or _Staying) of a list over `layers`
  slots: Any  # the same; without weights, gradients to add up, or None
  state: Any
  checks: list[dict | None]  # NonFiniteGuard.values_to_check per layer
  part: Any  # the micro-batch's Part whose rows `state` holds, or None


class CommitQueue:
  """Commits updates to the host, through the non-finite guard it owns.

  A step's `copy_back.CopyBack` decides when an update leaves the device; this
  queue starts its device-to-host copies when it is dispatched (`start`)
  and commits it when it leaves (`commit`): each layer's update passes the
  guard, then its weights, slots and state are set on the host. A
  micro-batch's gradients that wait on the host (`plan.StepPlan.
  grads_on_host`) are added up here until the step's last part takes them
  (`take_gradients`).
  """

  def __init__(
    self,
    placement: placement_lib.Placement,
    store: host_store.LayerStore,
    on_non_finite: str,
    describe_last_checkpoint: Callable[[], str],
  ):
    """Args:
    placement: the trainer's `placement.Placement`.
    store: the trainer's `host_store.LayerStore`, where updates are
      committed.
    on_non_finite: 'raise', 'skip' or 'ignore' (`options.ON_NON_FINITE`).
    describe_last_checkpoint: callable returning one clause on the last
      good checkpoint, for the guard's error message.
    """
    self._placement = placement
    self._store = store
    self.guard = NonFiniteGuard(on_non_finite, store, describe_last_checkpoint)
    # Layer index -> host gradients added up.
    self._gradients: dict[int, PyTree] = {}
    self._params_on_device = False

  def begin_step(self, step: int, params_on_device: bool = False) -> None:
    """Commits from now on belong to training step `step` (int), whose plan
    keeps weights and slots on the device (`params_on_device`: they are
    committed as they are, with no copy) or not."""
    self.guard.begin_step(step)
    self._gradients = {}
    self._params_on_device = params_on_device

  def end_step(self) -> None:
    """After the step's last commit: undoes a skipped step (`'skip'`)."""
    self.guard.end_step()
    self._gradients = {}

  def held_on_host(self) -> list[tuple[str, Any]]:
    """The gradients added up so far, and under 'skip' the replaced host
    arrays kept to undo the step (`step_run.StepRun.held_on_host`)."""
    return [
      ('accumulated gradients on the host', self._gradients),
      (
        'weights, slots and state kept to undo a skipped step',
        self.guard.kept_to_undo(),
      ),
    ]

  def take_gradients(self, layers: list[int]) -> list[PyTree]:
    """The host gradients of `layers` added up over the step's committed
    micro-batches (each as its layer's weights; an empty tuple for a layer
    none was added for), taken out of the queue."""
    return [self._gradients.pop(i, ()) for i in layers]

  def readable(self, stats: PyTree) -> PyTree:
    """`stats` readable on every process (`placement.Placement.replicated`):
    in a multi-process run every process reads every device's statistics
    (loss, gradient norms), so all take the same decisions on them."""
    return self._placement.replicated(stats)

  def start(self, updates: protocols.CallUpdates) -> _Pending:
    """Starts the D2H copies of one call's updates; returns what `commit`
    takes."""
    p = self._placement
    layers, weights, slots, states, stats, part = updates
    accumulated, gradients = copy_back.accumulated_updates(updates)
    to_host: Callable[[Any], Any] = p.start_to_host
    if self._params_on_device and not accumulated:
      to_host = _Staying  # Committed as they are.
    return _Pending(
      layers,
      None if accumulated else to_host(weights),
      to_host(slots) if gradients or not accumulated else None,
      # The host keeps device 0's copy of each state, in the layer's own
      # shape S (no device axis), as stock trax's `_unreplicate` does; the
      # next step places it on every device again (`Placement.per_device`).
      # A replicated layer's state is the same on every device; a state a
      # device updates from its own rows (LSH's hash RNGs) continues as
      # device 0's, as in stock. So the host state, and the checkpoints
      # saved from it, do not depend on the device count that wrote them:
      # a resume on any device count starts from the same state.
      p.start_to_host(states, per_device=True),
      [self.guard.values_to_check(s) for s in stats],
      part,
    )

  def commit(self, entry: _Pending) -> None:
    """Commits one call's updates: each layer's weights, slots, state.

    Layers are checked and committed in the order of `entry` (backward order
    within a segment), so a non-finite value stops at the first bad layer.
    """
    state = entry.state.collect()
    if entry.weights is not None:
      weights, slots = entry.weights.collect(), entry.slots.collect()
    elif entry.slots is not None:
      gradients = entry.slots.collect()
    for k, i in enumerate(entry.layers):
      if not self.guard.admits(i, entry.checks[k]):
        return  # A skipped step commits nothing more.
      self.guard.replacing(i)
      if entry.part is not None:
        # A micro-batch's rows of the state, into the whole state.
        state[k] = entry.part.joined_state(
          self._store.layers[i], self._store.get(i)[2], state[k]
        )
      if entry.weights is None:  # Gradients accumulated; state only.
        self._store.set_state(i, state[k])
        if entry.slots is not None:
          self._add_gradients(i, gradients[k])
      else:
        self._store.set(i, weights[k], slots[k], state[k])

  def _add_gradients(self, i, gradients):
    """Adds a micro-batch's host gradients of layer i to the step's."""
    if i in self._gradients:
      gradients = jax.tree_util.tree_map(np.add, self._gradients[i], gradients)
    self._gradients[i] = gradients
