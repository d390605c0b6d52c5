"""The walk ahead's update sink: the types of what a step keeps on the host.

`HostTypes` is the `protocols.UpdateSink` of `on_types.AheadOfTime`: where a
real step's commit queue (`commit.CommitQueue`) keeps updates on the host,
it keeps their types only, so that the walk ahead accounts the host bytes
the step holds across each call. Apart from on_types.py, which walks the
step and compiles its programs: this is the other end of the walk, what
leaves the device.
"""

from typing import Any

from trax import layers as tl
from trax.optimizers import base as optimizer_base

from trax_revplus.device_memory import program
from trax_revplus.trainer._step import copy_back
from trax_revplus.trainer._step import protocols
from trax_revplus.trainer._step import step_run as step_run_lib
from trax_revplus.typing import PyTree


class HostTypes:
  """The walk ahead's sink: the types of what a real step's commit queue
  (`commit.CommitQueue`) keeps on the host, nothing else.

  A micro-batch's gradients that wait on the host are added up there from
  their commit (one array per weight, whatever the parts) until the last
  part takes them (`take_gradients`); under `on_non_finite='skip'` each
  replaced host weight, slot and state stays until the step ends.
  """

  def __init__(
    self,
    layers: list[tl.Layer],
    optimizers: list[optimizer_base.Optimizer],
    keeps_replaced: bool,
  ):
    self._layers = layers
    self._optimizers = optimizers
    self._keeps_replaced = keeps_replaced
    # Layer index -> host types of its gradients.
    self._gradients: dict[int, PyTree] = {}
    # Host types of replaced weights, slots and state.
    self._replaced: list[PyTree] = []

  def readable(self, stats: PyTree) -> PyTree:
    """A call's statistics as the walk keeps them: as they are."""
    return stats

  def start(
    self, updates: protocols.CallUpdates
  ) -> tuple[list[int], list[PyTree] | None, bool]:
    accumulated, waiting = copy_back.accumulated_updates(updates)
    return updates.layers, updates.slots if waiting else None, not accumulated

  def commit(self, token: tuple[list[int], list[PyTree] | None, bool]) -> None:
    layers, gradients, updated = token
    if gradients is not None:
      for i, g in zip(layers, gradients):
        self._gradients.setdefault(i, program.host_types(g))
    elif updated and self._keeps_replaced:
      self._replaced.extend(
        program.host_types(
          step_run_lib.host_params([self._layers[i]], [self._optimizers[i]])
        )
        for i in layers
      )

  def take_gradients(self, layers: list[int]) -> None:
    """The last part takes the gradients of `layers` off the host."""
    for i in layers:
      self._gradients.pop(i, None)

  def end_step(self) -> None:
    self._gradients = {}
    self._replaced = []

  def held_on_host(self) -> list[tuple[str, Any]]:
    return [
      ('accumulated gradients on the host', self._gradients),
      ('weights, slots and state kept to undo a skipped step', self._replaced),
    ]
