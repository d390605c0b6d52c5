"""What planning costs, as the planner records it and says it while it
plans: lines as it weighs plans, the programs it compiles, and a cost that
does not grow with the model's depth.

References: the candidates' own programs (a plan walked on types lists
the programs its step calls), and the same model at another depth.
"""

import pytest
from trax import fastmath
from trax import layers as tl
from trax import optimizers

from conftest import reversible_lm_blocks
import trainer_cases as cases
from trax_revplus import notices
from trax_revplus import trainer as rev_trainer

pytestmark = pytest.mark.usefixtures('stock_trax')

_BATCH = cases.lm_batch()


def _deep_trainer(n_blocks, **kwargs):
  """Ours on `n_blocks` equal pairs of reversible half-residuals (the
  conftest's LM, repeated), Adam."""
  first, revs, loss = reversible_lm_blocks()
  for _ in range(n_blocks - 1):
    revs += reversible_lm_blocks()[1]  # Fresh layers of the same kinds.
  model = tl.Serial([first] + revs + [loss])
  model.init(_BATCH, rng=fastmath.random.get_prng(12))
  return rev_trainer.ReversibleSerialTrainer(
    [(first.sublayers, revs)], loss, optimizers.Adam, **kwargs
  )


def _leanest_peak(n_blocks):
  """Peak of the leanest plan of the most slices (one layer per call)."""
  trainer = _deep_trainer(n_blocks, device_memory_budget_bytes=None)
  p = trainer.planner
  types = p.step_types(_BATCH)
  candidates = p.candidates(types)
  plan = candidates.leanest(max(candidates.slices))
  return p.weigh(plan, types).peak_device_bytes


@pytest.mark.parametrize('tight', [False, True])
def test_planning_compiles_as_much_at_any_depth(tight):
  """A stack four times as deep compiles as many programs while planning,
  under a budget with room for every plan, or one only the leanest fits:
  equal layers share programs, and what rules plans out is known from
  them."""
  compiled = {}
  for n_blocks in (2, 8):
    budget = _leanest_peak(n_blocks) if tight else 2**40
    trainer = _deep_trainer(
      n_blocks, device_memory_budget_bytes=budget, segment_max_layers=1
    )
    trainer.planned(_BATCH)
    [cost] = trainer.planning_costs
    compiled[n_blocks] = cost.programs_compiled
  assert compiled[8] == compiled[2]


def test_planning_says_what_it_does_and_what_it_cost():
  """A line as each plan's programs start compiling and once weighed, the
  seconds since planning began on each, then one line for the plan chosen;
  the cost's figures add up."""
  lines = []
  _, trainer = cases.lm_trainer(_BATCH, device_memory_budget_bytes=2**40)
  with notices.showing_progress(lines.append):
    trainer.planned(_BATCH)
  [cost] = trainer.planning_costs
  assert lines[0].startswith('planning: ')
  assert 'compiling 1 program' in lines[0]
  assert 'per device' in lines[1] and lines[1].startswith('planning: ')
  assert lines[-1].startswith(f'planned in {cost.seconds:.1f} s: ')
  assert cost.plan in lines[-1]
  # Room for the fastest plan: its programs alone compile.
  assert cost.programs_compiled == cost.plan_programs == 1
  assert 0 < cost.plan_compile_seconds <= cost.seconds
  assert cost.search_seconds == pytest.approx(
    cost.seconds - cost.plan_compile_seconds
  )
  assert set(cost.to_json()) >= {
    'seconds',
    'programs_compiled',
    'plan_programs',
    'plan_compile_seconds',
    'search_seconds',
    'plan',
  }
  # Planned once per batch's shapes: no second cost, no line.
  del lines[:]
  with notices.showing_progress(lines.append):
    trainer.planned(_BATCH)
  assert not lines and len(trainer.planning_costs) == 1
