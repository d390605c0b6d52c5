"""The search of one batch's shapes' candidate plans: the chosen and the least.

`PlanSearch` walks the candidates' groups (`candidates.Candidates.groups`,
fastest first) with their lower bounds, weighing plans through one function
(the planner's `weigh`, which accounts a plan once per batch's shapes). The
same search gives both answers a budget needs:

  `fastest_fitting(budget)`: the first plan, in the speed model's order,
    whose peak fits, and the least bytes that excluded a faster one;
  `least()`: the leanest plan of all and its figures, the least device
    memory the trainer can step in.

The planner keeps one search per batch's shapes, so the least named when
nothing fits and the least `estimate` prints are one answer.
"""

import dataclasses
from typing import Callable

from trax_revplus import device_memory
from trax_revplus.trainer import candidates as candidates_lib
from trax_revplus.trainer import plan as plan_lib

Weigh = Callable[[plan_lib.StepPlan], device_memory.StepMemory]


class PlanSearch:
  """The candidate plans of one batch's shapes, searched by the budget.

  Attributes:
    faster_plans_need_bytes: after `fastest_fitting`, the least peak (or
      lower bound) bytes that excluded a plan faster than the one found;
      None where none was faster.
  """

  def __init__(self, candidates: candidates_lib.Candidates, n_devices: int,
               weigh: Weigh,
               weighed: Callable[[plan_lib.StepPlan],
                                 device_memory.StepMemory | None]):
    """Args:
      candidates: the shapes' `candidates.Candidates`.
      n_devices: devices a step runs on (for the lower bounds).
      weigh: plan -> its `device_memory.StepMemory`, raising as
        `planner.Planner.account`.
      weighed: plan -> its `StepMemory` where `weigh` accounted it
        already, else None (nothing accounted).
    """
    self._groups = list(candidates.groups())
    self._bounds = [candidates.lower_bound_bytes(group, n_devices)
                    for group in self._groups]
    self._weigh = weigh
    self._weighed = weighed
    self._least = None
    self.faster_plans_need_bytes = None

  def fastest_fitting(self, budget_bytes: int) -> plan_lib.StepPlan | None:
    """The first plan, in the speed model's order, whose peak is at most
    `budget_bytes`; None where none is.

    Each group's fastest plan is weighed first: where it fits, nothing else
    compiles (its programs are the step's own). Where it does not, the rest
    of the group is tried only where its leanest plan (one layer per call:
    the least compiling) fits; a fused group also needs the stack states it
    keeps within the budget (`Candidates.lower_bound_bytes`). After the
    first unfused group whose leanest plan does not fit, each later group's
    leanest is weighed before its fastest.

    Raises:
      As `weigh`.
    """
    excluded = []  # bytes that excluded each faster plan or group

    def fits(plan: plan_lib.StepPlan) -> bool:
      peak = self._weigh(plan).peak_device_bytes
      if peak > budget_bytes:
        excluded.append(peak)
      return peak <= budget_bytes

    found = None
    tight = False  # whether a group's leanest plan did not fit
    for group, bound in zip(self._groups, self._bounds):
      bound = max(bound, self._chunks_bound(group))
      if bound > budget_bytes:
        excluded.append(bound)
        continue
      first, rest = group.plans[0], group.plans[1:]
      # Once an unfused group did not fit even at its leanest, the budget
      # is tight: a later group's leanest is weighed first, so that a group
      # whose leanest does not fit costs that one accounting.
      if rest and tight and not fits(group.leanest):
        continue
      if fits(first):
        found = first
        break
      if not rest:
        continue
      if not tight and not fits(group.leanest):
        tight = True
        continue
      found = next((plan for plan in rest if fits(plan)), None)
      if found is not None:
        break
    self.faster_plans_need_bytes = min(excluded, default=None)
    return found

  def _chunks_bound(self, group) -> int:
    """Bytes every plan of a group in sequence chunks holds at least: the
    largest call but the loss call of its leanest plan without chunks
    (chunks change the loss call alone), where that plan was weighed;
    else 0."""
    if group.sequence_chunks == 1:
      return 0
    unchunked = self._weighed(
        dataclasses.replace(group.leanest, sequence_chunks=1))
    if unchunked is None:
      return 0
    return max((c.device_bytes for c in unchunked.calls
                if c.phase != 'loss'), default=0)

  def least(self) -> tuple[plan_lib.StepPlan, device_memory.StepMemory]:
    """(plan, StepMemory) of the group leanest plan, fused or unfused, with
    the least peak (ties: the first in the speed model's order).

    The unfused ones are weighed first; a fused one whose lower bound
    (`Candidates.lower_bound_bytes`) is above the least peak found so far
    cannot need less, and is not compiled. Of the groups in sequence
    chunks, only those with the most chunks of their slicing are weighed
    (more chunks hold less: each chunk's temporaries shrink with its
    length, and nothing else the step holds changes), and only where the
    calls they do not change (all but the loss call) leave room below the
    least found (`_chunks_bound`). Of the groups in micro-batches, only
    those with the most parts are weighed (without chunks and with the
    most), last.

    Raises:
      As `weigh`.
    """
    if self._least is None:
      groups = self._groups
      most = {}  # batch slices -> most sequence chunks of its groups
      for group in groups:
        if group.micro_batches == 1:
          k = group.leanest.batch_slices
          most[k] = max(most.get(k, 1), group.sequence_chunks)
      # Of the groups in micro-batches, those of the most parts (the least
      # held across the step), without chunks and with the most.
      parts = max((group.micro_batches for group in groups), default=1)
      chunks = max((group.sequence_chunks for group in groups
                    if group.micro_batches == parts), default=1)
      order = sorted(
          (i for i, group in enumerate(groups)
           if group.sequence_chunks in (
               (1, chunks) if group.micro_batches > 1 else
               (1, most[group.leanest.batch_slices])) and
           group.micro_batches in (1, parts)),
          key=lambda i: (bool(groups[i].fused_reversible_layers),
                         groups[i].micro_batches > 1))
      found = {}  # group index -> StepMemory of its leanest plan
      for i in order:
        least = min((s.peak_device_bytes for s in found.values()),
                    default=None)
        chunks_bound = self._chunks_bound(groups[i])
        if least is None or (self._bounds[i] <= least and
                             chunks_bound < least):
          found[i] = self._weigh(groups[i].leanest)
      i = min(found, key=lambda i: (found[i].peak_device_bytes, i))
      self._least = (groups[i].leanest, found[i])
    return self._least
