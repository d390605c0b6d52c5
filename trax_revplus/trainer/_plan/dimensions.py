"""The plan's dimensions: each declared once, read by whatever plans.

A plan dimension is a choice of `plan.StepPlan` that a trainer setting of
the same name pins (an int) or leaves to the device memory budget
('auto'): each changes a step's speed or device memory, never its result.
Each is declared where its `StepPlan` field is, as the field's metadata
(`field`: its check, its words, ...), and its setting where
the trainer's settings are (`options.dimension_setting`: its range and its
value without a budget). `declare` reads the plan's fields into
`DIMENSIONS`, one `PlanDimension` per dimension in field order, and the
modules that plan read that for what every dimension has:

  options      the setting's range and its value without a budget (the
               setting's own metadata);
  plan         the plan's field and its value where unused (`none`);
  plan_store   the field, kept under its name in plans.json, and what in a
               plan changes stock trax's summation order (`reorderings`);
  shape_facts  the check of a pinned int against a batch's shapes
               (`check`, one `validation` error line);
  candidates   the values the budget tries: any dimension it does not
               name runs its setting's value without a budget;
  families     which groups the search keeps apart: those that differ
               in a dimension it does not name;
  budget       how a least plan names it (`none`);
  overrides    why a budget may replace an explicit setting (`replaced`).

Where planning acts on one dimension in particular (the candidates'
values, the search's families, order and bounds), it names the dimension
by its field (`plan.batch_slices`, `options.pinned('batch_slices')`,
`by_name('batch_slices')`), so that grepping a dimension's name finds
everything that plans it. The units that run a dimension read its field
of the plan.
Adding a dimension: docs/architecture.md, "Adding a plan dimension".
"""

import contextlib
import dataclasses
from typing import Any, Callable, Collection, Iterator

from trax_revplus import validation
from trax_revplus.trainer._plan import options as options_lib

Check = Callable[[Any, Any, Any], None]
# The key of a dimension's entry in its `StepPlan` field's metadata.
_ENTRY = 'plan dimension'


@dataclasses.dataclass(frozen=True)
class PlanDimension:
  """One dimension of the plan, as every planning module reads it.

  Attributes:
    name: str, the `plan.StepPlan` field, the trainer setting
      (`options.TrainerOptions`) and the plans.json key.
    none: the plan's value where the dimension changes nothing (its
      `StepPlan` default).
    check: (value, shape facts, types) -> None, raising a
      `validation.ConfigurationError` where the value a step without a
      budget runs (`options.TrainerOptions.unplanned`) cannot run on a
      batch's shapes (`shape_facts.ShapeFacts`); None: any int in range
      can.
    replaced: str or None, why an explicit int a budget replaced did not
      run (`overrides.replaced`); None: a budget always runs it as given.
    reordering: (value) -> str, a value other than `none` in a line on
      what changes stock trax's float32 summation order (e.g. '2 batch
      slices'; `reorderings`); None: no value changes it.
  """

  name: str
  none: Any
  check: Check | None = None
  replaced: str | None = None
  reordering: Callable[[Any], str] | None = None


def field(none: Any, **entry: Any) -> Any:
  """A `plan.StepPlan` field that is a plan dimension: its default `none`,
  its entry (`PlanDimension`'s attributes but `name` and `none`, as
  keywords) in its metadata, which `declare` reads."""
  return dataclasses.field(default=none, metadata={_ENTRY: entry})


def of_plan(plan_class: type) -> list[PlanDimension]:
  """The dimensions of `plan_class`'s fields (`field`), in field order."""
  return [
    PlanDimension(f.name, f.default, **f.metadata[_ENTRY])
    for f in dataclasses.fields(plan_class)
    if _ENTRY in f.metadata
  ]


# The dimensions of `plan.StepPlan`, which `declare`s them.
DIMENSIONS: list[PlanDimension] = []


def declare(plan_class: type) -> type:
  """Class decorator: `DIMENSIONS` are `plan_class`'s (`of_plan`)."""
  DIMENSIONS[:] = of_plan(plan_class)
  return plan_class


@contextlib.contextmanager
def registered(plan_class: type) -> Iterator[list[PlanDimension]]:
  """`DIMENSIONS` are those of `plan_class` (a subclass of `StepPlan`
  with a field more: tests) while the block runs, then as they were."""
  before = list(DIMENSIONS)
  declare(plan_class)
  try:
    yield DIMENSIONS
  finally:
    DIMENSIONS[:] = before


def names() -> tuple[str, ...]:
  """The dimensions' names, in `DIMENSIONS` order."""
  return tuple(d.name for d in DIMENSIONS)


def by_name(name: str) -> PlanDimension:
  """The dimension `name`.

  Raises:
    KeyError: no dimension is called that.
  """
  for dimension in DIMENSIONS:
    if dimension.name == name:
      return dimension
  raise KeyError(name)


def used(plan: Any, name: str) -> bool:
  """Whether `plan` uses the dimension `name` (its value is not the one
  that changes nothing)."""
  return getattr(plan, name) != by_name(name).none


def unplanned(
  options: options_lib.TrainerOptions, excluded: Collection[str] = ()
) -> dict[str, Any]:
  """{name: value} of every dimension but those named in `excluded`, as
  `options` set it without a budget (`TrainerOptions.unplanned`)."""
  return {
    d.name: options.unplanned(d.name)
    for d in DIMENSIONS
    if d.name not in excluded
  }


def reorderings(plan: Any) -> list[str]:
  """What in `plan` (a `plan.StepPlan`) can change stock trax's float32
  summation order, in words (for `compare.exactness`, through
  plans.json): each dimension's value that has a `reordering`, in
  `DIMENSIONS` order, then the step compiled as one program (XLA may fuse
  a sum across layers)."""
  found = [
    d.reordering(getattr(plan, d.name))
    for d in DIMENSIONS
    if d.reordering is not None and getattr(plan, d.name) != d.none
  ]
  if plan.fused_from < plan.loss:
    found.append('the step as one program')
  return found


_SETTING = 'trax_revplus.ReversibleSerialTrainer'  # options.GIN_CONFIGURABLE


def _setting(name: str) -> str:
  return f'{_SETTING}.{name}'


def check_slicing(options: Any, rows: int) -> None:
  """Checks that the batch slices `options` sets divide each device's
  `rows` of the batch (as a step without a budget runs them).

  Args:
    options: `options.TrainerOptions`.
    rows: int, rows of the batch each device gets.

  Raises:
    validation.BatchSlicesError: they do not.
  """
  _check_slices_of_rows(options.unplanned('batch_slices'), rows)


def _check_slices_of_rows(slices: int, rows: int) -> None:
  if rows % slices:
    divisors = [k for k in range(1, rows + 1) if rows % k == 0]
    raise validation.BatchSlicesError(
      f'{_setting("batch_slices")} = {slices} '
      f'does not divide the {rows} rows of the batch each device gets; use '
      f'one of {divisors}, or a batch whose rows per device are a '
      f'multiple of {slices}.'
    )


def check_slices(value: int, facts: Any, types: Any) -> None:
  """Raises validation.BatchSlicesError: `value` slices do not divide
  each device's rows."""
  _check_slices_of_rows(value, facts.rows(types))


def check_chunks(chunks: int, facts: Any, types: Any) -> None:
  """Raises validation.SequenceChunksError: chunks > 1 where the loss
  layer has no tail to chunk (`loss_tail.tail_length`), or that do
  not divide its sequence length."""
  name = _setting('sequence_chunks')
  length = facts.trace(types)[1]
  if chunks == 1:
    return
  if length is None:
    raise validation.SequenceChunksError(
      f'{name} = {chunks}: the loss layer {facts.loss_name} does '
      f'not end in layers that act on each position alone and a weighted '
      f'mean or sum (the list: trax_revplus.trainer._step.loss_tail); set '
      f'it to 1.'
    )
  if length % chunks:
    divisors = [c for c in range(1, min(length, 64) + 1) if length % c == 0]
    raise validation.SequenceChunksError(
      f'{name} = {chunks} does not divide the sequence length '
      f"{length} of the loss layer's inputs; use a divisor of {length}, "
      f'e.g. one of {divisors}.'
    )


def check_parts(parts: int, facts: Any, types: Any) -> None:
  """Raises validation.MicroBatchesError: parts > 1 that do not divide
  each device's rows, whose part's rows the batch slices do not divide, or
  where the step cannot add its parts' gradients exactly
  (`batch_parts.refusal`)."""
  name, slices_name = _setting('micro_batches'), 'batch_slices'
  parts_name = 'micro_batches'
  rows, slices = facts.rows(types), facts.unplanned('batch_slices')
  refusal = facts.parts_refusal(types)
  if parts == 1:
    return
  if refusal is not None:
    raise validation.MicroBatchesError(
      f'{name} = {parts}: {refusal}; set it to 1.'
    )
  if rows % parts:
    divisors = [m for m in range(1, rows + 1) if rows % m == 0]
    raise validation.MicroBatchesError(
      f'{name} = {parts} does not divide the {rows} rows of the '
      f'batch each device gets; use one of {divisors}, or a batch whose '
      f'rows per device are a multiple of {parts}.'
    )
  part_rows = rows // parts
  if part_rows % slices:
    raise validation.MicroBatchesError(
      f'{name} = {parts} leaves {part_rows} rows per device in '
      f'each part, which {slices_name} = {slices} does not divide; '
      f'use {parts_name} and {slices_name} whose product divides {rows}.'
    )


def check_heads(value: int, facts: Any, types: Any) -> None:
  """Raises validation.TrainerOptionError: an attention layer cannot run
  `value` (example, head) pairs at once over each device's rows of the
  batch (`attention_heads.check`, which `facts.check_heads` runs on the
  trainer's layers)."""
  facts.check_heads(value, 'parallel_heads', facts.rows(types))
