"""One process of a 2-process training run that counts programs per step.

Run by tests/multiprocess/test_compiles_per_step.py through
`trax_revplus.multiprocess.launcher` (which appends `--num_processes=N
--process_id=I --coordinator_address=HOST:PORT`):

  python tests/multiprocess/compiles_worker.py STEPS [launcher flags]

Trains training_worker's tiny reversible model (no dropout) with our
`ReversibleSerialTrainer` for STEPS steps on this process's rows of the
global batch, and prints one JSON line, {"compiles_per_step": [...]}: per
step, the programs JAX compiled during it and their functions' names
(`progress.CompileCounter`).
"""

import argparse
import json
import sys

import training_worker


def _compiles_per_step(steps):
  """[(programs compiled, their names)] of each of `steps` steps."""
  import jax  # pylint: disable=g-import-not-at-top
  from trax import fastmath, optimizers  # pylint: disable=g-import-not-at-top
  from trax import layers as tl  # pylint: disable=g-import-not-at-top
  import trax_revplus  # pylint: disable=g-import-not-at-top
  from trax_revplus import progress  # pylint: disable=g-import-not-at-top
  from trax_revplus import trainer as rev_trainer  # pylint: disable=g-import-not-at-top

  batch = training_worker._global_batch()  # pylint: disable=protected-access
  rows = training_worker.GLOBAL_BATCH_ROWS // jax.process_count()
  index = jax.process_index()
  local_batch = tuple(x[index * rows : (index + 1) * rows] for x in batch)
  trax_revplus.activate()
  first, revs, loss = training_worker._blocks(False)  # pylint: disable=protected-access
  tl.Serial([first] + revs + [loss]).init(
    batch, rng=fastmath.random.get_prng(12)
  )
  trainer = rev_trainer.ReversibleSerialTrainer(
    [(first.sublayers, revs)], loss, optimizers.Adam
  )
  counts = []
  for step in range(steps):
    before, _ = progress.CompileCounter.snapshot()
    loss_value, _ = trainer.one_step(
      local_batch, fastmath.random.get_prng(100 + step), step=step
    )
    jax.block_until_ready(loss_value)
    after, _ = progress.CompileCounter.snapshot()
    counts.append((after - before, progress.CompileCounter.names_since(before)))
  return counts


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('steps', type=int)
  args, failed = training_worker.joined(parser)
  if failed is not None:
    return failed
  print(
    json.dumps({'compiles_per_step': _compiles_per_step(args.steps)}),
    flush=True,
  )
  return 0


if __name__ == '__main__':
  sys.exit(main())
