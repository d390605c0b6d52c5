"""Planning where the backend refuses programs at compile time, as a TPU does.

The compiler is simulated (`tests/compile_refusal/refusal.py`): the CPU
backend refuses, with `JaxRuntimeError: RESOURCE_EXHAUSTED: ...`, every
program whose argument + output + temporary - alias bytes exceed a limit,
compiled ahead or when called; or fails them with another status.

References: trax's default `Trainer` for the weights trained under a
refusal; the plans' own accountings without a refusal (the programs each
plan compiles, their bytes, the least plan's peak) for the plans refused
and the bytes named.
"""

import functools
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

import trainer_cases as cases
from compile_refusal import refusal
from trax_revplus import device_memory
from trax_revplus.trainer._search import budget
from trax_revplus.trainer._search import plan_search
from trax_revplus.trainer._step import units as units_lib

pytestmark = pytest.mark.usefixtures('stock_trax')

_BATCH = cases.lm_batch()


def _trainer(**kwargs):
  return cases.lm_trainer(_BATCH, **kwargs)


def _accounted(plan):
  """`plan`'s StepMemory, accounted by a trainer with no refusal."""
  _, trainer = _trainer(device_memory_budget_bytes=None)
  p = trainer.planner
  units = units_lib.Units(plan, p._factory)  # pylint: disable=protected-access
  return p.account(plan, units, p.step_types(_BATCH))


@functools.lru_cache(maxsize=1)
def _fastest_and_least():
  """(fastest candidate, its StepMemory, least plan, its StepMemory), with
  no refusal."""
  _, trainer = _trainer(device_memory_budget_bytes=None)
  p = trainer.planner
  fastest = next(p.candidates(p.step_types(_BATCH)).groups()).plans[0]
  least_plan, least = trainer.least_device_memory_of(_BATCH)
  return fastest, _accounted(fastest), least_plan, least


def test_a_refused_program_is_a_plan_that_does_not_fit():
  """The fastest plan's largest program refused: the budget 'auto' goes on
  to a leaner plan (never the settings as given, unplanned), which trains
  as trax's default Trainer."""
  ref_weights, ref_slots, _ = cases.lm_reference_3_steps()
  fastest, fastest_step, _, _ = _fastest_and_least()
  limit = fastest_step.largest_program_bytes - 1
  model, trainer = _trainer()  # device_memory_budget_bytes='auto'
  with refusal.refusing(limit):
    planned = trainer.planned(_BATCH)
    cases.train(trainer, _BATCH, 3)
  assert planned.plan != fastest
  assert planned.memory.largest_program_bytes <= limit
  weighing = trainer.planner.weighing(_BATCH)
  first = weighing.weighed[0]
  assert first.plan == fastest and first.fits is False
  assert first.memory is None and 'refused to compile' in str(first.refused)
  # The refusal reads the compiler's own figure for the program.
  assert first.refused.least_bytes >= fastest_step.largest_program_bytes
  assert weighing.chosen == planned.plan
  cases.assert_all_close(ref_weights, model.weights)
  cases.assert_all_close(ref_slots, trainer.slots)


def test_where_every_plan_is_refused_one_line_names_the_least_plan():
  _, _, least_plan, least = _fastest_and_least()
  # Below the least plan's largest program, above the step's helpers.
  limit = 3000
  assert least.largest_program_bytes > limit
  model, trainer = _trainer()
  before = jax.tree_util.tree_map(np.array, model.weights)
  with refusal.refusing(limit):
    with pytest.raises(budget.DeviceMemoryBudgetError) as e:
      trainer.one_step(_BATCH, cases.RNGS[0])
  message = str(e.value)
  assert '\n' not in message
  assert message.startswith(
    'no plan fits this device on this batch: the backend refused to compile '
  )
  need = int(message.split('needs at least ')[1].split(' bytes')[0])
  # A lower bound of the least plan's peak, at least its largest program.
  assert least.largest_program_bytes <= need <= least.peak_device_bytes
  assert 'micro_batches=4' in message and least_plan.micro_batches == 4
  cases.assert_all_close(before, model.weights, tol=0)
  assert trainer.planner.weighing(_BATCH).chosen is None
  with refusal.refusing(limit):
    with pytest.raises(plan_search.LeastRefused):
      trainer.least_device_memory_of(_BATCH)


def test_a_refused_plan_is_not_compiled_again():
  fastest, fastest_step, _, _ = _fastest_and_least()
  _, trainer = _trainer()
  with refusal.refusing(fastest_step.largest_program_bytes - 1):
    trainer.planned(_BATCH)
    p = trainer.planner
    types = p.step_types(_BATCH)
    compiles = cases.count_compiles()
    for _ in range(2):
      with pytest.raises(device_memory.ProgramOutOfMemoryError):
        p.weigh(fastest, types)
  assert compiles == []


def test_a_pinned_plan_the_backend_refuses_is_one_line():
  _, trainer = _trainer(device_memory_budget_bytes=None)
  configured = _accounted(trainer.planned(_BATCH).plan)
  _, trainer = _trainer(device_memory_budget_bytes=None)
  with refusal.refusing(configured.largest_program_bytes - 1):
    with pytest.raises(budget.DeviceMemoryBudgetError) as e:
      trainer.one_step(_BATCH, cases.RNGS[0])
  message = str(e.value)
  assert '\n' not in message
  assert message.startswith(
    'the plan the settings name does not fit this '
    'device on this batch: the backend refused to '
    'compile '
  )
  assert "device_memory_budget_bytes = 'auto'" in message


def test_another_compile_failure_is_one_line_naming_the_program():
  fastest, fastest_step, _, _ = _fastest_and_least()
  model, trainer = _trainer()
  before = jax.tree_util.tree_map(np.array, model.weights)
  with refusal.failing(fastest_step.largest_program_bytes - 1):
    with pytest.raises(budget.StepCompileError) as e:
      trainer.one_step(_BATCH, cases.RNGS[0])
  message = str(e.value)
  assert '\n' not in message
  largest = max(fastest_step.calls, key=lambda c: c.program.call_bytes)
  assert message.startswith(
    f'{largest.name} did not compile: JaxRuntimeError: INTERNAL: '
    f'simulated compiler failure'
  ), message
  assert 'Traceback' not in message
  cases.assert_all_close(before, model.weights, tol=0)
  del fastest


def test_the_refusal_works_in_a_process_started_with_its_variable(tmp_path):
  """A process started with `tests/compile_refusal` on PYTHONPATH and the
  variable set refuses programs over the limit (as a test's subprocess of
  `trax-revplus` would)."""
  folder = os.path.dirname(refusal.__file__)
  script = (
    'import jax, jax.numpy as jnp\n'
    'f = jax.jit(lambda x: (x @ x).sum())\n'
    'try:\n'
    '  f(jnp.ones((10, 10)))\n'
    'except jax.errors.JaxRuntimeError as e:\n'
    '  print(e)\n'
  )
  env = dict(os.environ, PYTHONPATH=folder, **{refusal.LIMIT_ENV: '100'})
  out = subprocess.run(
    [sys.executable, '-c', script],
    env=env,
    check=True,
    capture_output=True,
    text=True,
    cwd=tmp_path,
  ).stdout
  assert out.startswith(
    'RESOURCE_EXHAUSTED: Ran out of memory in memory '
    'space hbm. Used 404 of 100 hbm'
  )
