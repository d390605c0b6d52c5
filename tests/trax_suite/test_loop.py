"""trax's training.Loop with use_memory_efficient_trainer=1 and 2 under ours.

Checks that a Loop trains, evaluates and checkpoints with our trainer; that
6 steps equal 3 steps + restart from the checkpoint + 3 steps; that
checkpoints move both ways between trax's stock trainer and ours; and that
`memory.jsonl` is written and plausible. The reference for every weight
comparison is a run without restarts, and stock trax's own trainer where it
runs (mode 1, single device). Also: the memory-efficient Loop evaluates its
eval-mode model (reference: a stock `mode='eval'` model on the same
weights), rejects an optimizer instance before initializing anything, and
calls no deprecated JAX API.
"""

import itertools
import os
import shutil
import sys
import warnings

import gin
import numpy as np
import psutil
import pytest

from trax import fastmath
from trax import layers as tl
from trax import models
from trax import optimizers
from trax import shapes
from trax.supervised import training

import trax_revplus
from trax_revplus import compat
from trax_revplus import memory
from trax_revplus import trainer as rev_trainer
from trax_revplus import validation
from conftest import reversible_lm


pytestmark = pytest.mark.usefixtures('stock_trax_and_empty_gin')


def _batches():
  rows = [np.arange(8).reshape((2, 4)) + k for k in range(3)]
  k = 0
  while True:
    x = rows[k % 3] % 9
    yield (x, (2 * x + 1) % 9, np.ones_like(x, dtype=np.float32))
    k += 1


def _loop(output_dir, mode, ours):
  if ours:
    trax_revplus.activate()
  else:
    trax_revplus.deactivate()
  task = training.TrainTask(
    _batches(), tl.CrossEntropyLoss(), optimizers.Adam, n_steps_per_checkpoint=3
  )
  # A constant eval batch, so evals after a restart see the same data.
  eval_batch = next(_batches())
  eval_task = training.EvalTask(
    itertools.repeat(eval_batch),
    [tl.CrossEntropyLoss(), tl.Accuracy()],
    n_eval_batches=1,
  )
  loop = training.Loop(
    reversible_lm(),
    [task],
    eval_tasks=[eval_task],
    output_dir=output_dir,
    random_seed=0,
    eval_at=lambda step: step % 3 == 0,
    use_memory_efficient_trainer=mode,
  )
  trainer = loop._trainer_per_task[0]  # pylint: disable=protected-access
  assert isinstance(trainer, rev_trainer.ReversibleSerialTrainer) == ours
  return loop


def _weights(loop):
  weights = fastmath.tree_flatten(loop.model.weights)
  assert weights
  for w in weights:
    assert isinstance(w, np.ndarray), type(w)
  return weights


def _assert_close(a, b, tol=1e-5):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    np.testing.assert_allclose(x, y, rtol=0, atol=tol)


def _eval_values(loop):
  return [v for _, v in loop.history.get('eval', 'metrics/CrossEntropyLoss')]


@pytest.mark.slow
def test_loop_modes_restart_and_cross_compatibility(tmp_path, monkeypatch):
  gin.bind_parameter(
    'trax_revplus.ReversibleSerialTrainer.memory_log_every_n_steps', 1
  )

  # Continuous 6 steps with ours, mode 1.
  continuous = _loop(str(tmp_path / 'continuous'), 1, ours=True)
  initial = [w.copy() for w in _weights(continuous)]
  continuous.run(6)
  assert continuous.step == 6
  reference = _weights(continuous)
  assert not np.allclose(reference[0], initial[0])
  assert len(_eval_values(continuous)) == 2  # evaluated at steps 3 and 6
  assert os.path.exists(tmp_path / 'continuous' / 'model.pkl.gz')

  # Continuous 6 steps with stock trax agrees (so ours is exact in a Loop).
  stock = _loop(str(tmp_path / 'stock'), 1, ours=False)
  stock.run(6)
  _assert_close(reference, _weights(stock))

  # Stock 3 steps, checkpoint; ours resumes for 3 more.
  stock3 = _loop(str(tmp_path / 'stock_to_ours'), 1, ours=False)
  stock3.run(3)
  resumed = _loop(str(tmp_path / 'stock_to_ours'), 1, ours=True)
  assert resumed.step == 3
  resumed.run(3)
  _assert_close(reference, _weights(resumed))

  # Ours in mode 2 (freeing accelerators), 3 steps, checkpoint; resumed by
  # stock (mode 1: stock's mode 2 crashes on current JAX) and by ours.
  ours3 = _loop(str(tmp_path / 'ours_to_stock'), 2, ours=True)
  ours3.run(3)
  assert len(_eval_values(ours3)) == 1
  shutil.copytree(tmp_path / 'ours_to_stock', tmp_path / 'ours_to_ours')
  # Stock trax 1.4.1 restores no optimizer slots on current JAX (its
  # fastmath.tree_unflatten compares arrays to ()), whoever wrote them; with
  # the current-JAX fix that activation binds, stock resumes ours.
  trax_revplus.deactivate()
  monkeypatch.setattr(fastmath, 'tree_unflatten', compat.tree_unflatten)
  monkeypatch.setattr(
    sys.modules['trax.fastmath.numpy'], 'tree_unflatten', compat.tree_unflatten
  )
  by_stock = _loop(str(tmp_path / 'ours_to_stock'), 1, ours=False)
  assert by_stock.step == 3
  by_stock.run(3)
  _assert_close(reference, _weights(by_stock))
  monkeypatch.undo()
  by_ours = _loop(str(tmp_path / 'ours_to_ours'), 2, ours=True)
  assert by_ours.step == 3
  by_ours.run(3)
  _assert_close(reference, _weights(by_ours))
  # Eval after the restart reads the trained weights: same as continuous.
  np.testing.assert_allclose(
    _eval_values(by_ours)[-1], _eval_values(continuous)[-1], atol=1e-5
  )

  # memory.jsonl of the continuous run (mode 1) and the mode-2 run.
  rss_now = psutil.Process(os.getpid()).memory_info().rss
  for run, phases in (
    ('continuous', {'init', 'forward', 'loss', 'backward'}),
    ('ours_to_ours', {'init', 'forward', 'loss', 'backward', 'free'}),
  ):
    records = memory.read_memory_log(
      str(tmp_path / run / memory.MEMORY_LOG_FILENAME)
    )
    assert records
    assert phases <= {r['phase'] for r in records}, run
    for r in records:
      assert isinstance(r['step'], int) and isinstance(r['phase'], str)
      assert r['device_bytes_in_use'] > 0
    steps = {r['step'] for r in records if r['phase'] == 'backward'}
    assert {1, 2, 3} <= steps or {4, 5, 6} <= steps, steps
    frees = [r for r in records if r['phase'] == 'free']
    for r in frees:
      assert r['freed_arrays'] >= 0 and r['freed_bytes'] >= 0
  last = records[-1]
  assert abs(last['host_rss_bytes'] - rss_now) <= 0.1 * rss_now


# ---------------------------------------------------------------------------
# Evaluation with an eval-mode model; bad optimizers; deprecated JAX calls.


def _dropout_reformer(mode):
  # Full self-attention: no LSH hashing, so in eval mode nothing is random.
  return models.ReformerLM(
    vocab_size=16,
    d_model=16,
    d_ff=32,
    d_attention_key=8,
    d_attention_value=8,
    n_layers=2,
    n_heads=2,
    max_len=16,
    dropout=0.5,
    attention_type=tl.SelfAttention,
    mode=mode,
  )


def _lm_batch():
  x = np.random.RandomState(0).randint(1, 16, size=(2, 16)).astype(np.int32)
  return x, x, np.ones_like(x, dtype=np.float32)


def _deprecations(record):
  return [
    str(w.message)
    for w in record
    if 'deprecated' in str(w.message) or 'renamed' in str(w.message)
  ]


def test_memory_efficient_loop_evaluates_the_eval_model(tmp_path):
  """Eval loss of a `mode='eval'` model (dropout off) on the trained weights.

  trax's memory-efficient Loop evaluates the training model, dropout on.
  """
  trax_revplus.activate()
  batch = _lm_batch()
  task = training.TrainTask(
    itertools.repeat(batch), tl.WeightedCategoryCrossEntropy(), optimizers.Adam
  )
  eval_task = training.EvalTask(
    itertools.repeat(batch),
    [tl.WeightedCategoryCrossEntropy()],
    n_eval_batches=1,
  )
  with warnings.catch_warnings(record=True) as record:
    warnings.simplefilter('always')
    loop = training.Loop(
      _dropout_reformer('train'),
      [task],
      eval_model=_dropout_reformer('eval'),
      eval_tasks=[eval_task],
      eval_at=lambda step: step == 2,
      output_dir=str(tmp_path),
      use_memory_efficient_trainer=True,
      random_seed=0,
    )
    loop.run(2)
  # No deprecated JAX call on the way (jax.host_count, jit(device=...)).
  assert not _deprecations(record)
  reported = loop.history.get('eval', 'metrics/WeightedCategoryCrossEntropy')
  assert [step for step, _ in reported] == [2]

  trax_revplus.deactivate()  # The references are stock trax models.

  def loss_of(mode):
    model = _dropout_reformer(mode)
    model.init(shapes.signature(batch[0]))
    model.weights, model.state = loop.model.weights, loop.model.state
    logits = model(batch[0], rng=fastmath.random.get_prng(1))
    return float(tl.WeightedCategoryCrossEntropy()((logits,) + batch[1:]))

  np.testing.assert_allclose(reported[0][1], loss_of('eval'), rtol=1e-5)
  # Dropout matters here: a train-mode evaluation is far off.
  assert abs(loss_of('train') - loss_of('eval')) > 0.05
  # The eval model holds the trained arrays themselves, not a copy.
  assert loop.eval_model is not loop.model
  for ours, trained in zip(
    fastmath.tree_flatten(loop.eval_model.weights),
    fastmath.tree_flatten(loop.model.weights),
  ):
    assert ours is trained


def test_memory_efficient_loop_rejects_an_optimizer_instance_at_once():
  trax_revplus.activate()
  model = reversible_lm()
  task = training.TrainTask(
    _batches(), tl.CrossEntropyLoss(), optimizers.Adam(0.01)
  )
  with pytest.raises(
    validation.OptimizerFactoryError,
    match=r'optimizer of task 0 is an optimizer instance '
    r'\(Adam\(\.\.\.\)\).*pass TrainTask\(\.\.\., '
    r'optimizer=trax\.optimizers\.Adam\), not '
    r'trax\.optimizers\.Adam\(\)',
  ):
    training.Loop(model, [task], use_memory_efficient_trainer=True)
  # Before anything was initialized (trax fails after initializing).
  assert not fastmath.tree_flatten(model.weights)
  # The standard Loop takes an instance, with trax_revplus as without.
  training.Loop(model, [task], use_memory_efficient_trainer=False)
