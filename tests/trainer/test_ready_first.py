"""A run's first steps on the plan ready first while the fused program
compiles (`planner.Planner.step_for`'s `ready_first`,
`candidates.Candidates.ready_plan`, `speed_rank.starts_on_ready`)."""

import jax
import numpy as np
import pytest
from trax import fastmath
from trax import layers as tl
from trax import optimizers
from trax import shapes

import trainer_cases as cases
from trax_revplus import notices
from trax_revplus import trainer as rev_trainer
from trax_revplus.device_memory import programs as programs_lib
from trax_revplus.trainer._search import speed_rank

pytestmark = pytest.mark.usefixtures('stock_trax')

_STEPS = 4
# The fused program counts as compiled from this step on (its compile
# itself may end sooner or later: planning then waits for it).
_SWITCH_STEP = 3


def _as_on_an_accelerator(monkeypatch):
  backend = jax.default_backend()
  monkeypatch.setitem(speed_rank.SCAN_EQUAL_BLOCKS, backend, True)
  monkeypatch.setitem(speed_rank.READY_FIRST_RATIO, backend, 0)


def _model():
  return cases.small_reformer_lm(tl.SelfAttention, n_layers=4, dropout=0.1)


def test_a_run_that_moves_to_the_fused_plan_trains_as_stock(monkeypatch):
  # As on an accelerator: the fused program loops over its equal blocks
  # (so that it ranks first), and whatever it compiles the run starts on
  # the ready plan (the CPU's rule asks for 16 times its layers).
  _as_on_an_accelerator(monkeypatch)
  steps_begun = [0]
  done = programs_lib.Programs.done

  def done_from_the_switch_step(self, key):
    return steps_begun[0] >= _SWITCH_STEP and done(self, key)

  monkeypatch.setattr(programs_lib.Programs, 'done', done_from_the_switch_step)
  lines = []
  monkeypatch.setattr(notices, '_progress_listeners', [lines.append])
  batch = cases.self_attention_lm_batch()
  plans = []
  asked = []
  made = []

  def ours(blocks, loss):
    trainer = rev_trainer.ReversibleSerialTrainer(blocks, loss, optimizers.Adam)
    planned = trainer.planned

    def recorded(batch_, ready_first=False):
      if ready_first:
        steps_begun[0] += 1
      step = planned(batch_, ready_first)
      (plans if ready_first else asked).append(step.plan)
      return step

    monkeypatch.setattr(trainer, 'planned', recorded)
    made.append(trainer)
    return trainer

  expected_weights, expected_losses = cases.train_lm(
    cases.stock_trainer, _model(), batch, _STEPS
  )
  weights, losses = cases.train_lm(ours, _model(), batch, _STEPS)
  assert len(made[0].steps_on_ready_plan) == _SWITCH_STEP - 1
  # The switch's planning compiled nothing: its plan's program compiled
  # before it, beside the steps, and its cost says so apart.
  first, switch = made[0].planning_costs
  assert first.programs_compiled > 0 and switch.programs_compiled == 0
  assert switch.plan_compile_seconds <= switch.seconds
  assert switch.plan_compiled_before_seconds > 0
  assert 'compiled before: ' in switch.describe()
  ready, fused = plans[0], plans[-1]
  # Steps 1-2 on the unfused plan of the fewest compiled layers (one
  # layer a call), with the fused plan's batch slices; then the fused one.
  assert ready.fused_from >= ready.loss and fused.fused_from < fused.loss
  assert plans == [ready] * (_SWITCH_STEP - 1) + [fused] * (
    _STEPS - _SWITCH_STEP + 1
  )
  assert ready.batch_slices == fused.batch_slices
  assert all(len(segment) == 1 for _, segs in ready.blocks for segment in segs)
  said = '\n'.join(lines)
  assert 'compile while the first steps run the plan below' in said
  assert 'compiled; the steps from this one run the plan chosen now' in said
  np.testing.assert_allclose(losses, expected_losses, rtol=0, atol=1e-5)
  cases.assert_all_close(expected_weights, weights)


def test_asking_without_ready_first_waits_for_the_fused_plan(monkeypatch):
  _as_on_an_accelerator(monkeypatch)
  monkeypatch.setattr(programs_lib.Programs, 'done', lambda self, key: False)
  batch = cases.self_attention_lm_batch()
  trainer = _trainer(batch)
  ready = trainer.planned(batch, ready_first=True).plan
  assert ready.fused_from >= ready.loss
  # The step's device memory (what `estimate` reads) is the plan the run
  # settles on: the fused one, its programs waited for.
  fused = trainer.planned(batch).plan
  assert fused.fused_from < fused.loss
  assert trainer.device_memory_of(batch) is trainer.planned(batch).memory
  assert trainer.planned(batch, ready_first=True).plan == fused


def test_by_default_the_cpu_steps_on_the_fused_plan_of_a_shallow_model():
  # 2 blocks: the fused program compiles a few times the ready plan's
  # layers, under the CPU's ratio: it is planned before the first step.
  batch = cases.self_attention_lm_batch()
  trainer = _trainer(batch, n_layers=2)
  plan = trainer.planned(batch, ready_first=True).plan
  assert plan.fused_from < plan.loss


def _trainer(batch, n_layers=4):
  blocks, loss = rev_trainer.extract_reversible_blocks(
    [
      cases.small_reformer_lm(tl.SelfAttention, n_layers=n_layers, dropout=0.1),
      tl.WeightedCategoryCrossEntropy(),
    ]
  )
  rev_trainer.init_reversible_blocks(
    blocks, loss, shapes.signature(batch), fastmath.random.get_prng(3)
  )
  return rev_trainer.ReversibleSerialTrainer(blocks, loss, optimizers.Adam)


def test_the_ratio_rule():
  assert speed_rank.starts_on_ready('tpu', 5, 5)
  assert not speed_rank.starts_on_ready('cpu', 16 * 5, 5)
  assert speed_rank.starts_on_ready('cpu', 16 * 5 + 1, 5)
