"""Saved inputs and states waiting on the host (`StepPlan.saved_on_host`).

References: trax's default `Trainer` on the same dropout-free models and
inputs (the values trained: a dense model and an LSH ReformerLM); stock
trax's `ReversibleSerialTrainer`'s accounted step
(`device_memory.stock_trainer_memory`) for the least plan's peak, on every
model kind the suite builds (dense, LSH, a Terraformer encoder-decoder);
the same plan with its saved entries on the device for what they hold.
"""

import dataclasses
import functools

import numpy as np
import pytest
from trax import fastmath
from trax import layers as tl
from trax import optimizers
from trax import shapes
from trax.models.research import terraformer

from conftest import reversible_lm_blocks
import trainer_cases as cases
from trax_revplus import device_memory
from trax_revplus import trainer as rev_trainer

pytestmark = pytest.mark.usefixtures('stock_trax')

_SAVED = 'saved block inputs and states'


def _leanest(trainer, batch, on_host):
  """The unfused leanest plan of one slice, saved entries where asked."""
  p = trainer.planner
  plan = p.candidates(p.step_types(batch)).leanest(1)
  return dataclasses.replace(plan, saved_on_host=on_host)


def _train_switching(trainer, batch, plans):
  """Steps `trainer` on `batch` with `plans[i]` at step i (cases.RNGS and
  cases.LRS); returns the compiles during each step after the first."""
  compiles = cases.count_compiles()
  during = []
  for plan, rng, lr in zip(plans, cases.RNGS, cases.LRS):
    cases.set_plan(trainer, batch, plan)
    start = len(compiles)
    trainer.one_step(batch, rng, learning_rate=lr)
    during.append(len(compiles) - start)
  return during[1:]


def test_dense_model_trains_as_the_default_trainer():
  """Leanest and widest unfused plans with their saved entries on the
  host, switched with the device one between steps: trax's default
  Trainer's weights and slots, and the steps compile no more than with
  the device plan throughout (the entries placed back have the types the
  step was compiled for)."""
  batch = cases.lm_batch()
  _, control = cases.lm_trainer(batch, device_memory_budget_bytes=None)
  control_compiles = _train_switching(
    control, batch, [_leanest(control, batch, False)] * 3
  )
  model, trainer = cases.lm_trainer(batch, device_memory_budget_bytes=None)
  p = trainer.planner
  group = next(
    g
    for g in p.candidates(p.step_types(batch)).groups()
    if not g.fused_reversible_layers
  )
  widest_on_host = next(plan for plan in group.plans if plan.saved_on_host)
  assert widest_on_host.settings()['segment_max_layers'] > 1
  plans = [
    _leanest(trainer, batch, False),
    _leanest(trainer, batch, True),
    widest_on_host,
  ]
  assert _train_switching(trainer, batch, plans) == control_compiles
  ref_weights, ref_slots, _ = cases.lm_reference_3_steps()
  cases.assert_all_close(ref_weights, model.weights)
  cases.assert_all_close(ref_slots, trainer.slots)
  cases.host_leaves_only(model.weights)


def _lsh_batch():
  tokens = np.random.RandomState(2).randint(1, 16, size=(2, 16))
  tokens = tokens.astype(np.int32)
  return tokens, tokens, np.ones_like(tokens, dtype=np.float32)


def test_lsh_model_trains_as_the_default_trainer():
  """LSH attention keeps its hashes' RNGs and buckets as layer state, which
  wait on the host with the block inputs."""
  batch = _lsh_batch()
  init_rng = fastmath.random.get_prng(3)
  model = tl.Serial(cases.lsh_model(), tl.WeightedCategoryCrossEntropy())
  init = lambda: model.init(shapes.signature(batch), rng=init_rng)
  ref_weights, ref_slots, ref_state = cases.reference(
    model, init, optimizers.Adam, 2, batch
  )
  ref = fastmath.nested_map(np.asarray, (ref_weights, ref_slots, ref_state))

  model = tl.Serial(cases.lsh_model(), tl.WeightedCategoryCrossEntropy())
  model.init(shapes.signature(batch), rng=init_rng)
  blocks, loss = rev_trainer.extract_reversible_blocks(list(model.sublayers))
  trainer = rev_trainer.ReversibleSerialTrainer(
    blocks, loss, optimizers.Adam, device_memory_budget_bytes=None
  )
  step = cases.set_plan(trainer, batch, _leanest(trainer, batch, True))
  assert not any(h.name == _SAVED for c in step.calls for h in c.held)
  cases.train(trainer, batch, 2)
  cases.assert_all_close(ref[0], model.weights)
  cases.assert_all_close(ref[1], trainer.slots)
  cases.assert_all_close(ref[2], model.state)


# Models as (layers for `extract_reversible_blocks`, batch): each built
# fresh per trainer, initialized alike.


def _dense():
  first, revs, loss = reversible_lm_blocks()
  return [first] + revs + [loss], cases.lm_batch()


def _extended():
  first, revs1, mid, revs2, loss = cases.extended_model(mid_rate=0.0)
  return [first] + revs1 + [mid] + revs2 + [loss], cases.batch()


def _lsh():
  return [cases.lsh_model(), tl.WeightedCategoryCrossEntropy()], _lsh_batch()


def _terraformer():
  """An encoder-decoder Terraformer (reversible encoder, 1 + 2 layers)."""
  inputs = np.arange(8).reshape((2, 4)).astype(np.int32) + 1
  model = terraformer.ConfigurableTerraformer(
    20,
    d_model=8,
    d_ff=16,
    n_heads=1,
    dropout=0.0,
    n_encoder_layers=1,
    n_decoder_layers=2,
    pos_type=None,
    reversible_encoder=True,
  )
  loss = tl.Serial(tl.LogSoftmax(), tl.CrossEntropyLoss())
  return [model, loss], (inputs, 2 * inputs, np.ones_like(inputs))


MODELS = {
  'dense': _dense,
  'extended': _extended,
  'lsh': _lsh,
  'terraformer': _terraformer,
}


def _blocks(module, name):
  layers, batch = MODELS[name]()
  blocks, loss = module.extract_reversible_blocks(layers)
  module.init_reversible_blocks(
    blocks, loss, shapes.signature(batch), fastmath.random.get_prng(5)
  )
  return blocks, loss, batch


@functools.lru_cache(maxsize=None)
def _ours(name):
  """(our trainer without a budget, batch) on model `name`."""
  blocks, loss, batch = _blocks(rev_trainer, name)
  return rev_trainer.ReversibleSerialTrainer(
    blocks, loss, optimizers.Adam, device_memory_budget_bytes=None
  ), batch


def _stock_peak(name):
  from trax.optimizers import trainer as stock_lib  # pylint: disable=g-import-not-at-top

  blocks, loss, batch = _blocks(stock_lib, name)
  stock = stock_lib.ReversibleSerialTrainer(
    blocks, loss, optimizers.Adam, n_devices=1
  )
  return device_memory.stock_trainer_memory(
    stock, device_memory.abstract(batch), 'cpu'
  ).peak_device_bytes


@pytest.mark.parametrize(
  'name', ['dense', 'lsh', pytest.param('terraformer', marks=pytest.mark.slow)]
)
def test_least_plan_needs_no_more_than_stocks_step(name):
  trainer, batch = _ours(name)
  plan, least = trainer.least_device_memory_of(batch)
  assert least.peak_device_bytes <= _stock_peak(name), plan.describe()


@pytest.mark.parametrize('name', ['extended', 'lsh', 'terraformer'])
def test_saved_entries_on_the_host_hold_less_than_on_the_device(name):
  """Every call of a plan whose saved entries wait on the host holds none
  of them, and its peak is at most the same plan's with them on the
  device; below it with more than one block (the later blocks' calls
  would hold the earlier blocks' inputs)."""
  trainer, batch = _ours(name)
  p = trainer.planner
  widest = next(
    g
    for g in p.candidates(p.step_types(batch)).groups()
    if not g.fused_reversible_layers
  ).plans[0]
  assert (len(widest.blocks) > 1) == (name == 'extended')
  for plan in (widest, _leanest(trainer, batch, False)):
    peaks = {}
    for on_host in (False, True):
      step = cases.set_plan(
        trainer, batch, dataclasses.replace(plan, saved_on_host=on_host)
      )
      peaks[on_host] = step.peak_device_bytes
      if on_host:
        assert not any(h.name == _SAVED for c in step.calls for h in c.held)
    if len(plan.blocks) > 1:
      assert peaks[True] < peaks[False], (plan.describe(), peaks)
    else:
      assert peaks[True] <= peaks[False], (plan.describe(), peaks)
