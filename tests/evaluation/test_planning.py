"""Planning an eval: the fewest row parts whose program fits the budget.

References: an exhaustive search over the candidates (`fewest_fitting`),
and programs whose figures are given (`search_parts`), some refused by the
backend for memory as a TPU refuses an over-budget program when it
compiles it.
"""

import jax
import pytest

from trax_revplus import device_memory
from trax_revplus.evaluation import planning


def _memory(call_bytes):
  return device_memory.ProgramMemory(
    argument_bytes=100,
    output_bytes=4,
    alias_bytes=0,
    temp_bytes=call_bytes - 104,
  )


def _refused():
  return jax.errors.JaxRuntimeError(
    'RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm. Used '
    '17.2G of 15.7G hbm.'
  )


def test_divisors():
  assert planning.divisors(1) == [1]
  assert planning.divisors(8) == [1, 2, 4, 8]
  assert planning.divisors(12) == [1, 2, 3, 4, 6, 12]


@pytest.mark.parametrize('n', [1, 2, 3, 5, 8, 13])
def test_fewest_fitting_finds_the_first_that_fits_in_few_tries(n):
  candidates = list(range(n))
  for first in range(n + 1):  # `first` == n: none fits
    tried = []

    def fits(c, first=first, tried=tried):
      tried.append(c)
      return c >= first

    found = planning.fewest_fitting(candidates, fits)
    assert found == (first if first < n else None)
    assert len(tried) <= 2 * max(1, n).bit_length() + 1


def test_search_parts_takes_the_fewest_parts_that_fit():
  figures = {1: 1000, 2: 600, 4: 400, 8: 300, 16: 250, 32: 220, 64: 210}
  weighed = []

  def weigh(parts):
    weighed.append(parts)
    return _memory(figures[parts])

  plan, _, _ = planning.search_parts(64, weigh, budget_bytes=500)
  assert (plan.rows, plan.parts, plan.peak_device_bytes) == (64, 4, 400)
  # 8 fits, so more parts are not compiled.
  assert sorted(weighed) == [1, 2, 4, 8]
  assert planning.search_parts(8, weigh, 1000)[0].parts == 1
  # Without a budget: one part, weighed for the log.
  weighed.clear()
  assert planning.search_parts(8, weigh, None)[0].parts == 1
  assert weighed == [1]
  # Given candidates.
  assert planning.search_parts(64, weigh, 500, [1, 8, 64])[0].parts == 8
  # None fits: the least, with its figures.
  assert planning.search_parts(64, weigh, 200) == (
    None,
    planning.EvalPlan(64, 64, _memory(210)),
    None,
  )


def test_arguments_over_the_budget_fit_with_no_parts():
  weighed = []

  def weigh(parts):
    weighed.append(parts)
    return device_memory.ProgramMemory(
      argument_bytes=1000, output_bytes=4, alias_bytes=0, temp_bytes=64 // parts
    )

  plan, least, refusal = planning.search_parts(64, weigh, budget_bytes=900)
  assert (plan, least.parts, refusal) == (None, 64, None)
  assert weighed == [1, 64]


def test_a_program_refused_for_memory_does_not_fit():
  def weigh(parts):
    if parts < 4:
      raise _refused()
    return _memory(100 * parts)

  plan, _, _ = planning.search_parts(8, weigh, budget_bytes=10**9)
  assert plan.parts == 4

  # Any other error is not the plan's to judge.
  def broken(parts):
    raise jax.errors.JaxRuntimeError('INTERNAL: something else')

  with pytest.raises(jax.errors.JaxRuntimeError, match='INTERNAL'):
    planning.search_parts(8, broken, budget_bytes=10**9)


def test_is_out_of_memory():
  assert device_memory.is_out_of_memory(_refused())
  assert not device_memory.is_out_of_memory(
    jax.errors.JaxRuntimeError('INVALID_ARGUMENT: shapes')
  )
  assert not device_memory.is_out_of_memory(MemoryError('RESOURCE_EXHAUSTED'))


@pytest.mark.parametrize('refused', [False, True])
def test_nothing_fits_is_one_line_naming_the_least_and_the_setting(refused):
  def weigh(parts):
    if refused:
      raise _refused()
    return _memory(2000 // parts)

  plan, least, refusal = planning.search_parts(4, weigh, budget_bytes=300)
  assert plan is None and least.parts == 4
  assert (refusal is not None) == refused
  error = planning.nothing_fits(least, refusal, 300)
  assert isinstance(error, planning.EvalMemoryBudgetError)
  message = str(error)
  assert '\n' not in message
  assert message.startswith(
    'the eval of a batch of 4 rows does not fit device_memory_budget_bytes'
    '=300 bytes (0.0 MiB) even one row at a time: '
  )
  if refused:
    assert (
      'the backend refused its program for memory (RESOURCE_EXHAUSTED'
      in message
    )
    assert (
      'set trax_revplus.ReversibleSerialTrainer.'
      'device_memory_budget_bytes, or' in message
    )
  else:
    assert 'its program needs 500 bytes' in message
    assert (
      'set trax_revplus.ReversibleSerialTrainer.'
      'device_memory_budget_bytes >= 500, or use a smaller eval batch'
      in message
    )


def test_describe():
  plan = planning.EvalPlan(8, 2, _memory(3 << 20))
  assert plan.describe(4 << 30) == (
    'the model over 2 parts of 4 rows, then the metrics; peak 3.0 MiB: '
    'arguments 100 B, temporaries 3.0 MiB, outputs 4 B (budget 4.0 GiB)'
  )
  assert planning.EvalPlan(8, 1, None).describe(None) == (
    'the model on all 8 rows, then the metrics; refused for memory (no budget)'
  )
