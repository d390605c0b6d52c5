"""Candidate groups, and their families: groups that differ in their rows alone.

Groups in one pass that differ only in their batch slices, and groups in
micro-batches that differ only in their parts, form a family: its members'
leanest plans need no more memory the more slices or parts they have
(`plan_search`, which bounds and orders a family's members by that):
`batch_slices` or `micro_batches` tells a family's members apart, and a
dimension named nowhere here keeps groups apart as families of their own.
The candidates' `Group` is declared here, where both the candidates and
the search read it.
"""

import dataclasses

from trax_revplus.trainer._plan import dimensions
from trax_revplus.trainer._plan import plan as plan_lib


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


# ('batch_slices' or 'micro_batches': the dimension that tells the
# family's members apart;
# fused or not; the other dimensions' values; sequence chunks last).
FamilyKey = tuple


def value(group: Group, name: str) -> int | None:
  """The value, in every plan of `group`, of the plan's dimension
  `name`."""
  return getattr(group.leanest, name)


def count(group: Group, name: str) -> int:
  """`value` of a dimension whose values are counts ('batch_slices',
  'micro_batches', 'sequence_chunks')."""
  found = value(group, name)
  assert isinstance(found, int)  # counts: their `PlanDimension.none` is 1
  return found


def used(group: Group, name: str) -> bool:
  """Whether `group`'s plans use the plan's dimension `name` (its value
  is not the one that changes nothing)."""
  return dimensions.used(group.leanest, name)


def family(group: Group) -> tuple[FamilyKey, int]:
  """(family key, value): groups in one pass differ in their batch slices
  within (fused or not, the other dimensions' values); groups in
  micro-batches differ in their parts (their slices follow) within the
  other dimensions' values. A key's last item is its sequence chunks
  (`plan_search.PlanSearch`'s bound of chunked groups)."""
  rows = 'micro_batches' if used(group, 'micro_batches') else 'batch_slices'
  others = tuple(
    getattr(group.leanest, d.name)
    for d in dimensions.DIMENSIONS
    if d.name not in ('batch_slices', 'micro_batches', 'sequence_chunks')
  )
  return (
    (
      rows,
      bool(group.fused_reversible_layers),
      *others,
      count(group, 'sequence_chunks'),
    ),
    count(group, rows),
  )
