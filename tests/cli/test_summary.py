"""The summary `train` prints at the end of a run, and `compare`'s table:
which classes ran and which losses, named alike in both, in run_stats.json
and in the memory log, from what the run did.

Each test trains a tiny reversible model in this process with trax's Loop
(4 steps, one eval at step 1, a progress line every 2 steps) and reads the
summary `format_summary` makes of it.
"""

import functools
import io
import json
import os

import numpy as np
import pytest

from trax import layers as tl
from trax import optimizers
from trax.supervised import training

import trax_revplus
from trax_revplus import compare
from trax_revplus import memory
from trax_revplus import progress
from trax_revplus.cli import summary as summaries

from conftest import reversible_lm

pytestmark = pytest.mark.usefixtures('stock_trax_and_empty_gin')

STEPS = 4


def _batches():
  k = 0
  while True:
    x = (np.arange(8).reshape((2, 4)) + k) % 9
    yield (x, (2 * x + 1) % 9, np.ones_like(x, dtype=np.float32))
    k += 1


def _train(output_dir, mode, revplus):
  """Trains the tiny model for `STEPS` steps with trax's Loop.

  Args:
    output_dir: the Loop's output dir (run_stats.json, memory.jsonl).
    mode: `use_memory_efficient_trainer`.
    revplus: whether trax_revplus is active while the model and Loop are
      built.

  Returns:
    (loop, printer).
  """
  if revplus:
    trax_revplus.activate()
  optimizer = optimizers.Adam if mode else optimizers.Adam()
  loop = training.Loop(
    reversible_lm(),
    [training.TrainTask(_batches(), tl.CrossEntropyLoss(), optimizer)],
    eval_tasks=[
      training.EvalTask(
        _batches(),
        [tl.CrossEntropyLoss()],
        metric_names=['loss'],
        n_eval_batches=1,
      )
    ],
    eval_at=lambda step: step == 1,
    output_dir=str(output_dir),
    random_seed=0,
    use_memory_efficient_trainer=mode,
    callbacks=[
      functools.partial(
        progress.ProgressPrinter,
        total_steps=STEPS,
        every_n_steps=2,
        stream=io.StringIO(),
      )
    ],
  )
  loop.run(STEPS)
  printer = next(
    c
    for c in loop._callbacks  # pylint: disable=protected-access
    if isinstance(c, progress.ProgressPrinter)
  )
  return loop, printer


def _summary_rows(loop, printer):
  """The summary's rows, and run_stats.json as the run wrote it."""
  text = summaries.format_summary(
    printer.summary(), loop, None, None, 'train.log', STEPS
  )
  with open(
    os.path.join(loop.output_dir, 'run_stats.json'), encoding='utf-8'
  ) as f:
    stats = json.load(f)
  return summaries.summary_rows(text), stats


def _start_record(output_dir):
  records = memory.read_memory_log(os.path.join(output_dir, 'memory.jsonl'))
  return next(r for r in records if r['phase'] == 'start')


def test_stock_classes_are_named_while_trax_revplus_is_active(tmp_path):
  """A stock run summarized after trax_revplus was activated (the names
  are read when the run ends, not when it was built) names stock trax's
  classes, by the classes its layers are."""
  loop, printer = _train(tmp_path, True, revplus=False)
  trax_revplus.activate()
  rows, stats = _summary_rows(loop, printer)
  assert stats['trainer'] == 'trax.optimizers.trainer.ReversibleSerialTrainer'
  assert stats['reversible_layers'].startswith(
    'trax.layers.reversible.ReversibleHalfResidual x'
  )
  assert rows['trainer'] == stats['trainer']
  assert rows['reversible layers'] == stats['reversible_layers']


def test_our_classes_are_named_alike_in_summary_stats_and_memory_log(
  tmp_path,
):
  loop, printer = _train(tmp_path, True, revplus=True)
  rows, stats = _summary_rows(loop, printer)
  assert stats['trainer'] == 'trax_revplus.trainer.ReversibleSerialTrainer'
  assert stats['reversible_layers'].startswith(
    'trax_revplus.layers.ReversibleHalfResidual x'
  )
  assert rows['trainer'] == stats['trainer']
  assert rows['reversible layers'] == stats['reversible_layers']
  start = _start_record(tmp_path)
  assert start['trainer'] == stats['trainer']
  assert start['reversible_layers'] == stats['reversible_layers']


def test_trax_default_trainer_is_named_with_the_layers_it_trained(tmp_path):
  loop, printer = _train(tmp_path, False, revplus=True)
  trax_revplus.deactivate()
  rows, stats = _summary_rows(loop, printer)
  assert stats['trainer'] == 'trax.optimizers.trainer.Trainer'
  assert stats['reversible_layers'].startswith(
    'trax_revplus.layers.ReversibleHalfResidual x'
  )
  assert rows['trainer'] == stats['trainer']
  assert rows['reversible layers'] == stats['reversible_layers']


def test_each_loss_row_says_which_steps_it_is_of(tmp_path):
  loop, printer = _train(tmp_path, True, revplus=False)
  rows, stats = _summary_rows(loop, printer)
  assert not [name for name in rows if 'final' in name], rows
  last_step, last_loss = stats['steps'][-1], stats['loss'][-1]
  assert last_step == STEPS
  assert rows['train loss, last step'] == (
    f'{last_loss:.4f} nats (step {last_step})'
  )
  # The last progress line's steps: 3 and 4.
  mean = np.mean(stats['loss'][2:])
  assert rows['train loss, mean'] == (
    f'{mean:.4f} nats (mean of steps 3-{last_step}, as on the last '
    f'progress line)'
  )
  # The one eval ran at step 1 of the 4: not called final.
  ((eval_step, eval_loss),) = loop.history.get('eval', 'metrics/loss')
  assert eval_step == 1
  assert rows['last eval loss'] == (
    f'{eval_loss:.4f} nats (step {eval_step} of {last_step})'
  )

  # compare's table shows the same figure under the same name.
  run = compare.collect_run(
    'stock', 0, '', str(tmp_path), str(tmp_path / 'stock.log'), 1.0
  )
  report = compare.build_report(
    [], [], STEPS, 0, False, {'stock': run, 'revplus': dict(run)}
  )
  table = compare.format_table(report)
  (row,) = [
    line for line in table.splitlines() if line.startswith('train loss, ')
  ]
  assert row.split('  ')[0] == 'train loss, last step (nats)'
  assert row.split()[-2:] == [f'{last_loss:.4f}'] * 2
  assert rows['train loss, last step'].startswith(row.split()[-1] + ' nats')
  assert f'  reversible layers  {rows["reversible layers"]}' in table
