"""Candidate groups, and their families: groups that differ in their rows alone.

Groups in one pass that differ only in their batch slices, and groups in
micro-batches that differ only in their parts, form a family: its members'
leanest plans need no more memory the more slices or parts they have
(`plan_search`, which bounds and orders a family's members by that). The
roles of the plan's dimensions (`dimensions.PlanDimension.role`) say which
dimension tells a family's members apart. The candidates' `Group` is
declared here, where both the candidates and the search read it.
"""

import dataclasses

from trax_revplus.trainer._plan import dimensions
from trax_revplus.trainer._plan import plan as plan_lib

# The roles of the plan's dimensions the search bounds and orders by.
SLICES, PARTS = dimensions.SLICES, dimensions.PARTS
CHUNKS, AT_ONCE = dimensions.LOSS_CALL, dimensions.COMPUTED_AT_ONCE


@dataclasses.dataclass(frozen=True)
class Group:
  """Plans that share their fusion and slicing, fastest first.

  Attributes:
    plans: tuple of `plan.StepPlan`, in the speed model's order.
    leanest: the member that needs the least device memory (each member
      has its values of the plan's dimensions).
    fused_reversible_layers: reversible layers inside the loss program.
  """

  plans: tuple[plan_lib.StepPlan, ...]
  leanest: plan_lib.StepPlan
  fused_reversible_layers: int


# (`SLICES` or `PARTS`: the role that tells the family's members apart;
# fused or not; the other dimensions' values; sequence chunks last).
FamilyKey = tuple


def value(group: Group, role: str) -> int | None:
  """The value, in every plan of `group`, of the plan's dimension of
  `role` (`dimensions.PlanDimension.role`)."""
  return dimensions.value(group.leanest, role)


def count(group: Group, role: str) -> int:
  """`value` of a dimension whose values are counts (`SLICES`, `PARTS`,
  `CHUNKS`)."""
  found = value(group, role)
  assert isinstance(found, int)  # counts: their `PlanDimension.none` is 1
  return found


def used(group: Group, role: str) -> bool:
  """Whether `group`'s plans use the plan's dimension of `role` (its value
  is not the one that changes nothing)."""
  return dimensions.used(group.leanest, role)


def family(group: Group) -> tuple[FamilyKey, int]:
  """(family key, value): groups in one pass differ in their batch slices
  within (fused or not, the other dimensions' values); groups in
  micro-batches differ in their parts (their slices follow) within the
  other dimensions' values. A key's last item is its sequence chunks
  (`plan_search.PlanSearch`'s bound of chunked groups)."""
  rows = PARTS if used(group, PARTS) else SLICES
  others = tuple(
    getattr(group.leanest, d.name)
    for d in dimensions.DIMENSIONS
    if d.role not in (SLICES, PARTS, CHUNKS)
  )
  return (
    (rows, bool(group.fused_reversible_layers), *others, count(group, CHUNKS)),
    count(group, rows),
  )
