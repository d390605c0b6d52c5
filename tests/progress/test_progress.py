"""ProgressPrinter: the loss each step returned, and compilations counted.

The losses the printer records must be those trax's Loop itself records in
its history (the Loop accumulates what its `_run_one_step` returned), for
trax's default `Trainer` and for the memory-efficient trainer, with the
trainer left as it is. Compilations come from JAX's monitoring events: with
trax's default trainer, a batch of a new shape compiles the step again, and
the printer says so at that step and no other.
"""

import functools
import os
import io
import json

import numpy as np
import pytest

from trax import layers as tl
from trax import optimizers
from trax.supervised import training

import trax_revplus
from trax_revplus import progress
from trax_revplus.progress import run_stats as run_stats_lib

from conftest import reversible_lm

pytestmark = pytest.mark.usefixtures('stock_trax_and_empty_gin')


def _batches(lengths, shapes=None):
  """Batches (x, y, weights) of shape (2, L), L from `lengths`, then the last.

  Appends the shape of each batch yielded to `shapes`, if given.
  """
  k = 0
  while True:
    length = lengths[min(k, len(lengths) - 1)]
    x = (np.arange(2 * length).reshape((2, length)) + k) % 9
    if shapes is not None:
      shapes.append(x.shape)
    yield (x, (2 * x + 1) % 9, np.ones_like(x, dtype=np.float32))
    k += 1


def _run(
  lengths,
  n_steps,
  mode,
  eval_every_step=False,
  shapes=None,
  revplus=True,
  model_fn=reversible_lm,
):
  if mode and revplus:
    trax_revplus.activate()
  # The memory-efficient trainer makes one optimizer per layer from a
  # factory; trax's default trainer takes an optimizer.
  optimizer = optimizers.Adam if mode else optimizers.Adam()
  task = training.TrainTask(
    _batches(lengths, shapes), tl.CrossEntropyLoss(), optimizer
  )
  eval_kwargs = {}
  if eval_every_step:
    eval_kwargs = dict(
      eval_tasks=[
        training.EvalTask(
          _batches([4]), [tl.CrossEntropyLoss()], n_eval_batches=1
        )
      ],
      eval_at=lambda step: True,
    )
  stream = io.StringIO()
  loop = training.Loop(
    model_fn(),
    [task],
    random_seed=0,
    use_memory_efficient_trainer=mode,
    callbacks=[
      functools.partial(
        progress.ProgressPrinter, every_n_steps=2, stream=stream
      )
    ],
    **eval_kwargs,
  )
  loop.run(n_steps)
  printer = loop._callbacks[0]  # pylint: disable=protected-access
  return loop, printer, stream.getvalue().splitlines()


@pytest.mark.parametrize('mode', [False, True], ids=['default', 'mode1'])
def test_losses_are_those_the_loop_records(mode):
  loop, printer, lines = _run([4], 4, mode, eval_every_step=True)
  history = [
    value for _, value in loop.history.get('train', 'metrics/CrossEntropyLoss')
  ]
  stats = printer.run_stats()
  assert stats['steps'] == [1, 2, 3, 4]
  # The model's two half-residual blocks (the swaps are not counted).
  assert stats['reversible_layers'].endswith('.ReversibleHalfResidual x2')
  assert ',' not in stats['reversible_layers']
  assert len(history) == 4
  np.testing.assert_allclose(stats['loss'], history, rtol=1e-6)
  trainer = loop._trainer_per_task[0]  # pylint: disable=protected-access
  assert 'one_step' not in vars(trainer)  # The trainer is not patched.
  assert lines[0].startswith('step 1  loss ')
  assert f'{np.mean(history[2:4]):.3f}' in lines[-1]
  summary = printer.summary()
  assert summary.mean_train_loss == pytest.approx(np.mean(history[2:4]))
  assert summary.mean_train_loss_from_step == 3
  assert summary.last_train_loss == pytest.approx(history[-1])
  assert summary.last_train_loss_step == 4


def _the_step_2_notice(compiled, lines):
  """The one compile notice of a 3-step run that compiled again at step 2
  and not at step 3."""
  assert compiled[1] and not compiled[2], compiled
  notices = [line for line in lines if 'compiled in this step' in line]
  assert len(notices) == 1 and notices[0].startswith('step 2: '), lines
  return notices[0]


def test_stock_step_2_compile_names_the_weights_placement():
  """Stock's memory-efficient trainer compiles its programs again at step 2
  on equal batch shapes: its weights come as the initializers' committed
  arrays at step 1 and as host numpy copies after the update."""
  _, printer, lines = _run([4], 3, True, revplus=False)
  stats = printer.run_stats()
  notice = _the_step_2_notice(stats['compiled_programs'], lines)
  # The median later step leaves step 2's compiling out, as steps/s does.
  assert stats['median_step_seconds'] == stats['step_seconds'][2]
  assert (
    '; same batch shapes as step 1, but the trainer handed its '
    'weights over as arrays committed to a device at step 1 and as '
    'host numpy arrays now'
  ) in notice, notice


class _ReshapesItsState(tl.Layer):
  """As trax's `ConcatWithPadding`: an int32 scalar state, returned with
  shape (1,)."""

  def init_weights_and_state(self, input_signature):
    del input_signature
    self.state = np.zeros((), np.int32)

  def forward(self, inputs):
    self.state = self.state.reshape((1,))
    return inputs


@pytest.mark.parametrize('mode', [False, True], ids=['default', 'mode1'])
def test_a_state_that_changes_shape_is_named_at_its_compile(mode):
  """trax's default `Trainer` hands a layer's state on as the layer
  returns it, and compiles again at step 2; trax_revplus's trainer keeps
  the state's shape and compiles nothing then."""

  def model_fn():
    return tl.Serial(_ReshapesItsState(), reversible_lm())

  _, printer, lines = _run([4], 3, mode, model_fn=model_fn)
  compiled = printer.run_stats()['compiled_programs']
  if mode:
    assert not any(compiled[1:]), compiled
    assert not [line for line in lines if 'compiled in this step' in line]
    return
  notice = _the_step_2_notice(compiled, lines)
  assert (
    '; same batch shapes as step 1, but the state of _ReshapesItsState at '
    '[0][0] is int32[1] now and was int32[] at step 1: a layer returned '
    'its state in another shape than it was handed'
  ) in notice, notice


def test_compilations_are_counted_and_new_shapes_reported():
  shapes = []
  _, printer, lines = _run([4, 4, 4, 4, 6, 6, 8], 6, False, shapes=shapes)
  # The Loop draws the batches of steps 1..6 last (a sample comes first).
  step_shapes = shapes[-6:]
  new_shape_steps = [
    i + 1 for i, shape in enumerate(step_shapes) if shape not in step_shapes[:i]
  ]
  assert new_shape_steps == [1, 4, 6]
  compiled = printer.run_stats()['compiled_programs']
  compiling_steps = [i + 1 for i, n in enumerate(compiled) if n]
  # Every new shape compiles; a shape seen before compiles nothing (trax's
  # default trainer also compiles again at step 2, when its weights come
  # back from step 1 as arrays of another type).
  assert set(new_shape_steps) <= set(compiling_steps) <= {1, 2, 4, 6}
  assert compiled[2] == compiled[4] == 0
  notices = [line for line in lines if 'compiled in this step' in line]
  assert [n.split(':')[0] for n in notices] == [
    f'step {s}' for s in compiling_steps[1:]
  ]
  # Each notice names the programs compiled and what changed since the
  # step before: the batch's shapes at steps 4 and 6; at step 2, where
  # trax's default Trainer compiles again, not the shapes but where its
  # weights are (some uncommitted at step 1, its own committed outputs
  # after).
  assert 'jit(' in notices[0].split('): ', 1)[1], notices[0]
  for notice in notices:
    step = int(notice.split(':')[0].split()[1])
    if step in new_shape_steps:
      assert (
        '; the batch has new shapes or dtypes (int64[2, '
        f'{step_shapes[step - 1][1]}]'
      ) in notice, notice
    else:
      assert step == 2, notice
      assert '; same batch shapes as step 1, but ' in notice, notice
      assert (
        'uncommitted JAX arrays at step 1 and as arrays committed to '
        'a device now'
      ) in notice, notice
  assert 'compiling' in lines[0]  # Step 1 compiled: no rate for it.
  assert 'steps/s' not in lines[0]
  summary = printer.summary()
  assert [s for s, _, _ in summary.compiling_steps] == compiling_steps


def _loop_in(output_dir, stream):
  """trax's Loop with our memory-efficient trainer in `output_dir`, as
  `trax-revplus train` runs it: a checkpoint and an eval (of the 'loss'
  metric the summary reads) at every even step."""
  trax_revplus.activate()
  task = training.TrainTask(
    _batches([4]),
    tl.CrossEntropyLoss(),
    optimizers.Adam,
    n_steps_per_checkpoint=2,
  )
  return training.Loop(
    reversible_lm(),
    [task],
    random_seed=0,
    output_dir=output_dir,
    use_memory_efficient_trainer=True,
    eval_tasks=[
      training.EvalTask(
        _batches([4]),
        [tl.CrossEntropyLoss()],
        metric_names=['loss'],
        n_eval_batches=1,
      )
    ],
    eval_at=lambda step: step % 2 == 0,
    callbacks=[
      functools.partial(
        progress.ProgressPrinter, every_n_steps=2, stream=stream
      )
    ],
  )


def test_a_resumed_run_reports_the_eval_of_its_checkpoint_step(tmp_path):
  """trax saves step 2's checkpoint before step 2's eval, so the history a
  resumed run restores ends at an earlier eval (here: none); the summary
  still reports step 2's."""
  first = _loop_in(str(tmp_path), io.StringIO())
  first.run(2)
  evals = first._callbacks[0].summary().eval_losses  # pylint: disable=protected-access
  assert [step for step, _ in evals] == [2]
  resumed = _loop_in(str(tmp_path), io.StringIO())
  assert resumed.step == 2
  restored = resumed.history.get('eval', 'metrics/loss')
  assert 2 not in [step for step, _ in restored]  # trax's order
  resumed.run(1)  # to step 3: no eval
  assert resumed._callbacks[0].summary().eval_losses == evals  # pylint: disable=protected-access
  # A directory started over drops what its removed checkpoints evaluated.
  for name in os.listdir(tmp_path):
    if name.startswith('model'):
      os.remove(os.path.join(tmp_path, name))
  fresh = _loop_in(str(tmp_path), io.StringIO())
  assert fresh.step == 0
  fresh.run(1)
  assert fresh._callbacks[0].summary().eval_losses == []  # pylint: disable=protected-access


def test_an_eval_is_kept_before_the_run_ends(tmp_path):
  """Kept at the next step's beginning, not only by `summary`: a run killed
  before its end still leaves its evals for the resumed run."""
  loop = _loop_in(str(tmp_path), io.StringIO())
  loop.run(3)  # evaluates at step 2; no summary
  with open(os.path.join(tmp_path, 'eval_losses.json')) as f:
    kept = json.load(f)['losses']
  history = loop.history.get('eval', 'metrics/loss')
  assert [step for step, _ in kept] == [2]
  assert kept[0][1] == pytest.approx(float(history[-1][1]))


def test_the_median_step_leaves_out_the_steps_on_a_ready_plan():
  # Steps 2 and 3 ran on the plan ready first (slower, compiling nothing
  # themselves) while the fused program compiled: the median step is the
  # settled plan's (steps 4-6), and run_stats.json names them.
  class _Trainer:
    steps_on_ready_plan = [1, 2, 3]

  figures = run_stats_lib.StepFigures([_Trainer()])
  for step, seconds in zip(range(1, 7), [9.0, 3.0, 3.0, 1.0, 1.2, 1.1]):
    figures.begin_step()
    figures.end_step(step, 1.0, seconds, 0)
  stats = figures.run_stats()
  assert stats['steps_on_ready_plan'] == [1, 2, 3]
  assert stats['median_step_seconds'] == 1.1
  # A trainer without the attribute (trax's): every later step counts.
  figures = run_stats_lib.StepFigures([object()])
  for step, seconds in zip(range(1, 4), [9.0, 3.0, 1.0]):
    figures.begin_step()
    figures.end_step(step, 1.0, seconds, 0)
  stats = figures.run_stats()
  assert stats['steps_on_ready_plan'] == []
  assert stats['median_step_seconds'] == 2.0
