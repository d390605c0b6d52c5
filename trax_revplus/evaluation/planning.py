"""Planning an eval: the fewest row parts whose program fits the budget.

An eval's program (`functions.metrics_function`) runs the model over k
equal parts of the eval batch's rows inside one call. What it needs on the
device is XLA's figure for the compiled program (`device_memory.program`):
its arguments (the batch, the model's and metrics' weights and state, the
RNG), its outputs and its temporaries, less what aliases. The eval holds
nothing else on the device across the call, and between steps the trainer
holds only its optimizers' hyperparameters there (scalars), so that
figure is the eval's peak. It is planned under the
budget the trainer plans its step under (`trainer._search.budget`): the fewest
parts whose program fits, where one that the backend refuses to compile
for memory (`device_memory.is_out_of_memory`) does not. A part's
temporaries shrink with its rows; the arguments do not.
"""

import dataclasses
from typing import Callable, Sequence, TypeVar

from trax_revplus import byte_sizes
from trax_revplus import device_memory
from trax_revplus import errors
from trax_revplus.trainer._plan import options as options_lib
from trax_revplus.trainer._search import budget as budget_lib

T = TypeVar('T')


class EvalMemoryBudgetError(budget_lib.DeviceMemoryBudgetError):
  """An eval batch that no plan of the eval fits in the device memory
  budget (a ValueError).

  Attributes:
    least_bytes: int, the least budget the eval fits, or None where the
      backend refused the least plan's program.
  """

  def __init__(self, message: str, least_bytes: int | None = None):
    super().__init__(message)
    self.least_bytes = least_bytes


@dataclasses.dataclass(frozen=True)
class EvalPlan:
  """How an eval batch runs: the model over `parts` parts of its rows.

  Attributes:
    rows: int, the eval batch's rows.
    parts: int dividing `rows`; each part runs rows // parts rows.
    memory: `device_memory.ProgramMemory` of the compiled program (bytes
      on the device), or None where it was refused for memory.
  """

  rows: int
  parts: int
  memory: device_memory.ProgramMemory | None

  @property
  def peak_device_bytes(self) -> int | None:
    """The eval's peak device bytes: its program's call bytes."""
    return None if self.memory is None else self.memory.call_bytes

  def describe(self, budget_bytes: int | None) -> str:
    """One line: the parts, the peak and what makes it, the budget."""
    rows = self.rows // self.parts
    how = (
      f'the model over {self.parts} parts of {rows} rows'
      if self.parts > 1
      else f'the model on all {self.rows} rows'
    )
    m = self.memory
    size = lambda n: byte_sizes.format_bytes(n, unit=None)
    figures = (
      'refused for memory'
      if m is None
      else f'peak {size(m.call_bytes)}: arguments '
      f'{size(m.argument_bytes)}, temporaries {size(m.temp_bytes)}, '
      f'outputs {size(m.output_bytes - m.alias_bytes)}'
    )
    limit = (
      'no budget' if budget_bytes is None else f'budget {size(budget_bytes)}'
    )
    return f'{how}, then the metrics; {figures} ({limit})'


def divisors(n: int) -> list[int]:
  """The divisors of `n` >= 1, ascending."""
  return [d for d in range(1, n + 1) if n % d == 0]


def fewest_fitting(
  candidates: Sequence[T], fits: Callable[[T], bool]
) -> T | None:
  """The first of `candidates` that fits, where fitting is monotone (once
  one fits, every later one does): the first, then every index 2^i - 1
  up to the last, then bisection between the last that did not fit and
  the first that did; about 2 log2(n) calls of `fits`.

  Returns:
    The candidate, or None where the last does not fit.
  """
  below, i = -1, 0
  while not fits(candidates[i]):
    below = i
    if i == len(candidates) - 1:
      return None
    i = min(2 * i + 1, len(candidates) - 1)
  above = i
  while above - below > 1:
    middle = (below + above) // 2
    if fits(candidates[middle]):
      above = middle
    else:
      below = middle
  return candidates[above]


def search_parts(
  rows: int,
  weigh: Callable[[int], device_memory.ProgramMemory],
  budget_bytes: int | None,
  candidates: Sequence[int] | None = None,
) -> tuple[EvalPlan | None, EvalPlan | None, Exception | None]:
  """The fewest parts of `rows` rows whose program fits `budget_bytes`.

  Args:
    rows: int, the eval batch's rows.
    weigh: parts -> `device_memory.ProgramMemory` of that program,
      compiled; an error that `device_memory.is_out_of_memory` calls so
      counts as not fitting, any other is raised.
    budget_bytes: int bytes, or None: one part fits.
    candidates: the part counts to choose from, ascending (default: every
      divisor of `rows`).

  Returns:
    (the plan of the fewest parts that fit, None, None) or, where none
    fits, (None, the plan of the most parts, the backend's error where it
    refused that one for memory, else None).
  """
  weighed: dict[int, tuple[EvalPlan, Exception | None]] = {}

  def plan_of(parts: int) -> EvalPlan:
    if parts not in weighed:
      try:
        memory = weigh(parts)
      except Exception as e:  # pylint: disable=broad-except
        if not device_memory.is_out_of_memory(e):
          raise
        weighed[parts] = (EvalPlan(rows, parts, None), e)
      else:
        weighed[parts] = (EvalPlan(rows, parts, memory), None)
    return weighed[parts][0]

  if budget_bytes is None:
    return plan_of(1), None, None

  def fits(parts: int) -> bool:
    peak = plan_of(parts).peak_device_bytes  # None: refused for memory
    return peak is not None and peak <= budget_bytes

  candidates = divisors(rows) if candidates is None else candidates
  first = plan_of(candidates[0])
  if first.memory is not None and first.memory.argument_bytes > budget_bytes:
    # Arguments (weights, state, the batch) do not shrink with parts: none
    # fits, and the least is the most parts'.
    parts = None
    plan_of(candidates[-1])
  else:
    parts = fewest_fitting(candidates, fits)
  if parts is None:
    return (None, *weighed[candidates[-1]])
  return plan_of(parts), None, None


def nothing_fits(
  least: EvalPlan, refusal: Exception | None, budget_bytes: int
) -> EvalMemoryBudgetError:
  """The error where not even `least` (one row per part) fits; `refusal`
  is the backend's error where it refused the program for memory."""
  mib = lambda n: f'{n} bytes ({byte_sizes.format_bytes(n)})'
  # `refusal` is set exactly where `least` has no figure.
  need = (
    f'the backend refused its program for memory '
    f'({errors.one_line(refusal, max_chars=200)})'
    if refusal is not None
    else f'its program needs {mib(least.peak_device_bytes)}'
  )
  at_least = '' if least.memory is None else f' >= {least.peak_device_bytes}'
  return EvalMemoryBudgetError(
    f'the eval of a batch of {least.rows} rows does not fit '
    f'device_memory_budget_bytes={mib(budget_bytes)} even one row at a '
    f'time: {need}; set {options_lib.GIN_CONFIGURABLE}.'
    f'device_memory_budget_bytes{at_least}, or use a smaller eval batch '
    f'or shorter sequences.',
    least.peak_device_bytes,
  )
