"""Trains a tiny reversible model 3 steps, in one process of a run or alone.

Run by tools/multiprocess_training_smoke.py: alone (1 process, 1 or N
forced CPU devices) or as each process of a multi-process run
(`trax_revplus.multiprocess.launcher` appends `--num_processes=N
--process_id=I --coordinator_address=...`);
tests/multiprocess/test_training_matches_one_process.py calls `train` in
its own process for the run of 1 process x 1 device:

  python tests/multiprocess/training_worker.py OUT_DIR
      [--num_processes=N --process_id=I --coordinator_address=HOST:PORT]

Every run trains on the same global batch of 8 rows with the same RNGs and
weights, once without dropout (keys `plain/...`), once with dropout
(`dropout/...`), and without dropout in 2 micro-batches per device, with
the accumulated gradients on the device (`micro/...`) and on the host
(`micro_host/...`: the plan's `grads_on_host`); a process of a
multi-process run feeds its own rows of the batch, as `trax_revplus.data`
splits one. Writes OUT_DIR/process<I>.npz with,
per variant, the weights and optimizer slots after 3 steps (`<variant>/w/<k>`,
`<variant>/s/<k>` in tree order) and the losses (`<variant>/loss`, per step
the mean over devices); alone, also the weights of trax's default `Trainer`
trained the same way without dropout (`ref/<k>`, one device), the
independent reference.
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(
  0,
  os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
)
# tests/, for conftest's `replan`.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top
from trax_revplus.multiprocess import config as config_lib
from trax_revplus.multiprocess import errors
from trax_revplus.multiprocess import join
# pylint: enable=g-import-not-at-top

GLOBAL_BATCH_ROWS = 8
_STEPS = 3
_LRS = [None, 0.02, None]


def _global_batch():
  x = np.arange(32).reshape((GLOBAL_BATCH_ROWS, 4)) % 9
  y = (3 * np.arange(32).reshape((GLOBAL_BATCH_ROWS, 4)) + 1) % 9
  return (
    x.astype(np.int32),
    y.astype(np.int32),
    np.ones((GLOBAL_BATCH_ROWS, 4), dtype=np.float32),
  )


def _blocks(dropout):
  """(standard layers, reversible layers, loss layer), uninitialized."""
  from trax import layers as tl  # pylint: disable=g-import-not-at-top

  rate = 0.3 if dropout else 0.0
  first = tl.Serial(
    tl.Embedding(9, 4), tl.Dropout(rate, mode='train'), tl.Dup()
  )
  reversible = [
    tl.ReversibleHalfResidual(tl.Dense(4), tl.Dropout(rate, mode='train')),
    tl.ReversibleSwap(),
    tl.ReversibleHalfResidual(tl.Dense(4), tl.Relu()),
    tl.ReversibleSwap(),
  ]
  loss = tl.Serial(
    tl.Concatenate(), tl.Dense(9), tl.LogSoftmax(), tl.CrossEntropyLoss()
  )
  return first, reversible, loss


def _flat(tree):
  from trax import fastmath  # pylint: disable=g-import-not-at-top

  return [np.asarray(x) for x in fastmath.tree_flatten(tree)]


def _default_trainer_weights(batch):
  """trax's default Trainer on one device: the reference (no dropout)."""
  from trax import fastmath, optimizers  # pylint: disable=g-import-not-at-top
  from trax import layers as tl  # pylint: disable=g-import-not-at-top
  import trax_revplus  # pylint: disable=g-import-not-at-top

  trax_revplus.deactivate()
  first, revs, loss = _blocks(False)
  model = tl.Serial([first] + revs + [loss])
  model.init(batch, rng=fastmath.random.get_prng(12))
  opt = optimizers.Adam()
  opt.tree_init(model.weights)
  trainer = optimizers.Trainer(model, opt, n_devices=1)
  for step, lr in enumerate(_LRS):
    trainer.one_step(
      batch, fastmath.random.get_prng(100 + step), step=step, learning_rate=lr
    )
  return _flat(model.weights)


def train(out_dir):
  """Trains every variant here; writes `out_dir`/process<I>.npz.

  Joined already where this process is one of a multi-process run; alone,
  any process with one or more devices (the test calls it in its own).
  Leaves trax_revplus active.
  """
  import jax  # pylint: disable=g-import-not-at-top
  from trax import fastmath, optimizers  # pylint: disable=g-import-not-at-top
  from trax import layers as tl  # pylint: disable=g-import-not-at-top
  import trax_revplus  # pylint: disable=g-import-not-at-top
  from trax_revplus import trainer as rev_trainer  # pylint: disable=g-import-not-at-top
  import conftest  # pylint: disable=g-import-not-at-top

  batch = _global_batch()
  index, count = jax.process_index(), jax.process_count()
  rows = GLOBAL_BATCH_ROWS // count
  local_batch = tuple(x[index * rows : (index + 1) * rows] for x in batch)
  result = {}
  if count == 1:
    result.update(
      {f'ref/{k}': w for k, w in enumerate(_default_trainer_weights(batch))}
    )

  trax_revplus.activate()
  for variant in ('plain', 'dropout', 'micro', 'micro_host'):
    first, revs, loss = _blocks(variant == 'dropout')
    model = tl.Serial([first] + revs + [loss])
    model.init(batch, rng=fastmath.random.get_prng(12))
    # 'micro': without dropout, each device's rows in 2 micro-batches.
    settings = (
      {'micro_batches': 2, 'device_memory_budget_bytes': None}
      if variant.startswith('micro')
      else {}
    )
    trainer = rev_trainer.ReversibleSerialTrainer(
      [(first.sublayers, revs)], loss, optimizers.Adam, **settings
    )
    if variant == 'micro_host':
      conftest.replan(trainer, local_batch, grads_on_host=True)
    losses = []
    for step, lr in enumerate(_LRS):
      loss_value, _ = trainer.one_step(
        local_batch,
        fastmath.random.get_prng(100 + step),
        step=step,
        learning_rate=lr,
      )
      losses.append(float(np.mean(np.asarray(loss_value))))
    result.update(
      {f'{variant}/w/{k}': w for k, w in enumerate(_flat(model.weights))}
    )
    result.update(
      {f'{variant}/s/{k}': s for k, s in enumerate(_flat(trainer.slots))}
    )
    result[f'{variant}/loss'] = np.asarray(losses)
  result['devices'] = np.asarray(
    [count, jax.local_device_count(), jax.device_count()]
  )
  np.savez(os.path.join(out_dir, f'process{index}.npz'), **result)
  return index


def joined(parser):
  """Parses the worker's arguments and the launcher's flags; joins the run.

  Args:
    parser: `argparse.ArgumentParser` with the worker's own arguments; the
      launcher's `--num_processes`, `--process_id` and
      `--coordinator_address` are added here.

  Returns:
    (args, None) once joined, with trax imported; (args, exit status) if
    joining failed (its line printed on stderr).
  """
  parser.add_argument('--num_processes', type=int)
  parser.add_argument('--process_id', type=int)
  parser.add_argument('--coordinator_address')
  args = parser.parse_args()
  config = config_lib.resolve_config(
    args.num_processes, args.process_id, args.coordinator_address
  )
  try:
    join.initialize(config, error_prefix='error: ')
  except errors.DistributedError as e:
    print(f'error: {e}', file=sys.stderr, flush=True)
    return args, e.exit_code
  from trax_revplus import trax_import  # pylint: disable=g-import-not-at-top

  trax_import.import_trax()
  return args, None


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('out_dir')
  args, failed = joined(parser)
  if failed is not None:
    return failed
  index = train(args.out_dir)
  print(f'process {index}: done', flush=True)
  return 0


if __name__ == '__main__':
  sys.exit(main())
