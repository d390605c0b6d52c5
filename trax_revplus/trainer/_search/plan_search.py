"""The search of one batch's shapes' candidate plans: the chosen and the least.

`PlanSearch` walks the candidates' groups (`candidates.Candidates.groups`,
fastest first), weighing plans through a `weighers.Weigher` (the
planner's `weighers.ShapesWeigher`: a plan settled against a budget
with as little compiling as decides it, or weighed whole). One search per
batch's shapes gives both answers a budget needs, so that the least named
when nothing fits and the least `estimate` prints are one:

  `fastest_fitting(budget)`: the first plan, in the speed model's order,
    whose peak fits, and the least bytes that excluded a faster one
    (`fitting(budget)`: the plans that fit, in that order, found one at a
    time as they are asked for: the planner times the first few);
  `least()`: the leanest plan of all and its figures, the least device
    memory the trainer can step in.

Both lean on one property of the plan space: a group's leanest plan needs
no more memory with more batch slices (each call's temporaries shrink with
its slice, and what the step holds does not grow) or more micro-batches
(the stack held across the step shrinks with its part). Groups that differ
in that one dimension form a family (`families.family`): where its members
with more slices or parts do not fit, those with fewer are not compiled,
and read the other way the property bounds them from below
(`group_bounds`), as every program compiled so far does
(`bounds.PlanBounds.lower`). The unsliced unfused groups are always weighed
all the same: their leanest plan is stock trax's own schedule, which a
budget of stock's peak must find, even where slicing a call that cannot
shrink adds a few bytes.

A plan fits where its peak device bytes are within the device budget and
its peak host bytes within the host budget (where there is one). A plan
one of whose programs the backend refuses to compile for memory
(`device_memory.ProgramOutOfMemoryError`) fits no budget: it counts as
needing more than the budget (or the bytes the refusal names) among those
that excluded a faster plan. `least()` prefers plans the backend compiled;
where it refused even every group's leanest plan, it raises `LeastRefused`.
"""

from typing import Callable, Iterator

from trax_revplus import device_memory
from trax_revplus.trainer._plan import plan as plan_lib
from trax_revplus.trainer._search import candidates as candidates_lib
from trax_revplus.trainer._search import families
from trax_revplus.trainer._search import group_bounds
from trax_revplus.trainer._search import weighers
from trax_revplus.trainer._search.families import FamilyKey
from trax_revplus.trainer._search.families import Group


# A prediction from another slicing over-counts the part of a call that
# does not shrink with its rows: a member predicted within this share over
# the budget is settled first all the same (settling decides exactly).
PIVOT_SLACK = 0.1


class LeastRefused(device_memory.ProgramOutOfMemoryError):
  """The backend refused to compile a program of every group's leanest
  plan for memory: no plan fits this device.

  Attributes (besides `device_memory.ProgramOutOfMemoryError`'s, those of
  the refusal with the fewest bytes known):
    plan: the leanest plan of that refusal.
  """

  def __init__(
    self,
    refused: device_memory.ProgramOutOfMemoryError,
    plan: plan_lib.StepPlan,
  ):
    self.plan = plan
    super().__init__(refused.cause, refused.program, refused.least_bytes)


class PlanSearch:
  """The candidate plans of one batch's shapes, searched by the budget.

  Attributes:
    faster_plans_need_bytes: after `fastest_fitting`, the least peak (or
      lower bound) bytes that excluded a plan faster than the one found;
      None where none was faster. While `fitting` is iterated, the same of
      the last plan it gave (or, once it gave all, of every plan it
      excluded).
  """

  def __init__(
    self, candidates: candidates_lib.Candidates, weigher: weighers.Weigher
  ):
    """Searches `candidates` (the shapes' `candidates.Candidates`),
    weighing through `weigher` (their `weighers.Weigher`)."""
    self._groups = list(candidates.groups())
    # The groups with the attention layers as the step runs them without
    # a budget, and those with one (example, head) pair at a time (the
    # least attention temporaries), each in the same order
    # (`Candidates.groups`): the i-th of each differ in their heads alone.
    self._configured_heads = candidates.configured_heads
    self._configured = self._with_heads(self._configured_heads)
    self._fewest_heads = (
      self._with_heads(1) if self._configured_heads != 1 else []
    )
    self._weigher = weigher
    self._least: tuple[plan_lib.StepPlan, device_memory.StepMemory] | None = (
      None
    )
    self.faster_plans_need_bytes: int | None = None
    # Family key -> [(value, group)], value ascending.
    self._families: dict[FamilyKey, list[tuple[int, Group]]] = {}
    for group in self._groups:
      key, value = families.family(group)
      self._families.setdefault(key, []).append((value, group))
    for members in self._families.values():
      members.sort(key=lambda m: m[0])
    self._bounds = group_bounds.GroupBounds(
      self._families, weigher.weighed, weigher.refused, weigher.lower
    )

  def fastest_fitting(
    self, budget_bytes: int, host_budget_bytes: int | None = None
  ) -> plan_lib.StepPlan | None:
    """The first plan `fitting` gives; None where none fits.

    Raises:
      As `fitting`.
    """
    return next(self.fitting(budget_bytes, host_budget_bytes), None)

  def fitting(
    self, budget_bytes: int, host_budget_bytes: int | None = None
  ) -> Iterator[plan_lib.StepPlan]:
    """The plans, in the speed model's order, whose peak is at most
    `budget_bytes` and whose peak host bytes are at most
    `host_budget_bytes` (None: any), each found as the next is asked
    for: the first, then the plans after it that fit (the rest of its
    group, then later groups, by the rules below). Before each is given,
    `faster_plans_need_bytes` is set to the least bytes that excluded a
    plan before it; once all are given, of every plan excluded.

    A group whose leanest plan needs more than the budget by what is known
    without compiling more (`group_bounds.GroupBounds.bound`: the programs
    compiled so far, the fused program's residuals, the family's rows
    bound) is skipped. Each group's fastest plan is settled first
    (`weighers.Weigher.settle`): where it fits, nothing else compiles (its
    programs are the step's own). Where it does not, the rest of the group
    is tried only where its leanest plan (one layer per call: the least
    compiling) fits. After the first unfused group whose leanest plan does
    not fit, each later group's leanest is weighed before its fastest.
    After that first one, or once a member of its family did not fit, a
    group is skipped where its family's least fitting member
    (`_least_fitting`, over its leanest plans) has more slices or parts.
    These rules weigh the device budget alone: a group's leanest plan needs
    the least device memory of the group, not the least host memory (saved
    inputs and states wait on the host there), so the host budget only
    excludes the plans it is weighed on.

    Raises:
      As `weigh`, but for `device_memory.ProgramOutOfMemoryError` (a plan
      that does not fit).
    """
    # Device bytes that excluded each faster plan or group.
    excluded: list[int] = []

    def fits_device(plan: plan_lib.StepPlan) -> bool:
      settled = self._weigher.settle(plan, budget_bytes)
      if isinstance(settled, int):
        excluded.append(settled)
        return False
      peak = settled.peak_device_bytes
      if peak > budget_bytes:
        excluded.append(peak)
      return peak <= budget_bytes

    def fits(plan: plan_lib.StepPlan) -> bool:
      # A host budget excludes plans, but not a device budget's range: the
      # host's memory changes from run to run.
      return fits_device(plan) and (
        host_budget_bytes is None
        or self._weigher.weigh(plan).peak_host_bytes <= host_budget_bytes
      )

    tight = False  # whether a group's leanest plan did not fit
    # Family key -> its least fitting value, or None.
    least_fitting: dict[FamilyKey, int | None] = {}
    # Families with a member whose leanest plan did not fit.
    short: set[FamilyKey] = set()

    def leanest_fits(group: Group) -> bool:
      bound = self._bounds.bound(group)
      if bound > budget_bytes:
        excluded.append(bound)
        return False
      return fits_device(group.leanest)

    for group in self._groups:
      bound = self._bounds.bound(group)
      if bound > budget_bytes:
        excluded.append(bound)
        self._weigher.ruled_out(group.leanest, bound, budget_bytes)
        continue
      key, value = families.family(group)
      if (tight or key in short) and not self._is_stock_schedule(group):
        if key not in least_fitting:
          least_fitting[key] = self._least_fitting(
            key, leanest_fits, budget_bytes
          )
        least = least_fitting[key]
        if least is None or value < least:
          continue
      first, rest = group.plans[0], group.plans[1:]
      # Once an unfused group did not fit even at its leanest, the budget
      # is tight: a later group's leanest is weighed first, so that a group
      # whose leanest does not fit costs that one accounting.
      if rest and tight and not fits_device(group.leanest):
        continue
      if fits(first):
        self.faster_plans_need_bytes = min(excluded, default=None)
        yield first
      else:
        if not rest:
          short.add(key)
          continue
        if not tight and not fits_device(group.leanest):
          tight = True
          short.add(key)
          continue
      for plan in rest:
        if fits(plan):
          self.faster_plans_need_bytes = min(excluded, default=None)
          yield plan
    self.faster_plans_need_bytes = min(excluded, default=None)

  def fastest(self) -> plan_lib.StepPlan:
    """The first plan in the speed model's order, whether it fits or not
    (the plan `fitting` weighs first)."""
    return self._groups[0].plans[0]

  def group_of(self, plan: plan_lib.StepPlan) -> Group:
    """The first candidate group listing `plan`.

    Raises:
      ValueError: no group lists it.
    """
    for group in self._groups:
      if plan in group.plans:
        return group
    raise ValueError(f'no candidate group lists {plan.describe()}')

  def _with_heads(self, heads: int | None) -> list[int]:
    """Indices of the groups whose plans set `heads` pairs at once."""
    return [
      i for i, g in enumerate(self._groups) if g.leanest.parallel_heads == heads
    ]

  def _is_stock_schedule(self, group: Group) -> bool:
    """Whether `group` holds stock trax's own schedule (`candidates`): the
    unsliced unfused group in one pass, without chunks, its attention
    layers as the step runs them without a budget."""
    return (
      not group.fused_reversible_layers
      and not any(
        families.used(group, name)
        for name in ('micro_batches', 'sequence_chunks', 'batch_slices')
      )
      and group.leanest.parallel_heads == self._configured_heads
    )

  def _least_fitting(
    self,
    key: FamilyKey,
    leanest_fits: Callable[[Group], bool],
    budget_bytes: int,
  ) -> int | None:
    """The least slices or parts of family `key` whose group's leanest plan
    fits (`leanest_fits(group)`); None where none does.

    A bisection whose pivot is the member with the fewest slices or parts
    predicted to fit (`weighers.Weigher.predicted`, from what is compiled,
    nothing traced), within `PIVOT_SLACK` over the budget, else the member
    with the most: where the prediction holds, the member found and the one
    below it are all it weighs.
    """
    members = self._families[key]
    lo, hi = 0, len(members)  # members[:lo] do not fit; members[hi:] fit
    near = budget_bytes * (1 + PIVOT_SLACK)

    def pivot() -> int:
      for i in range(lo, hi):
        predicted = self._weigher.predicted(members[i][1].leanest, walk=False)
        if predicted is not None and predicted <= near:
          return i
      return hi - 1

    while lo < hi:
      mid = pivot()
      if leanest_fits(members[mid][1]):
        hi = mid
      else:
        lo = mid + 1
    return members[hi][0] if hi < len(members) else None

  def least(self) -> tuple[plan_lib.StepPlan, device_memory.StepMemory]:
    """(plan, StepMemory) of the group leanest plan, fused or unfused, with
    the least peak (ties: the first in the speed model's order).

    Of each family (`families.family`), only the member with the most slices or
    parts is weighed, and the unsliced unfused groups (stock's schedule).
    The unfused ones are weighed first; a fused one whose lower bound
    (`group_bounds.GroupBounds`) is above the least peak
    found so far cannot need less, and is not compiled. Of the groups in
    sequence chunks, only those with the most chunks of their slicing are
    weighed (more chunks hold less: each chunk's temporaries shrink with
    its length, and nothing else the step holds changes), and only where the
    calls they do not change (all but the loss call) leave room below the
    least found (`GroupBounds.chunks`). Of the groups in micro-batches, only
    those with the most parts are weighed (without chunks and with the
    most), last. Of the groups with one (example, head) pair at a time,
    only the one of the least group found so far is weighed (fewer pairs
    at once shrink one call's attention temporaries, the same in every
    group); groups with more pairs at once than configured are never
    leaner, and none is weighed.

    A plan one of whose programs the backend refused to compile for
    memory counts after every plan it compiled.

    Raises:
      LeastRefused: the backend refused every leanest plan weighed.
      As `weigh` otherwise.
    """
    if self._least is None:
      # Each plan is settled below the least found, not the budget.
      self._weigher.searching_least()
      groups = [self._groups[i] for i in self._configured]
      # Batch slices -> most sequence chunks of its groups.
      most: dict[int, int] = {}
      for group in groups:
        if not families.used(group, 'micro_batches'):
          k = families.count(group, 'batch_slices')
          most[k] = max(
            most.get(k, 1), families.count(group, 'sequence_chunks')
          )
      # Of the groups in micro-batches, those of the most parts (the least
      # held across the step), without chunks and with the most.
      parts = max(
        (families.count(group, 'micro_batches') for group in groups), default=1
      )
      chunks = max(
        (
          families.count(group, 'sequence_chunks')
          for group in groups
          if families.count(group, 'micro_batches') == parts
        ),
        default=1,
      )
      leanest_of_family = {
        key: members[-1][1] for key, members in self._families.items()
      }
      order = sorted(
        (
          i
          for i, group in zip(self._configured, groups)
          if families.count(group, 'sequence_chunks')
          in (
            (1, chunks)
            if families.used(group, 'micro_batches')
            else (1, most[families.count(group, 'batch_slices')])
          )
          and families.count(group, 'micro_batches') in (1, parts)
          and (
            leanest_of_family[families.family(group)[0]] is group
            or self._is_stock_schedule(group)
          )
        ),
        key=lambda i: (
          bool(self._groups[i].fused_reversible_layers),
          families.used(self._groups[i], 'micro_batches'),
        ),
      )
      # The leanest predicted first, so that the least found early rules
      # the rest out uncompiled (`weighers.Weigher.settle` below it).
      predicted = {
        i: self._weigher.predicted(self._groups[i].leanest) for i in order
      }
      order.sort(key=lambda i: (predicted[i] is None, predicted[i] or 0))
      # Group index -> StepMemory of its leanest plan.
      found: dict[int, device_memory.StepMemory] = {}
      # Group index -> the refusal of its leanest plan.
      refused: dict[int, device_memory.ProgramOutOfMemoryError] = {}

      def weigh(i: int, below: int | None) -> None:
        # A plan ruled out below the least found needs no compiling.
        leanest = self._groups[i].leanest
        try:
          if below is None:
            found[i] = self._weigher.weigh(leanest)
            return
          settled = self._weigher.settle(leanest, below)
        except device_memory.ProgramOutOfMemoryError as e:
          refused[i] = e
          return
        if isinstance(settled, int):
          refusal = self._weigher.refused(leanest)
          if refusal is not None:
            refused[i] = refusal
          return
        found[i] = settled

      for i in order:
        # Only compiled plans bound the rest: a refusal's bytes are a
        # lower bound of what its plan needs.
        least = min((s.peak_device_bytes for s in found.values()), default=None)
        chunks_bound = self._bounds.chunks(self._groups[i])
        bound = max(
          self._bounds.leanest(self._groups[i]),
          self._bounds.rows(self._groups[i]),
        )
        if least is None or (bound <= least and chunks_bound < least):
          # Ties keep the first in order: a later one must need less.
          weigh(i, None if least is None else least - 1)
      i = self._least_of(found, refused)
      if self._fewest_heads:  # `i`'s, one pair at a time
        least = found[i].peak_device_bytes if i in found else None
        weigh(
          self._fewest_heads[self._configured.index(i)],
          None if least is None else least - 1,
        )
        i = self._least_of(found, refused)
      if i not in found:
        raise LeastRefused(refused[i], self._groups[i].leanest)
      self._least = (self._groups[i].leanest, found[i])
    return self._least

  @staticmethod
  def _least_of(
    found: dict[int, device_memory.StepMemory],
    refused: dict[int, device_memory.ProgramOutOfMemoryError],
  ) -> int:
    """The group index of the least plan: the least peak of those
    compiled (ties: the first), else the refusal with the fewest bytes
    known."""
    if found:
      return min(found, key=lambda i: (found[i].peak_device_bytes, i))
    return min(
      refused,
      key=lambda i: (
        refused[i].least_bytes is None,
        refused[i].least_bytes or 0,
        i,
      ),
    )
