"""Loops, an eval batch and stock trax's CPU eval, for the eval tests.

Shared by tests/evaluation/test_evaluator.py and its 2-device worker
(tests/evaluation/eval_worker.py). The reference is stock trax's eval as
its memory-efficient `Loop` runs it: `training._model_with_metrics` of a
stock `mode='eval'` model, compiled by `_accelerate_model_with_metrics(...,
0)` (`jit` on the host's CPU device), on the same weights, state, batch and
RNG.
"""

import itertools

import gin
import jax
import numpy as np
from trax import fastmath
from trax import layers as tl
from trax import optimizers
from trax import shapes
from trax.supervised import training

from conftest import lsh_reformer_lm
import trax_revplus
from trax_revplus import evaluation

RNG = fastmath.random.get_prng(5)
BUDGET = 'trax_revplus.ReversibleSerialTrainer.device_memory_budget_bytes'


def metrics():
  """trax's weighted metrics (means over the batch's loss weights) and
  `SequenceAccuracy` (a mean over rows)."""
  return [
    tl.WeightedCategoryCrossEntropy(),
    tl.WeightedCategoryAccuracy(),
    tl.SequenceAccuracy(),
  ]


def eval_batch(rows=8, length=16):
  """(tokens, targets, loss weights) of `rows` rows; the first half of the
  rows weighs only its first quarter of positions, so a mean of the
  metrics of parts of the rows is not the batch's."""
  tokens = (
    np.random.RandomState(0)
    .randint(1, 16, size=(rows, length))
    .astype(np.int32)
  )
  weights = np.ones((rows, length), np.float32)
  weights[: rows // 2, length // 4 :] = 0.0
  return tokens, tokens, weights


def loop(output_dir, budget_bytes='auto', ours_=True, **sizes):
  """A memory-efficient `training.Loop` on trax_revplus (activated here;
  `ours_` False: stock trax) of a tiny LSH ReformerLM with dropout
  (`conftest.lsh_reformer_lm(**sizes)`), evaluating its `mode='eval'`
  model on `eval_batch()` with `metrics()`; the trainer's device memory
  budget is `budget_bytes`. Nothing is trained."""
  if ours_:
    trax_revplus.activate()
  else:
    trax_revplus.deactivate()
  gin.clear_config()
  if budget_bytes != 'auto':
    gin.bind_parameter(BUDGET, budget_bytes)
  batch = eval_batch()
  task = training.TrainTask(
    itertools.repeat(batch), tl.WeightedCategoryCrossEntropy(), optimizers.Adam
  )
  eval_task = training.EvalTask(
    itertools.repeat(batch), metrics(), n_eval_batches=1
  )
  return training.Loop(
    lsh_reformer_lm('train', dropout=0.1, **sizes),
    [task],
    eval_model=lsh_reformer_lm('eval', **sizes),
    eval_tasks=[eval_task],
    output_dir=output_dir,
    use_memory_efficient_trainer=True,
    random_seed=0,
  )


def evaluator(loop_):
  """The loop's (first) `_Evaluator`."""
  return loop_._evaluator_per_task[0]  # pylint: disable=protected-access


def arguments(loop_, batch=None, rng=RNG):
  """`metrics_fn`'s arguments as `Loop.run_evals` passes them."""
  batch = eval_batch() if batch is None else batch
  ev = evaluator(loop_)
  return (
    batch,
    (loop_.model.weights, ev.weights),
    (loop_.model.state, ev.state),
    rng,
  )


def evaluate(loop_, budget_bytes, batch=None, rng=RNG):
  """(metrics, plan) of a new `evaluation.DeviceEvaluator` of the loop's
  model with metrics on its trainer's placement, under `budget_bytes`."""
  trainer = loop_._trainer_per_task[0]  # pylint: disable=protected-access
  metrics_fn = evaluation.DeviceEvaluator(
    evaluator(loop_).metrics_fn.model_with_metrics,
    trainer.placement,
    budget_bytes,
  )
  args = arguments(loop_, batch, rng)
  values, _ = metrics_fn(*args)
  return np.asarray(values, np.float64), metrics_fn.planned(*args).plan


def ours(loop_, batch=None, rng=RNG):
  """The loop's eval metrics on `batch` (float64 array, one per metric)."""
  values, _ = evaluator(loop_).metrics_fn(*arguments(loop_, batch, rng))
  return np.asarray(values, np.float64)


def stock(loop_, batch=None, rng=RNG, **sizes):
  """Stock trax's CPU eval metrics on the loop's weights and state (its
  model of `sizes`); deactivates trax_revplus."""
  trax_revplus.deactivate()
  batch = eval_batch() if batch is None else batch
  model = lsh_reformer_lm('eval', **sizes)
  model.init(shapes.signature(batch[0]))
  eval_task = training.EvalTask(
    itertools.repeat(batch), metrics(), n_eval_batches=1
  )
  # pylint: disable=protected-access
  model_with_metrics = training._model_with_metrics(model, eval_task)
  metrics_fn = training._accelerate_model_with_metrics(model_with_metrics, 0)
  # pylint: enable=protected-access
  values, _ = metrics_fn(
    batch,
    (loop_.model.weights, model_with_metrics.weights[1]),
    (loop_.model.state, model_with_metrics.state[1]),
    rng,
  )
  return np.asarray(values, np.float64)


def means_of_parts(loop_, parts, batch=None, rng=RNG):
  """For each count in `parts`, the mean over that many parts of the rows
  of trax's metrics layer on each part's rows of stock's logits of the
  whole batch: what averaging per-part metrics would report (1: the
  batch's metrics); deactivates trax_revplus."""
  trax_revplus.deactivate()
  batch = eval_batch() if batch is None else batch
  model = lsh_reformer_lm('eval')
  model.init(shapes.signature(batch[0]))
  logits, _ = jax.jit(model.pure_fn)(
    batch[0], loop_.model.weights, loop_.model.state, rng
  )
  metrics_layer = tl.Branch(*metrics())
  means = []
  for k in parts:
    b = batch[0].shape[0] // k
    rows = lambda x, i, b=b: x[i * b : (i + 1) * b]
    values = [
      metrics_layer((rows(logits, i), rows(batch[1], i), rows(batch[2], i)))
      for i in range(k)
    ]
    means.append(np.mean(np.asarray(values, np.float64), axis=0))
  return means
