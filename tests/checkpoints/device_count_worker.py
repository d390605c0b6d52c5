"""Trains memory-efficient Loops under a device memory budget on N forced
CPU devices, each resuming its output dir's checkpoint; prints one JSON
line.

Run by tests/checkpoints/test_device_count_resume.py in fresh processes (the
device count is fixed when JAX starts), through conftest's
`run_multidevice_worker(n, 'main', script=...)`:

  XLA_FLAGS=--xla_force_host_platform_device_count=N \\
      DEVICE_COUNT_RUNS='DIR:STEPS,...' \\
      python tests/checkpoints/device_count_worker.py N

Each DIR:STEPS of DEVICE_COUNT_RUNS, in order: a Loop on DIR (resuming its
checkpoint, if any) of a tiny reversible LM whose dropout layers keep a
float32 scalar as their state (rate 0, so that the device count changes
no value but the summation order), trained under
`device_memory_budget_bytes = BUDGET_BYTES` up to step STEPS, then saved.

Printed (last line of stdout): {DIR: {'first_step': the step it resumed
at, 'losses': the loss of each step it ran, 'weights', 'slots': its final
flat weights and optimizer slots as lists, 'plan': the settings of the
plan its trainer ran, 'state_types': the type names of its layers' state
leaves on the host after its steps}}.
"""

import json
import os
import sys

import numpy as np

from trax_revplus import trax_import

trax_import.import_trax()  # Before any trax module: see trax_import.

# pylint: disable=g-import-not-at-top,g-bad-import-order,wrong-import-position
import gin
from trax import fastmath
from trax import layers as tl
from trax import optimizers
from trax.data import inputs as trax_inputs
from trax.supervised import training

# tests/, for conftest's model.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from conftest import reversible_lm
import trax_revplus
# pylint: enable=g-import-not-at-top,g-bad-import-order,wrong-import-position

# 20 MiB, as the reproduction: far above this model's least plan,
# so it plans (every candidate accounted from XLA) rather than refuses.
BUDGET_BYTES = 20 * 2**20
_BUDGET = 'trax_revplus.ReversibleSerialTrainer.device_memory_budget_bytes'


def _batches():
  """Batch k: 4 rows (2 per device on 2) of 4 tokens, their targets, loss
  weights of ones."""
  k = 0
  while True:
    x = (np.arange(16).reshape((4, 4)) + k) % 9
    yield x, (2 * x + 1) % 9, np.ones_like(x, dtype=np.float32)
    k += 1


def _loop(output_dir):
  """A memory-efficient Loop on `output_dir`, resumed from its checkpoint
  if it has one; data counted (`count_and_skip`) so that the data position
  resumes too."""
  trax_inputs.data_counters = {}  # As in a fresh process.
  task = training.TrainTask(
    trax_inputs.count_and_skip(_batches(), 'device_count_worker'),
    tl.CrossEntropyLoss(),
    optimizers.Adam,
    n_steps_per_checkpoint=100,
  )
  return training.Loop(
    reversible_lm(dropout_rate=0.0),
    [task],
    output_dir=output_dir,
    random_seed=0,
    use_memory_efficient_trainer=True,
  )


def _train(output_dir, steps):
  """Trains the Loop on `output_dir` up to step `steps`; its figures."""
  loop = _loop(output_dir)
  first_step = loop.step
  trainer = loop._trainer_per_task[0]  # pylint: disable=protected-access
  losses = []
  one_step = trainer.one_step

  def recorded(batch, *args, **kwargs):
    loss, stats = one_step(batch, *args, **kwargs)
    # (N,) on N devices, one per device's equal share of the rows.
    losses.append(float(np.mean(np.asarray(loss))))
    plans.append(trainer.planned(batch).plan.settings())
    return loss, stats

  plans = []
  trainer.one_step = recorded
  loop.run(steps - first_step)
  loop.save_checkpoint('model')
  return {
    'first_step': first_step,
    'losses': losses,
    'weights': [
      np.asarray(w).tolist() for w in fastmath.tree_flatten(loop.model.weights)
    ],
    'slots': [
      np.asarray(s).tolist() for s in fastmath.tree_flatten(trainer.slots)
    ],
    'plan': plans[-1],
    # What the host holds of the layers' state after the steps, and saves.
    'state_types': sorted(
      {type(x).__name__ for x in fastmath.tree_flatten(loop.model.state)}
    ),
  }


def main():
  trax_revplus.activate()
  gin.bind_parameter(_BUDGET, BUDGET_BYTES)
  results = {}
  for run in os.environ['DEVICE_COUNT_RUNS'].split(','):
    output_dir, steps = run.rsplit(':', 1)
    results[output_dir] = _train(output_dir, int(steps))
  print(json.dumps(results))


if __name__ == '__main__':
  main()
