"""The plan's dimensions: each declared once, read by whatever plans.

A plan dimension is a choice of `plan.StepPlan` that a trainer setting of
the same name pins (an int) or leaves to the device memory budget
('auto'): each changes a step's speed or device memory, never its result.
`DIMENSIONS` holds one `PlanDimension` per dimension, in `StepPlan`'s
field order, and the modules that plan read it instead of naming each:

  options      the setting's range (`allowed`) and its value without a
               budget (`unplanned`);
  plan         the plan's field and its value where unused (`none`);
  plan_store   the field, kept under its name in plans.json;
  shape_facts  the check of a pinned int against a batch's shapes
               (`check`, one `validation` error line);
  plan_search  how the search orders it (`role`);
  budget       how a least plan names it (`role`, `none`);
  overrides    why a budget may replace an explicit setting (`replaced`).

The units that run a dimension read its field of the plan; the candidates
(`candidates.Candidates`) enumerate its values in the speed model's order.
Adding a dimension: docs/architecture.md, "Adding a plan dimension".
"""

import contextlib
import dataclasses
from typing import Any, Callable, Iterator

from trax_revplus import validation
from trax_revplus.trainer._step import attention_heads

# Roles of a dimension in the search (`plan_search`): what its values do
# to the memory a step needs, which is what lets the search skip plans.
SLICES = 'slices'  # each call over 1/k of the rows: less per call
PARTS = 'parts'  # the step over 1/m of the rows at a time: less held
LOSS_CALL = 'loss call'  # changes the loss call alone
COMPUTED_AT_ONCE = 'computed at once'  # groups again, after all others

Check = Callable[[Any, Any, Any], None]


@dataclasses.dataclass(frozen=True)
class PlanDimension:
  """One dimension of the plan, as every planning module reads it.

  Attributes:
    name: str, the `plan.StepPlan` field, the trainer setting
      (`options.TrainerOptions`) and the plans.json key.
    allowed: str, the setting's range in an error line (before "or
      'auto'").
    unplanned: the value a step without a budget runs where the setting is
      'auto'.
    none: the plan's value where the dimension changes nothing (its
      `StepPlan` default).
    role: str, how `plan_search` bounds and orders its values: one of
      `SLICES`, `PARTS`, `LOSS_CALL`, `COMPUTED_AT_ONCE` (one dimension
      each), or another, whose groups the search keeps apart (families of
      their own) without bounding one by another.
    check: (value, shape facts, types) -> None, raising a
      `validation.ConfigurationError` where the value a step without a
      budget runs (`options.TrainerOptions.unplanned`) cannot run on a
      batch's shapes (`shape_facts.ShapeFacts`); None: any int in range
      can.
    replaced: str or None, why an explicit int a budget replaced did not
      run (`overrides.replaced`); None: a budget always runs it as given.
  """
  name: str
  allowed: str
  unplanned: Any
  none: Any
  role: str
  check: Check | None = None
  replaced: str | None = None


_SETTING = 'trax_revplus.ReversibleSerialTrainer'  # options.GIN_CONFIGURABLE


def check_slicing(options, rows: int) -> None:
  """Checks that the batch slices `options` sets divide each device's
  `rows` of the batch (as a step without a budget runs them).

  Args:
    options: `options.TrainerOptions`.
    rows: int, rows of the batch each device gets.

  Raises:
    validation.BatchSlicesError: they do not.
  """
  _check_slices_of_rows(options.unplanned('batch_slices'), rows)


def _check_slices_of_rows(batch_slices, rows):
  if rows % batch_slices:
    divisors = [k for k in range(1, rows + 1) if rows % k == 0]
    raise validation.BatchSlicesError(
        f'{_SETTING}.batch_slices = {batch_slices} '
        f'does not divide the {rows} rows of the batch each device gets; use '
        f'one of {divisors}, or a batch whose rows per device are a '
        f'multiple of {batch_slices}.')


def _check_slices(value, facts, types):
  """Raises validation.BatchSlicesError: `value` slices do not divide
  each device's rows."""
  _check_slices_of_rows(value, facts.rows(types))


def _check_chunks(sequence_chunks, facts, types):
  """Raises validation.SequenceChunksError: chunks > 1 where the loss
  layer has no tail to chunk (`loss_tail.tail_length`), or that do
  not divide its sequence length."""
  name = f'{_SETTING}.sequence_chunks'
  length = facts.trace(types)[1]
  if sequence_chunks == 1:
    return
  if length is None:
    raise validation.SequenceChunksError(
        f'{name} = {sequence_chunks}: the loss layer {facts.loss_name} does '
        f'not end in layers that act on each position alone and a weighted '
        f'mean or sum (the list: trax_revplus.trainer._step.loss_tail); set '
        f'it to 1.')
  if length % sequence_chunks:
    divisors = [c for c in range(1, min(length, 64) + 1) if length % c == 0]
    raise validation.SequenceChunksError(
        f'{name} = {sequence_chunks} does not divide the sequence length '
        f'{length} of the loss layer\'s inputs; use a divisor of {length}, '
        f'e.g. one of {divisors}.')


def _check_parts(micro_batches, facts, types):
  """Raises validation.MicroBatchesError: parts > 1 that do not divide
  each device's rows, whose part's rows the batch slices do not divide, or
  where the step cannot add its parts' gradients exactly
  (`batch_parts.refusal`)."""
  name = f'{_SETTING}.micro_batches'
  rows, batch_slices = facts.rows(types), facts.unplanned(SLICES)
  refusal = facts.parts_refusal(types)
  if micro_batches == 1:
    return
  if refusal is not None:
    raise validation.MicroBatchesError(
        f'{name} = {micro_batches}: {refusal}; set it to 1.')
  if rows % micro_batches:
    divisors = [m for m in range(1, rows + 1) if rows % m == 0]
    raise validation.MicroBatchesError(
        f'{name} = {micro_batches} does not divide the {rows} rows of the '
        f'batch each device gets; use one of {divisors}, or a batch whose '
        f'rows per device are a multiple of {micro_batches}.')
  part_rows = rows // micro_batches
  if part_rows % batch_slices:
    raise validation.MicroBatchesError(
        f'{name} = {micro_batches} leaves {part_rows} rows per device in '
        f'each part, which batch_slices = {batch_slices} does not divide; '
        f'use micro_batches and batch_slices whose product divides {rows}.')


def _check_heads(value, facts, types):
  del types  # the attention layers' heads do not depend on the batch
  attention_heads.check(facts.layers, value)


DIMENSIONS: list[PlanDimension] = [
    PlanDimension(
        'batch_slices', "an int >= 1 that divides each device's rows of the "
        'batch (1: no slices)', unplanned=1, none=1, role=SLICES,
        check=_check_slices,
        replaced='the plans with the slicing set do not fit'),
    PlanDimension(
        'sequence_chunks', 'an int >= 1 that divides the sequence length (1: '
        'no chunks)', unplanned=1, none=1, role=LOSS_CALL,
        check=_check_chunks),
    PlanDimension(
        'micro_batches', "an int >= 1 that divides each device's rows of the "
        'batch (1: one pass)', unplanned=1, none=1, role=PARTS,
        check=_check_parts),
    PlanDimension(
        'parallel_heads', 'an int >= 1 (1: one attention head at a time)',
        unplanned=None, none=None, role=COMPUTED_AT_ONCE,
        check=_check_heads),
]


def names() -> tuple[str, ...]:
  """The dimensions' names, in `DIMENSIONS` order."""
  return tuple(d.name for d in DIMENSIONS)


def of_role(role: str) -> PlanDimension:
  """The dimension of `role` (one of this module's roles).

  Raises:
    KeyError: no dimension has it.
  """
  for dimension in DIMENSIONS:
    if dimension.role == role:
      return dimension
  raise KeyError(role)


def by_name(name: str) -> PlanDimension:
  """The dimension `name`.

  Raises:
    KeyError: no dimension is called that.
  """
  for dimension in DIMENSIONS:
    if dimension.name == name:
      return dimension
  raise KeyError(name)


def values(plan) -> dict[str, Any]:
  """{name: value} of every dimension of `plan` (a `plan.StepPlan`)."""
  return {d.name: getattr(plan, d.name) for d in DIMENSIONS}


@contextlib.contextmanager
def registered(dimension: PlanDimension) -> Iterator[PlanDimension]:
  """`dimension` in `DIMENSIONS` (last) while the block runs, then out.

  For a dimension whose plan field and setting exist only for a while
  (tests); a dimension the package runs is an entry of `DIMENSIONS`.
  """
  DIMENSIONS.append(dimension)
  try:
    yield dimension
  finally:
    DIMENSIONS.remove(dimension)
