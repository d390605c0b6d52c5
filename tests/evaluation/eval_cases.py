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
from jax import numpy as jnp
import numpy as np
from trax import fastmath
from trax import layers as tl
from trax import optimizers
from trax import shapes
from trax.supervised import training

from conftest import lsh_reformer_lm
import trax_revplus

RNG = fastmath.random.get_prng(5)
BUDGET = 'trax_revplus.ReversibleSerialTrainer.device_memory_budget_bytes'


def metrics():
  """trax's weighted metrics (means over the batch's loss weights) and
  `SequenceAccuracy` (a mean over rows)."""
  return [tl.WeightedCategoryCrossEntropy(), tl.WeightedCategoryAccuracy(),
          tl.SequenceAccuracy()]


def eval_batch(rows=8, length=16):
  """(tokens, targets, loss weights) of `rows` rows; the first half of the
  rows weighs only its first quarter of positions, so a mean of the
  metrics of parts of the rows is not the batch's."""
  tokens = np.random.RandomState(0).randint(
      1, 16, size=(rows, length)).astype(np.int32)
  weights = np.ones((rows, length), np.float32)
  weights[:rows // 2, length // 4:] = 0.0
  return tokens, tokens, weights


def loop(output_dir, budget_bytes='auto', ours_=True):
  """A memory-efficient `training.Loop` on trax_revplus (activated here;
  `ours_` False: stock trax) of a tiny LSH ReformerLM with dropout,
  evaluating its `mode='eval'` model on `eval_batch()` with `metrics()`;
  the trainer's device memory budget is `budget_bytes`. Nothing is
  trained."""
  if ours_:
    trax_revplus.activate()
  else:
    trax_revplus.deactivate()
  gin.clear_config()
  if budget_bytes != 'auto':
    gin.bind_parameter(BUDGET, budget_bytes)
  batch = eval_batch()
  task = training.TrainTask(itertools.repeat(batch),
                            tl.WeightedCategoryCrossEntropy(), optimizers.Adam)
  eval_task = training.EvalTask(itertools.repeat(batch), metrics(),
                                n_eval_batches=1)
  return training.Loop(
      lsh_reformer_lm('train', dropout=0.1), [task],
      eval_model=lsh_reformer_lm('eval'), eval_tasks=[eval_task],
      output_dir=output_dir, use_memory_efficient_trainer=True,
      random_seed=0)


def evaluator(loop_):
  """The loop's (first) `_Evaluator`."""
  return loop_._evaluator_per_task[0]  # pylint: disable=protected-access


def arguments(loop_, batch=None, rng=RNG):
  """`metrics_fn`'s arguments as `Loop.run_evals` passes them."""
  batch = eval_batch() if batch is None else batch
  ev = evaluator(loop_)
  return (batch, (loop_.model.weights, ev.weights),
          (loop_.model.state, ev.state), rng)


def ours(loop_, batch=None, rng=RNG):
  """The loop's eval metrics on `batch` (float64 array, one per metric)."""
  values, _ = evaluator(loop_).metrics_fn(*arguments(loop_, batch, rng))
  return np.asarray(values, np.float64)


def stock(loop_, batch=None, rng=RNG):
  """Stock trax's CPU eval metrics on the loop's weights and state;
  deactivates trax_revplus."""
  trax_revplus.deactivate()
  batch = eval_batch() if batch is None else batch
  model = lsh_reformer_lm('eval')
  model.init(shapes.signature(batch[0]))
  eval_task = training.EvalTask(itertools.repeat(batch), metrics(),
                                n_eval_batches=1)
  # pylint: disable=protected-access
  model_with_metrics = training._model_with_metrics(model, eval_task)
  metrics_fn = training._accelerate_model_with_metrics(model_with_metrics, 0)
  # pylint: enable=protected-access
  values, _ = metrics_fn(
      batch, (loop_.model.weights, model_with_metrics.weights[1]),
      (loop_.model.state, model_with_metrics.state[1]), rng)
  return np.asarray(values, np.float64)


def mean_of_parts(loop_, parts, batch=None, rng=RNG):
  """The mean over `parts` parts of the rows of trax's metrics layer on
  each part's rows of stock's logits of the whole batch: what averaging
  per-part metrics would report (1: the batch's metrics); deactivates
  trax_revplus."""
  trax_revplus.deactivate()
  batch = eval_batch() if batch is None else batch
  model = lsh_reformer_lm('eval')
  model.init(shapes.signature(batch[0]))
  # As JAX arrays: stock's LSH layers index numpy weights inside a loop.
  weights, state = jax.tree_util.tree_map(
      jnp.asarray, (loop_.model.weights, loop_.model.state))
  logits, _ = model.pure_fn(batch[0], weights, state, rng)
  metrics_layer = tl.Branch(*metrics())
  b = batch[0].shape[0] // parts
  rows = lambda x, i: x[i * b:(i + 1) * b]
  values = [metrics_layer((rows(logits, i), rows(batch[1], i),
                           rows(batch[2], i))) for i in range(parts)]
  return np.mean(np.asarray(values, np.float64), axis=0)
