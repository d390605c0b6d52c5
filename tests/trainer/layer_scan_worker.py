"""A fused program that loops over equal blocks, on N forced CPU devices,
in a fresh process (`conftest.run_multidevice_worker(n,
'looped_on_devices', script=<this file>)`): its layers updated by one
mapped update per block position with the gradients averaged over the
devices (`step_fns.update_each`), against trax's default Trainer on one
device."""

import json
import os
import sys

import numpy as np

from trax_revplus import trax_import

trax_import.import_trax()  # Before any trax module: see trax_import.

# pylint: disable=g-import-not-at-top,g-bad-import-order,wrong-import-position
import jax
from trax import fastmath
from trax import layers as tl
from trax import optimizers

# tests/trainer for trainer_cases, tests/ for the conftest it reads.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [_HERE, os.path.dirname(_HERE)]
import trainer_cases as cases
import trax_revplus
from trax_revplus import trainer as rev_trainer
from trax_revplus.trainer._search import speed_rank
from trax_revplus.trainer._step import fused_fns


def _blocks():
  """Standard layers, 3 equal blocks of reversible layers, the loss."""
  first = tl.Serial(tl.Embedding(9, 4), tl.Dup())
  reversible = []
  for _ in range(3):
    reversible += [
      tl.ReversibleHalfResidual(tl.Dense(4), tl.Relu()),
      tl.ReversibleSwap(),
    ]
  loss = tl.Serial(
    tl.Concatenate(), tl.Dense(9), tl.LogSoftmax(), tl.CrossEntropyLoss()
  )
  return first, reversible, loss


def looped_on_devices(n):
  """Prints one JSON line: local_devices; updated_together: the runs of
  equal blocks the fused program updated as one; max_diff: the largest
  difference of the weights after 2 steps from the default Trainer's on
  one device."""
  trax_revplus.deactivate()
  # Accelerators loop; the CPU's rule keeps the program unrolled.
  speed_rank.SCAN_EQUAL_BLOCKS['cpu'] = True
  together = []
  updated_together = fused_fns.updated_together

  def recorded(*args, **kwargs):
    runs = updated_together(*args, **kwargs)
    together.extend(runs)
    return runs

  fused_fns.updated_together = recorded
  tokens = (np.arange(8 * 4).reshape((8, 4)) * 7 + 3) % 9
  batch = (tokens, tokens, np.ones((8, 4), np.float32))
  rngs = [fastmath.random.get_prng(i) for i in (1, 2)]
  rates = [0.01, 0.02]

  def model_of(first, reversible, loss):
    model = tl.Serial([first] + reversible + [loss])
    model.init(batch, rng=fastmath.random.get_prng(12))
    return model

  model = model_of(*_blocks())
  opt = optimizers.Adam()
  opt.tree_init(model.weights)
  default = optimizers.Trainer(model, opt, n_devices=1)
  for rng, rate in zip(rngs, rates):
    default.one_step(batch, rng, learning_rate=rate)
  expected = model.weights

  first, reversible, loss = _blocks()
  model = model_of(first, reversible, loss)
  ours = rev_trainer.ReversibleSerialTrainer(
    [(first.sublayers, reversible)], loss, optimizers.Adam, n_devices=n
  )
  cases.set_plan(ours, batch, cases.fused_plan(ours, batch))
  for rng, rate in zip(rngs, rates):
    ours.one_step(batch, rng, learning_rate=rate)
  pairs = zip(
    fastmath.tree_flatten(expected), fastmath.tree_flatten(model.weights)
  )
  print(
    json.dumps(
      {
        'local_devices': jax.local_device_count(),
        'updated_together': [
          [run.start, run.period, run.count] for run in together
        ],
        'max_diff': max(
          float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in pairs
        ),
      }
    )
  )
