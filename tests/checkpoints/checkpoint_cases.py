"""Shared helpers and fixtures of the checkpoint tests.

A Loop with dropout over a tiny reversible model trains 6 steps
uninterrupted (`continuous`); the reference for every comparison is that
run, trained once per test process and shared by the modules that use the
fixture (import it from here).
"""

import os
import shutil

import numpy as np
import pytest

from absl import logging as absl_logging
import gin
from trax import fastmath
from trax import layers as tl
from trax import optimizers
from trax.data import inputs as trax_inputs
from trax.supervised import training

import trax_revplus

# What the fixtures below compute once per test process.
_SHARED = {}


def batch(k):
  """Batch number k (int >= 0) of `batches`."""
  x = (np.arange(8).reshape((2, 4)) + k) % 9
  return (x, (2 * x + 1) % 9, np.ones_like(x, dtype=np.float32))


def batches():
  k = 0
  while True:
    yield batch(k)
    k += 1


def model():
  return tl.Serial(
    tl.Embedding(9, 4),
    tl.Dropout(rate=0.5, mode='train'),
    tl.Dup(),
    tl.ReversibleHalfResidual(tl.Dense(4)),
    tl.ReversibleSwap(),
    tl.ReversibleHalfResidual(tl.Dense(4), tl.Relu()),
    tl.ReversibleSwap(),
    tl.Concatenate(),
    tl.Dropout(rate=0.5, mode='train'),
    tl.Dense(9),
    tl.LogSoftmax(),
  )


def make_loop(
  output_dir,
  evals=False,
  eval_stream=None,
  model_fn=model,
  memory_efficient=True,
):
  trax_revplus.activate()
  # As in a fresh process; trax's count_and_skip makes the stream resumable
  # from the data counters a checkpoint restores.
  trax_inputs.data_counters = {}
  stream = trax_inputs.count_and_skip(batches(), 'test_checkpoints')
  task = training.TrainTask(
    stream,
    tl.CrossEntropyLoss(),
    # trax's memory-efficient Loop builds one optimizer per layer from the
    # class; its default Trainer takes an instance.
    optimizers.Adam if memory_efficient else optimizers.Adam(),
    n_steps_per_checkpoint=3,
  )
  # With evals, trax evaluates at its checkpoint steps (1, 3, 6), after it
  # saves, and each eval batch takes a key from the Loop's RNG (and a batch
  # from `eval_stream`, by default an uncounted `batches()`).
  eval_tasks = (
    [
      training.EvalTask(
        eval_stream or batches(), [tl.CrossEntropyLoss()], n_eval_batches=2
      )
    ]
    if evals
    else None
  )
  return training.Loop(
    model_fn(),
    [task],
    eval_tasks=eval_tasks,
    output_dir=str(output_dir),
    random_seed=0,
    use_memory_efficient_trainer=memory_efficient,
  )


def weights_of(loop):
  return [np.array(w) for w in fastmath.tree_flatten(loop.model.weights)]


def slots_of(loop):
  return [
    np.array(s) for s in fastmath.tree_flatten(loop._trainer_per_task[0].slots)
  ]  # pylint: disable=protected-access


def assert_equal(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x, y)


@pytest.fixture(scope='module')
def continuous(tmp_path_factory):
  """6 uninterrupted steps: (dir, weights/slots at step 3, at step 6, rng)."""
  if 'continuous' not in _SHARED:
    _SHARED['continuous'] = _continuous(tmp_path_factory)
  return _SHARED['continuous']


def fresh_process_state():
  """Stock trax and no gin bindings, as in a fresh process.

  The module-scoped fixtures run before the function-scoped
  `stock_trax_and_empty_gin` of their first test, so they must not inherit
  what the previous test module left: e.g. an in-process CLI test leaves
  its config's `Adam.*` or trainer settings bound, which `optimizers.Adam`
  and the trainer would read, and which test module precedes depends on how
  pytest-xdist hands out files on a busy machine.
  """
  gin.clear_config()
  trax_revplus.deactivate()


def _continuous(tmp_path_factory):
  fresh_process_state()
  path = tmp_path_factory.mktemp('continuous')
  loop = make_loop(path)
  loop.run(3)
  at3 = (weights_of(loop), slots_of(loop))
  loop.run(3)
  at6 = (weights_of(loop), slots_of(loop))
  rng = np.asarray(loop._rng)  # pylint: disable=protected-access
  trax_revplus.deactivate()
  return path, at3, at6, rng


@pytest.fixture(name='loader', scope='module')
def fixture_loader(tmp_path_factory):
  """A Loop (ours, fresh) into which sets of other dirs are loaded.

  Load with trax_revplus active: stock trax's `fastmath.tree_unflatten`
  fails on current JAX, and activation binds its fix.
  """
  if 'loader' not in _SHARED:
    fresh_process_state()
    _SHARED['loader'] = make_loop(tmp_path_factory.mktemp('loader'))
    trax_revplus.deactivate()
  return _SHARED['loader']


@pytest.fixture
def warnings_logged(monkeypatch):
  messages = []
  monkeypatch.setattr(
    absl_logging, 'warning', lambda msg, *args: messages.append(msg % args)
  )
  return messages


def damaged_copy(continuous, tmp_path, damage):
  path = tmp_path / 'run'
  shutil.copytree(continuous[0], path)
  damage(path)
  return path


def truncate(file_path):
  size = os.path.getsize(file_path)
  with open(file_path, 'r+b') as f:
    f.truncate(size // 2)


def flip_middle_byte(file_path):
  data_ = bytearray(file_path.read_bytes())
  data_[len(data_) // 2] ^= 0xFF
  file_path.write_bytes(bytes(data_))
