"""Models, batches and references the trainer tests share.

Every reference is trax's own `optimizers.Trainer` on
`tl.Serial(blocks + [loss_layer])`, or stock trax's
`ReversibleSerialTrainer` on the same blocks (`stock_self_attention_lm`),
run on the same inputs and RNGs.
"""

import functools
import json
import os
import threading

import jax
import numpy as np
import trax
from trax import fastmath
from trax import layers as tl
from trax import optimizers
from trax import shapes
from trax.optimizers import trainer as trainer_module

from conftest import reversible_lm_blocks
from conftest import self_attention_lm
from trax_revplus import trainer as rev_trainer


def assert_all_close(t1, t2, tol=1e-5):
  f1, f2 = fastmath.tree_flatten(t1), fastmath.tree_flatten(t2)
  assert len(f1) == len(f2)
  assert f1, 'nothing to compare'
  for x1, x2 in zip(f1, f2):
    x1, x2 = np.asarray(x1), np.asarray(x2)
    assert x1.shape == x2.shape
    np.testing.assert_allclose(x1, x2, rtol=0, atol=tol)


def batch():
  inputs = np.arange(8).reshape((2, 4))
  return (inputs, 2 * inputs, np.ones_like(inputs))


RNGS = [
  fastmath.random.get_prng(7),
  fastmath.random.get_prng(8),
  fastmath.random.get_prng(9),
]
LRS = [None, 0.02, 0.03]


def train(trainer, batch_, n_steps):
  """`n_steps` steps on `batch_`: step i with RNG `get_prng(7 + i)` (`RNGS`
  for the first three) and learning rate `LRS[i]` (the last one after
  them); returns the losses."""
  losses = []
  for i in range(n_steps):
    rng = RNGS[i] if i < len(RNGS) else fastmath.random.get_prng(7 + i)
    loss, _ = trainer.one_step(
      batch_, rng, learning_rate=LRS[min(i, len(LRS) - 1)]
    )
    losses.append(loss)
  return losses


def basic_model(rate=0.5):
  first = tl.Serial(tl.Embedding(9, 4), tl.Dropout(rate), tl.Dup())
  revs = [
    tl.ReversibleHalfResidual(tl.Dense(4), tl.Dropout(0.2)),
    tl.ReversibleSwap(),
    tl.ReversibleHalfResidual(tl.Dropout(0.5), tl.Dense(4)),
    tl.ReversibleSwap(),
  ]
  loss = tl.Serial(
    tl.Concatenate(),
    tl.Dense(19),
    tl.Dropout(0.3),
    tl.LogSoftmax(),
    tl.CrossEntropyLoss(),
  )
  return first, revs, loss


def extended_model(mid_rate=0.3):
  first = tl.Serial(tl.Embedding(9, 4), tl.Dropout(0.5), tl.Dup())
  revs1 = [
    tl.ReversibleHalfResidual(tl.Dense(4), tl.Dropout(0.2)),
    tl.ReversibleSwap(),
    tl.ReversibleHalfResidual(tl.Dropout(0.5), tl.Dense(4)),
    tl.ReversibleSwap(),
  ]
  mid = tl.Serial(tl.Add(), tl.Dense(4), tl.Dup())
  revs2 = [
    tl.ReversibleHalfResidual(tl.Dense(4), tl.Dropout(mid_rate)),
    tl.ReversibleSwap(),
  ]
  loss = tl.Serial(
    tl.Concatenate(),
    tl.Dense(19),
    tl.Dropout(0.3),
    tl.LogSoftmax(),
    tl.CrossEntropyLoss(),
  )
  return first, revs1, mid, revs2, loss


def default_trainer(model, optimizer_fn):
  """trax's default Trainer on one device for the initialized `model`, with
  a fresh `optimizer_fn()`: (trainer, optimizer)."""
  optimizer = optimizer_fn()
  optimizer.tree_init(model.weights)
  return optimizers.Trainer(model, optimizer, n_devices=1), optimizer


def reference(model, init, optimizer_fn, n_steps, batch_):
  """Trains with trax's default Trainer; returns (weights, slots, state)."""
  init()
  trainer, optimizer = default_trainer(model, optimizer_fn)
  train(trainer, batch_, n_steps)
  return model.weights, optimizer.slots, model.state


@functools.lru_cache(maxsize=1)
def basic_adam_reference_3_steps():
  """trax's default Trainer on `basic_model`, Adam, 3 steps (host copies)."""
  batch_ = batch()
  first, revs, loss = basic_model()
  model = tl.Serial([first] + revs + [loss])
  init = lambda: model.init(batch_, rng=fastmath.random.get_prng(12))
  return jax.tree_util.tree_map(
    np.asarray, reference(model, init, optimizers.Adam, 3, batch_)
  )


def host_leaves_only(tree):
  for x in fastmath.tree_flatten(tree):
    assert isinstance(x, np.ndarray), type(x)


def train_basic(n_steps=2, **kwargs):
  """Ours on `basic_model`, Adam: (model, trainer, losses)."""
  batch_ = batch()
  first, revs, loss = basic_model()
  model = tl.Serial([first] + revs + [loss])
  model.init(batch_, rng=fastmath.random.get_prng(12))
  trainer = rev_trainer.ReversibleSerialTrainer(
    [(first.sublayers, revs)], loss, optimizers.Adam, **kwargs
  )
  losses = train(trainer, batch_, n_steps)
  return model, trainer, losses


def count_compiles():
  """Returns a list that grows by one per XLA backend compilation: the name
  of the thread that compiled."""
  events = []

  def listener(name, *unused_args, **unused_kwargs):
    if name == '/jax/core/compile/backend_compile_duration':
      events.append(threading.current_thread().name)

  jax.monitoring.register_event_duration_secs_listener(listener)
  return events


def count_accounted(monkeypatch):
  """The plans whose step is compiled and accounted whole from now on
  (`on_types.AheadOfTime.memory`), in order (a list that grows as they
  are)."""
  from trax_revplus.trainer._accounting import on_types  # pylint: disable=g-import-not-at-top

  plans = []
  memory = on_types.AheadOfTime.memory

  def counting(ahead):
    plans.append(ahead.plan)
    return memory(ahead)

  monkeypatch.setattr(on_types.AheadOfTime, 'memory', counting)
  return plans


def small_reformer_lm(
  attention_type, *, n_layers=2, n_heads=2, max_len=16, dropout=0.0, d_model=16
):
  """trax's ReformerLM at test size in train mode: vocab 16, d_ff 32,
  attention keys and values of 8, `attention_type` (a layer class, a
  partial of one, or a list of them taken in turn), `dropout` its rate."""
  return trax.models.ReformerLM(
    16,
    d_model=d_model,
    d_ff=32,
    d_attention_key=8,
    d_attention_value=8,
    n_layers=n_layers,
    n_heads=n_heads,
    max_len=max_len,
    dropout=dropout,
    attention_type=attention_type,
    mode='train',
  )


def lsh_model(**attention):
  """A dropout-free 2-layer ReformerLM with LSH attention (vocab 16, inputs
  of length 16 or 32), in train mode; `attention`: more arguments of its
  `LSHSelfAttention`."""
  return small_reformer_lm(
    functools.partial(
      tl.LSHSelfAttention, chunk_len=4, n_buckets=4, n_hashes=2, **attention
    ),
    max_len=32,
  )


def lm_batch(rows=4, zero_rows=()):
  """(tokens, targets, weights) for `reversible_lm_blocks`: int32 (rows, 6)
  each, weights 0 or 1 (float32), all 0 on `zero_rows`."""
  rs = np.random.RandomState(5)
  tokens = rs.randint(0, 9, size=(rows, 6)).astype(np.int32)
  targets = rs.randint(0, 9, size=(rows, 6)).astype(np.int32)
  weights = rs.randint(0, 2, size=(rows, 6)).astype(np.float32)
  weights[list(zero_rows)] = 0.0
  return tokens, targets, weights


def lm_trainer(batch_, **kwargs):
  """Ours on the dropout-free `reversible_lm_blocks`, Adam: (model,
  trainer)."""
  first, revs, loss = reversible_lm_blocks()
  model = tl.Serial([first] + revs + [loss])
  model.init(batch_, rng=fastmath.random.get_prng(12))
  return model, rev_trainer.ReversibleSerialTrainer(
    [(first.sublayers, revs)], loss, optimizers.Adam, **kwargs
  )


@functools.lru_cache(maxsize=2)
def lm_reference_3_steps(zero_rows=()):
  """trax's default Trainer on `reversible_lm_blocks` and `lm_batch`, Adam,
  3 steps: (weights, slots, state) host copies."""
  batch_ = lm_batch(zero_rows=zero_rows)
  first, revs, loss = reversible_lm_blocks()
  model = tl.Serial([first] + revs + [loss])
  init = lambda: model.init(batch_, rng=fastmath.random.get_prng(12))
  return jax.tree_util.tree_map(
    np.asarray, reference(model, init, optimizers.Adam, 3, batch_)
  )


def fused_plan(trainer, batch_, slices=1):
  """The planner's fused candidate of `slices` slices for `batch_`: every
  layer in the loss's one program."""
  p = trainer.planner
  candidates = p.candidates(p.step_types(batch_))
  # The first: attention layers as the trainer's settings run them (the
  # groups with fewer heads at once come after).
  return [
    group.leanest
    for group in candidates.groups()
    if group.fused_reversible_layers and group.leanest.batch_slices == slices
  ][0]


def set_plan(trainer, batch_, plan):
  """Makes `trainer` step on `batch_`'s shapes with `plan` in place of the
  planner's; returns the plan's accounted `StepMemory`."""
  # pylint: disable=g-import-not-at-top,protected-access
  from trax_revplus.trainer._search import planner
  from trax_revplus.trainer._step import units as units_lib

  p = trainer.planner
  units = units_lib.Units(plan, p._factory)
  memory = p.account(plan, units, p.step_types(batch_))
  p._planned[planner.batch_key(p._placement.abstract_batch(batch_))] = (
    units_lib.PlannedStep(plan, units, memory)
  )
  return memory


def check_logged_peaks(trainer, batch_, output_dir):
  """Runs step 1 of `trainer` (built with `memory_log_every_n_steps=1` and
  `output_dir`) on `batch_`, then checks that the memory log's forward, loss
  and backward records give the accounted step's peaks."""
  expected = trainer.device_memory_of(batch_)
  trainer.one_step(batch_, RNGS[0], step=1)
  trainer.memory_log.close()
  with open(os.path.join(output_dir, 'memory.jsonl')) as f:
    records = [json.loads(line) for line in f]
  step = [
    r
    for r in records
    if r['step'] == 1 and r['phase'] in ('forward', 'loss', 'backward')
  ]
  assert {r['phase'] for r in step} == {'forward', 'loss', 'backward'}
  for r in step:
    assert r['peak_device_bytes'] == expected.peak_device_bytes
    assert r['phase_peak_device_bytes'] == expected.phase_peaks()[r['phase']]
  assert max(r['phase_peak_device_bytes'] for r in step) == (
    expected.peak_device_bytes
  )


_LM_STEPS = 2


def self_attention_lm_batch(length=16):
  tokens = np.random.RandomState(2).randint(1, 16, size=(4, length))
  tokens = tokens.astype(np.int32)
  return tokens, tokens, np.ones_like(tokens, dtype=np.float32)


def self_attention_lm_blocks(dropout, length=16, n_parallel_heads=None):
  blocks, loss = rev_trainer.extract_reversible_blocks(
    [
      self_attention_lm(dropout, n_parallel_heads),
      tl.WeightedCategoryCrossEntropy(),
    ]
  )
  rev_trainer.init_reversible_blocks(
    blocks,
    loss,
    shapes.signature(self_attention_lm_batch(length)),
    fastmath.random.get_prng(3),
  )
  return blocks, loss


def train_lm(make_trainer, model, batch_, n_steps):
  """Host leaves of every layer's weights after `n_steps` steps (`train`)
  of `model` (a trax LM, uninitialized) with trax's weighted cross-entropy
  on `batch_`, and the losses; `make_trainer(blocks, loss)` builds the
  trainer."""
  blocks, loss = rev_trainer.extract_reversible_blocks(
    [model, tl.WeightedCategoryCrossEntropy()]
  )
  rev_trainer.init_reversible_blocks(
    blocks, loss, shapes.signature(batch_), fastmath.random.get_prng(3)
  )
  trainer = make_trainer(blocks, loss)
  losses = train(trainer, batch_, n_steps)
  weights = [layer.weights for std, revs in blocks for layer in std + revs]
  return (
    [
      np.asarray(x) for x in jax.tree_util.tree_leaves(weights + [loss.weights])
    ],
    [float(np.mean(np.asarray(x))) for x in losses],
  )


def stock_trainer(blocks, loss):
  """Stock trax's ReversibleSerialTrainer on `blocks` and `loss`, Adam."""
  return trainer_module.ReversibleSerialTrainer(blocks, loss, optimizers.Adam)


def train_self_attention_lm(make_trainer, dropout, n_parallel_heads=None):
  """`train_lm` of `self_attention_lm` for `_LM_STEPS` steps."""
  return train_lm(
    make_trainer,
    self_attention_lm(dropout, n_parallel_heads),
    self_attention_lm_batch(),
    _LM_STEPS,
  )


@functools.lru_cache(maxsize=4)
def stock_self_attention_lm(dropout, n_parallel_heads=None):
  """Stock trax's ReversibleSerialTrainer on `self_attention_lm`, Adam:
  as `train_self_attention_lm` returns."""
  return train_self_attention_lm(stock_trainer, dropout, n_parallel_heads)
