"""Bytes every plan of a candidate group needs at least, known without
compiling it: the bounds the plan search skips groups by.

Kept apart from `plan_search` (which walks the groups): each bound reads
the groups' families, the plans weighed so far and the lower bound of a
group's leanest plan (`bounds.PlanBounds.lower`, from programs compiled for
other plans), never the search's order.

A group's leanest plan needs no more memory with more batch slices or
more micro-batches (`plan_search`). The same property read the other way
bounds a family's members from below, without compiling them
(`GroupBounds.rows`): each of a call's
temporaries is a part that does not depend on the rows plus a part in
proportion to them, so a call over 1/m of the rows needs at least 1/m of
the temporaries, and what the step holds shrinks no faster; a member with
m times the slices or parts of one weighed needs at least 1/m of its
peak. On trax's enwik8 Reformer, where the whole-model (fused) program of
one row needs about 34 GiB on the CPU's accounting, this keeps the search
from compiling the fused program of more slices once that of fewer did
not fit (docs/device-memory.md).
"""

from typing import Callable

from trax_revplus import device_memory
from trax_revplus.trainer._plan import dimensions
from trax_revplus.trainer._plan import plan as plan_lib
from trax_revplus.trainer._search import families
from trax_revplus.trainer._search.families import FamilyKey
from trax_revplus.trainer._search.families import Group


class GroupBounds:
  """The lower bounds of one batch's shapes' candidate groups."""

  def __init__(
    self,
    members: dict[FamilyKey, list[tuple[int, Group]]],
    weighed: Callable[[plan_lib.StepPlan], device_memory.StepMemory | None],
    refused: Callable[
      [plan_lib.StepPlan], device_memory.ProgramOutOfMemoryError | None
    ],
    lower: Callable[[plan_lib.StepPlan], int] = lambda plan: 0,
  ):
    """Args:
    members: family key -> [(value, group)], value ascending
      (`families.family`).
    weighed: plan -> its `StepMemory` where the search accounted it
      already, else None.
    refused: plan -> its `device_memory.ProgramOutOfMemoryError` where
      the backend refused it, else None.
    lower: plan -> bytes it needs at least, known without compiling it
      (`bounds.PlanBounds.lower`).
    """
    self._families = members
    self._weighed = weighed
    self._refused = refused
    self._lower = lower

  def leanest(self, group: Group) -> int:
    """Bytes `group`'s leanest plan needs at least (`lower`): every plan
    of the group needs as much."""
    return self._lower(group.leanest)

  def bound(self, group: Group) -> int:
    """Bytes every plan of `group` needs at least, known without compiling
    it (`leanest`, `chunks`, `rows`)."""
    return max(self.leanest(group), self.chunks(group), self.rows(group))

  def rows(self, group: Group) -> int:
    """Bytes every plan of `group` needs at least, from each member of its
    family with fewer slices or parts whose leanest plan was weighed (its
    peak) or refused (the bytes the refusal names): that times its slices
    or parts over the group's (see the module docstring); else 0."""
    key, value = families.family(group)
    bound = 0
    for v, member in self._families.get(key, ()):
      if v >= value:
        break
      step = self._weighed(member.leanest)
      refusal = None if step is not None else self._refused(member.leanest)
      need = (
        step.peak_device_bytes
        if step is not None
        else refusal.least_bytes
        if refusal is not None
        else None
      )
      if need:
        bound = max(bound, need * v // value)
    return bound

  def chunks(self, group: Group) -> int:
    """Bytes every plan of a group in sequence chunks holds at least: the
    largest call but the loss call (chunks change the loss call alone) of
    each leanest plan without chunks, with as many slices or parts or more
    (which hold no more), that was weighed; else 0."""
    if not families.used(group, 'sequence_chunks'):
      return 0
    key, value = families.family(group)
    bound = 0
    unchunked_key = key[:-1] + (dimensions.by_name('sequence_chunks').none,)
    for v, unchunked in self._families.get(unchunked_key, ()):
      step = self._weighed(unchunked.leanest) if v >= value else None
      if step is not None:
        bound = max(
          bound,
          max(
            (c.device_bytes for c in step.calls if c.phase != 'loss'), default=0
          ),
        )
    return bound
