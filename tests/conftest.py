"""Fixtures and tiny models the test modules share.

The models are plain functions (import them with `from conftest import
...`; `tests/placement/multidevice_worker.py` does too, in its own process).

XLA compiles the suite's programs (hundreds of small ones, here and in the
processes tests start, which inherit the environment) at backend
optimization level 0: the same HLO passes, hence the same buffer
assignment and `memory_analysis()` figures, with LLVM's optimizations
off, which cuts the suite's CPU time by about 40%. Results agree with the
default level to float32 rounding (about 1e-7), and every comparison
compiles both sides alike. The smoke scripts `.ci/run` runs after the suite
and the benchmarks compile at the default level. Set XLA_FLAGS with a
`--xla_backend_optimization_level` of your own to test at another level.
"""

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile

from trax_revplus import trax_import

trax_import.import_trax()  # Before any trax module: see trax_import.

# pylint: disable=g-import-not-at-top,g-bad-import-order
import gin
import jax
import numpy as np
import pytest
import trax
from trax import fastmath
from trax import layers as tl
from trax import optimizers
from trax import shapes

import trax_revplus
from trax_revplus import trainer as rev_trainer

import one_chip_host as one_chip_host_lib


_OPT_LEVEL = '--xla_backend_optimization_level'
_CACHE_DIR = pytest.StashKey[str]()


def pytest_configure(config):
  """Compiles at optimization level 0 (see the module docstring), through a
  compilation cache of this test process.

  A pytest hook, so that scripts importing this module's models
  (`tests/placement/multidevice_worker.py`) compile at the default level.
  It runs before collection, hence before JAX starts its backend, which
  reads XLA_FLAGS once, and before JAX's first compilation, which decides
  whether the cache is used.
  """
  if _OPT_LEVEL not in os.environ.get('XLA_FLAGS', ''):
    os.environ['XLA_FLAGS'] = (
      os.environ.get('XLA_FLAGS', '') + f' {_OPT_LEVEL}=0'
    ).strip()
  # The suite's tests build the same tiny models again and again, each a new
  # Python function whose `jit` cache starts empty, so XLA compiles the same
  # HLO many times. JAX's persistent compilation cache, keyed by the HLO and
  # the compile options, hands back the executable compiled first. It is
  # this process's own, fresh for each run and removed after it, and set
  # through `jax.config` rather than the environment: processes the tests
  # start run concurrently (the multi-process tests) and would share it, and
  # a cache file read while another process writes it is a warning on the
  # stderr those tests read.
  cache_dir = tempfile.mkdtemp(prefix='trax_revplus_tests_xla_cache_')
  config.stash[_CACHE_DIR] = cache_dir
  # `trax-revplus train` and `estimate` keep a compilation cache of their
  # own by default, in the user's cache directory: the runs the tests start
  # (in this process or others) share one under the process's, never the
  # user's, and each run's JAX settings are restored after it.
  os.environ['XDG_CACHE_HOME'] = os.path.join(cache_dir, 'user_cache')
  jax.config.update('jax_compilation_cache_dir', cache_dir)
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)
  jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)


def pytest_unconfigure(config):
  """Removes the process's compilation cache (see `pytest_configure`)."""
  cache_dir = config.stash.get(_CACHE_DIR, None)
  if cache_dir:
    shutil.rmtree(cache_dir, ignore_errors=True)


@pytest.fixture
def one_chip_host(tmp_path):
  """The environment of a simulated one-chip host (`one_chip_host.py`):
  processes started with it, and theirs, open JAX's backend one at a time,
  as on a TPU host; hold it with `one_chip_host_lib.holding_the_chip`."""
  return one_chip_host_lib.env(tmp_path / 'one_chip.lock')


@pytest.fixture
def stock_trax():
  """Each test starts and ends with stock trax bound."""
  trax_revplus.deactivate()
  yield
  trax_revplus.deactivate()


@pytest.fixture(autouse=True)
def _trainer_tests_start_from_empty_gin(request):
  """Every test under tests/trainer, tests/tools and tests/data starts and
  ends with no gin config.

  They build trainers and trax's optimizers, which gin can configure: a
  binding an earlier test in the same worker left (the main job's config
  binds `Adam.b2` and `Adam.eps`; a CLI test binds a device memory budget)
  would reach ours and not a cached reference, or a trainer the test
  builds with its own settings, or `local_text_inputs` (the main job's
  config binds its sizes); which tests share a worker depends on timing.
  """
  if os.path.basename(os.path.dirname(str(request.node.fspath))) not in (
    'trainer',
    'tools',
    'data',
  ):
    yield
    return
  gin.clear_config()
  yield
  gin.clear_config()


@pytest.fixture
def stock_trax_and_empty_gin(stock_trax):  # pylint: disable=redefined-outer-name,unused-argument
  """Each test starts and ends with stock trax bound and no gin config."""
  gin.clear_config()
  yield
  gin.clear_config()


def reversible_lm(dropout_rate=None):
  """A tiny reversible language model over 9 tokens, as trax builds one.

  Embedding (width 4), two reversible half-residual blocks (a Dense; a
  Dense and a Relu) with swaps, then Concatenate, Dense(9), LogSoftmax.

  Args:
    dropout_rate: float or None; with a rate, `tl.Dropout(mode='train')`
      after the embedding and after the Concatenate.

  Returns:
    `tl.Serial`, uninitialized; inputs int (B, L), outputs (B, L, 9).
  """
  dropout = (
    []
    if dropout_rate is None
    else [tl.Dropout(rate=dropout_rate, mode='train')]
  )
  return tl.Serial(
    [tl.Embedding(9, 4)]
    + dropout
    + [
      tl.Dup(),
      tl.ReversibleHalfResidual(tl.Dense(4)),
      tl.ReversibleSwap(),
      tl.ReversibleHalfResidual(tl.Dense(4), tl.Relu()),
      tl.ReversibleSwap(),
      tl.Concatenate(),
    ]
    + dropout
    + [tl.Dense(9), tl.LogSoftmax()]
  )


def lsh_reformer_lm(mode='train', dropout=0.0, n_layers=1, d_model=16, d_ff=32):
  """A tiny trax ReformerLM with LSH attention: vocab 16, d_model 16 and
  d_ff 32 unless given, 2 heads, sequences of at most 32, uninitialized.
  LSH keeps per (row, head) state (its hash RNGs) and draws its rotations
  from the layer's RNG."""
  from trax import models  # pylint: disable=g-import-not-at-top

  return models.ReformerLM(
    16,
    d_model=d_model,
    d_ff=d_ff,
    d_attention_key=8,
    d_attention_value=8,
    n_layers=n_layers,
    n_heads=2,
    max_len=32,
    dropout=dropout,
    attention_type=functools.partial(
      tl.LSHSelfAttention, chunk_len=4, n_buckets=4, n_hashes=2
    ),
    mode=mode,
  )


def self_attention_lm(dropout=0.0, n_parallel_heads=None):
  """trax's ReformerLM with its efficient `SelfAttention` (4 heads,
  `n_parallel_heads` of its (example, head) pairs at once; None: all), its
  `Dropout` and `PositionalEncoding` at rate `dropout`."""
  return trax.models.ReformerLM(
    16,
    d_model=16,
    d_ff=32,
    d_attention_key=8,
    d_attention_value=8,
    n_layers=2,
    n_heads=4,
    max_len=64,
    dropout=dropout,
    attention_type=functools.partial(
      tl.SelfAttention, n_parallel_heads=n_parallel_heads
    ),
    mode='train',
  )


def token_batch(rows=4, length=32):
  """(inputs, targets, weights) of a language model: int32 tokens 0..15 of
  shape (rows, length), the same array as inputs and targets, float32 ones
  as weights."""
  x = np.arange(rows * length, dtype=np.int32).reshape(rows, length) % 16
  return x, x, np.ones_like(x, dtype=np.float32)


def reversible_lm_blocks():
  """`reversible_lm()` with a cross-entropy loss, as trainer blocks.

  Returns:
    (standard layers as one `tl.Serial`, list of reversible layers, loss
    layer), uninitialized: blocks `[(first.sublayers, reversible)]`.
  """
  first = tl.Serial(tl.Embedding(9, 4), tl.Dup())
  reversible = [
    tl.ReversibleHalfResidual(tl.Dense(4)),
    tl.ReversibleSwap(),
    tl.ReversibleHalfResidual(tl.Dense(4), tl.Relu()),
    tl.ReversibleSwap(),
  ]
  loss = tl.Serial(
    tl.Concatenate(), tl.Dense(9), tl.LogSoftmax(), tl.CrossEntropyLoss()
  )
  return first, reversible, loss


def dense_batch(x_value=1.0, batch_size=2):
  """(x float32 (B, 3), y float32 (B, 4), weights of ones), for `L2Loss`.

  x is `x_value` except its first column 0, 1, ...; all `x_value` when it
  is not finite.
  """
  x = np.full((batch_size, 3), x_value, dtype=np.float32)
  x[:, 0] = np.arange(batch_size)
  if not np.isfinite(x_value):
    x[:] = x_value
  y = np.ones((batch_size, 4), dtype=np.float32)
  return x, y, np.ones_like(y)


def initialized(blocks, loss_layer, batch):
  """Initializes blocks and loss with ours for `batch`'s signature."""
  rev_trainer.init_reversible_blocks(
    blocks, loss_layer, shapes.signature(batch), fastmath.random.get_prng(0)
  )
  return blocks, loss_layer


def split_blocks():
  """Two blocks of Dense layers, the first with two reversible layers."""
  # A Dup so that the reversible layers get two inputs.
  return [
    (
      [tl.Dense(4), tl.Dup()],
      [tl.ReversibleHalfResidual(tl.Dense(4)), tl.ReversibleSwap()],
    ),
    ([tl.Concatenate(), tl.Dense(4)], []),
  ]


def split_blocks_trainer(**kwargs):
  """Ours on `split_blocks()` and `L2Loss`, initialized for `dense_batch`;
  keyword arguments go to the trainer (optimizer_fn: Adam by default)."""
  blocks, loss = initialized(split_blocks(), tl.L2Loss(), dense_batch())
  return rev_trainer.ReversibleSerialTrainer(
    blocks, loss, kwargs.pop('optimizer_fn', optimizers.Adam), **kwargs
  )


def replan(trainer, batch, **changes):
  """Makes `trainer` run, on `batch`'s shapes, its plan with `changes`
  (`StepPlan` fields) in place of the planner's, unaccounted (the multi-
  device and multi-process workers' way to a plan no setting names)."""
  # pylint: disable=g-import-not-at-top,protected-access
  import dataclasses
  from trax_revplus.trainer._search import planner
  from trax_revplus.trainer._step import units

  p = trainer.planner
  plan = dataclasses.replace(p.step_for(batch).plan, **changes)
  p._planned[planner.batch_key(p._placement.abstract_batch(batch))] = (
    units.PlannedStep(plan, units.Units(plan, p._factory), None)
  )


def host_weights_and_state(trainer):
  """Copies of every layer's (weights, state)."""
  return [
    jax.tree_util.tree_map(np.array, (l.weights, l.state))
    for l in trainer.all_layers
  ]


def assert_same(before, after):
  """Asserts two pytrees hold equal arrays, leaf by leaf."""
  flat_b = jax.tree_util.tree_leaves(before)
  flat_a = jax.tree_util.tree_leaves(after)
  assert len(flat_b) == len(flat_a)
  for b, a in zip(flat_b, flat_a):
    np.testing.assert_array_equal(np.asarray(a), b)


def start_seconds(idle_seconds=240.0):
  """Seconds a few Python (or JAX) processes may take to start here.

  Tests that check that processes end (never hang) need a bound; a busy
  machine is slow, not broken, so the bound grows with the load average
  per core at the time of the call.

  Args:
    idle_seconds: float, the bound on a machine with at most one runnable
      process per core.

  Returns:
    float seconds, at least `idle_seconds`.
  """
  load_per_core = os.getloadavg()[0] / (os.cpu_count() or 1)
  return idle_seconds * max(1.0, load_per_core)


MULTIDEVICE_WORKER = os.path.join(
  os.path.dirname(__file__), 'placement', 'multidevice_worker.py'
)


def run_multidevice_worker(
  n_devices, function='main', script=MULTIDEVICE_WORKER
):
  """`script`'s (tests/placement/multidevice_worker.py by default)
  `function` in a fresh process on `n_devices` forced CPU devices
  (XLA_FLAGS set before JAX starts): `main` as the script runs it, any
  other with `n_devices` as its argument; returns the JSON line it printed
  last.

  Raises:
    AssertionError: the process failed (its stderr's end as the message).
  """
  env = dict(os.environ)
  env['XLA_FLAGS'] = (
    env.get('XLA_FLAGS', '')
    + f' --xla_force_host_platform_device_count={n_devices}'
  )
  env['JAX_PLATFORMS'] = 'cpu'
  # This test process's compilation cache (see above): the worker builds
  # the same models again and again, and compiles while this process waits
  # for it, so no two processes use the cache at once.
  env.update(
    JAX_COMPILATION_CACHE_DIR=jax.config.jax_compilation_cache_dir,
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0',
    JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES='0',
  )
  if function == 'main':
    args = [script, str(n_devices)]
  else:
    args = [
      '-c',
      f'import runpy; runpy.run_path({script!r})[{function!r}]({n_devices})',
    ]
  proc = subprocess.run(
    [sys.executable, *args],
    env=env,
    capture_output=True,
    text=True,
    check=False,
  )
  assert proc.returncode == 0, proc.stderr[-5000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])
