"""Batch slices shrink every call they are applied to.

Each model the trainer tests build, accounted (XLA's memory analysis of
each compiled call) with 1 and with 2 slices on the leanest plans of both
kinds (every layer in the loss's program; one layer per call): a call's
temporary bytes hold its rows' intermediates, so 2 slices must not give
any call more, and the large ones must shrink. The Terraformer's loss
program (its loss layer reshapes its state in its first call) is the case
that once stayed whole.
"""

import numpy as np
import pytest
from trax import fastmath
from trax import layers as tl
from trax import optimizers
from trax import shapes
from trax.models.research import terraformer

import trainer_cases as cases
from conftest import reversible_lm_blocks
from trax_revplus import trainer as rev_trainer

pytestmark = pytest.mark.usefixtures('stock_trax')


def _terraformer():
  """An encoder-decoder Terraformer with a large vocabulary: its loss
  program's logits outweigh its weights, as in trax's configs."""
  model = terraformer.ConfigurableTerraformer(
    1000,
    d_model=8,
    d_ff=16,
    n_heads=1,
    dropout=0.0,
    n_encoder_layers=1,
    n_decoder_layers=1,
    pos_type=None,
    reversible_encoder=True,
  )
  tokens = np.arange(64, dtype=np.int32).reshape((4, 16)) % 900 + 1
  batch = (tokens, tokens, np.ones_like(tokens, dtype=np.float32))
  return [model, tl.WeightedCategoryCrossEntropy()], batch, optimizers.Adafactor


def _dense():
  first, revs, loss = reversible_lm_blocks()
  return [first] + revs + [loss], cases.lm_batch(rows=4), optimizers.Adafactor


MODELS = {'dense': _dense, 'terraformer': _terraformer}


def _trainer(name):
  layers, batch, optimizer = MODELS[name]()
  blocks, loss = rev_trainer.extract_reversible_blocks(layers)
  rev_trainer.init_reversible_blocks(
    blocks, loss, shapes.signature(batch), fastmath.random.get_prng(5)
  )
  return rev_trainer.ReversibleSerialTrainer(
    blocks, loss, optimizer, device_memory_budget_bytes=None
  ), batch


def _programs(trainer, batch, fused, k):
  """{call name: `ProgramMemory`} of the leanest plan of `k` slices."""
  p = trainer.planner
  [plan] = [
    g.leanest
    for g in p.candidates(p.step_types(batch)).groups()
    if bool(g.fused_reversible_layers) == fused
    and g.leanest.batch_slices == k
    and g.leanest.sequence_chunks == 1
    and g.leanest.micro_batches == 1
    and g.leanest.parallel_heads is None
  ]
  step = cases.set_plan(trainer, batch, plan)
  return {c.name: c.program for c in step.calls}


@pytest.mark.parametrize('name', sorted(MODELS))
@pytest.mark.parametrize('fused', [False, True], ids=['per_layer', 'fused'])
def test_two_slices_shrink_every_call(name, fused):
  """Each call's temporaries at 2 slices: at most half its unsliced ones
  plus one copy of what it reads and writes (the loop's stacked rows and
  gradient sums, which matter only in calls too small to shrink); the
  largest call's at most 0.75x (these models are small: their weights'
  gradient sums are a good part of it)."""
  trainer, batch = _trainer(name)
  whole = _programs(trainer, batch, fused, 1)
  sliced = _programs(trainer, batch, fused, 2)
  assert sorted(whole) == sorted(sliced)
  grown = {
    n: (whole[n].temp_bytes, sliced[n].temp_bytes)
    for n in whole
    if sliced[n].temp_bytes
    > whole[n].temp_bytes / 2
    + sliced[n].argument_bytes
    + sliced[n].output_bytes
  }
  assert not grown, grown
  largest = max(whole, key=lambda n: whole[n].temp_bytes)
  assert sliced[largest].temp_bytes <= 0.75 * whole[largest].temp_bytes, (
    largest,
    whole[largest],
    sliced[largest],
  )
