"""When a call's updates leave the device: the copy-back rule.

`CopyBack` keeps each call's updates on the device until `commit_waits`
says they leave, and hands them to a `protocols.UpdateSink` on the way:
the commit queue in a real step (`commit.CommitQueue`), which copies them
to the host; in a walk on types (`on_types.AheadOfTime`) a sink that keeps
only the types of what the host would hold (`host_types.HostTypes`). The
step and the accounting follow this one rule (`step_run.StepRun` holds a
`CopyBack`).
"""

import collections
from typing import Any, Callable

from trax_revplus.trainer._step import protocols
from trax_revplus.typing import PyTree


def commit_waits(pending_sizes: list[int], n_async_layers: int) -> int:
  """How many of the newest pending calls stay on the device after a push,
  by the copy-back rule (`commit`).

  Args:
    pending_sizes: list of int, layers each pending call updated, oldest
      first (the newest included).
    n_async_layers: int >= 0.

  Returns:
    int, how many of the newest calls remain pending.
  """
  pending = list(pending_sizes)
  total = sum(pending)
  while pending and total - pending[0] >= n_async_layers:
    total -= pending.pop(0)
  return len(pending)


def accumulated_updates(updates: protocols.CallUpdates) -> tuple[bool, bool]:
  """How one call's updates came to `protocols.UpdateSink.start`:
  (whether the call only accumulated gradients: its weights are None;
  whether the part's gradients then wait on the host in the slots' place:
  `plan.StepPlan.grads_on_host`). Both False for a call that updated."""
  weights, slots = updates.weights, updates.slots
  accumulated = weights[0] is None if weights else False
  on_host = accumulated and slots is not None and slots[0] is not None
  return accumulated, on_host


class CopyBack:
  """Updates on their way from the device to the host, oldest first.

  A call's updates are pushed as they are dispatched and handed to the
  sink (`protocols.UpdateSink.start`); once `commit_waits` says so, they
  leave the device (`protocols.UpdateSink.commit`: a real step commits
  them to the host and the device buffers are released). Until then they
  are held on the device (`on_device`).
  """

  def __init__(
    self,
    n_async_layers: int,
    sink: protocols.UpdateSink,
    kept: Callable[[list[int], list[PyTree], list[PyTree]], None] | None = None,
  ):
    """Args: n_async_layers, int >= 0 (`commit_waits`); sink, the
    `protocols.UpdateSink` the updates go to; kept, where the weights and
    slots stay on the device across steps (`plan.StepPlan.
    params_on_device`), called with (layers, weights, slots) of each
    update as it leaves (they stay on the device), else None."""
    self._n_async_layers = n_async_layers
    self._sink = sink
    self._kept = kept
    # (layers, device updates, token)
    self._pending: collections.deque[tuple[list[int], Any, Any]] = (
      collections.deque()
    )

  def push(self, updates: protocols.CallUpdates) -> None:
    """One call's updates, handed to the sink on their way."""
    token = self._sink.start(updates)
    self._pending.append(
      (
        updates.layers,
        (updates.weights, updates.slots, updates.states),
        token,
      )
    )
    waiting = commit_waits(
      [len(n) for n, _, _ in self._pending], self._n_async_layers
    )
    while len(self._pending) > waiting:
      self._leave()

  def drain(self) -> None:
    """Every waiting update leaves, oldest first."""
    while self._pending:
      self._leave()

  def _leave(self) -> None:
    """The oldest update leaves: to the sink, and where weights and slots
    stay on the device, back to what the walk keeps there (`kept`)."""
    layers, (weights, slots, _), token = self._pending.popleft()
    self._sink.commit(token)
    if self._kept is not None and weights and weights[0] is not None:
      self._kept(layers, weights, slots)

  def on_device(self) -> list[Any]:
    """The updates still held on the device (weights, slots, states)."""
    return [updates for _, updates, _ in self._pending]
