"""trax_revplus.ReversibleSerialTrainer against trax's default Trainer.

Ports the reversible tests of trax 1.4.1's optimizers/trainer_test.py (basic,
extended with a mid block, Terraformer with loss chunking, slots get/set) and
adds optimizers, n_async_layers, compiling ahead, accelerator freeing and
compile sharing.
Every reference is trax's own `optimizers.Trainer` on
`tl.Serial(blocks + [loss_layer])`, run on the same inputs and RNGs.
"""

import functools
import threading

import jax
import numpy as np
import pytest

from trax import fastmath
from trax import layers as tl
from trax import optimizers
from trax import shapes
from trax.models.research import terraformer

import trax_revplus
from trax_revplus import placement as placement_lib
from trax_revplus import trainer as rev_trainer


@pytest.fixture(autouse=True)
def _stock_names():
  trax_revplus.deactivate()
  yield
  trax_revplus.deactivate()


def _assert_all_close(t1, t2, tol=1e-5):
  f1, f2 = fastmath.tree_flatten(t1), fastmath.tree_flatten(t2)
  assert len(f1) == len(f2)
  assert f1, 'nothing to compare'
  for x1, x2 in zip(f1, f2):
    x1, x2 = np.asarray(x1), np.asarray(x2)
    assert x1.shape == x2.shape
    np.testing.assert_allclose(x1, x2, rtol=0, atol=tol)


def _batch():
  inputs = np.arange(8).reshape((2, 4))
  return (inputs, 2 * inputs, np.ones_like(inputs))


_RNGS = [fastmath.random.get_prng(7), fastmath.random.get_prng(8),
         fastmath.random.get_prng(9)]
_LRS = [None, 0.02, 0.03]


def _train(trainer, batch, n_steps):
  losses = []
  for rng, lr in list(zip(_RNGS, _LRS))[:n_steps]:
    loss, _ = trainer.one_step(batch, rng, learning_rate=lr)
    losses.append(loss)
  return losses


def _basic_model(rate=0.5):
  first = tl.Serial(tl.Embedding(9, 4), tl.Dropout(rate), tl.Dup())
  revs = [tl.ReversibleHalfResidual(tl.Dense(4), tl.Dropout(0.2)),
          tl.ReversibleSwap(),
          tl.ReversibleHalfResidual(tl.Dropout(0.5), tl.Dense(4)),
          tl.ReversibleSwap()]
  loss = tl.Serial(tl.Concatenate(), tl.Dense(19), tl.Dropout(0.3),
                   tl.LogSoftmax(), tl.CrossEntropyLoss())
  return first, revs, loss


def _reference(model, init, optimizer_fn, n_steps, batch):
  """Trains with trax's default Trainer; returns (weights, slots, state)."""
  init()
  optimizer = optimizer_fn()
  optimizer.tree_init(model.weights)
  trainer = optimizers.Trainer(model, optimizer, n_devices=1)
  _train(trainer, batch, n_steps)
  return model.weights, optimizer.slots, model.state


def _host_leaves_only(tree):
  for x in fastmath.tree_flatten(tree):
    assert isinstance(x, np.ndarray), type(x)


def test_slots_get_and_set():
  layers = [tl.Dense(4), tl.Dup()]
  rev_layers = [tl.ReversibleHalfResidual(tl.Dense(4)), tl.ReversibleSwap()]
  loss_layer = tl.Serial(tl.Concatenate(), tl.Dense(4), tl.LogSoftmax(),
                         tl.CrossEntropyLoss())
  tl.Serial(layers + rev_layers + [loss_layer]).init(
      (shapes.ShapeDtype((2, 4)), shapes.ShapeDtype((2,), np.int32),
       shapes.ShapeDtype((2,))))
  trainer = rev_trainer.ReversibleSerialTrainer(
      [(layers, rev_layers)], loss_layer, optimizers.Adam)
  slots = trainer.slots
  trainer.slots = slots
  assert fastmath.tree_flatten(trainer.slots)
  for x, y in zip(fastmath.tree_flatten(slots),
                  fastmath.tree_flatten(trainer.slots)):
    np.testing.assert_array_equal(x, y)
  # A changed value goes in and comes back out.
  changed = fastmath.nested_map(lambda s: s + 1.0, slots)
  trainer.slots = changed
  _assert_all_close(changed, trainer.slots, tol=0)
  # As trax's tl.on_cpu: jax arrays in host memory.
  for x in fastmath.tree_flatten(trainer.slots):
    assert isinstance(x, jax.Array)
    assert {d.platform for d in x.devices()} == {'cpu'}


@pytest.mark.parametrize('optimizer_fn,segment_max_layers',
                         [(optimizers.Adam, 1), (optimizers.Adafactor, 8)])
def test_same_as_default_basic(optimizer_fn, segment_max_layers):
  """One compiled call per layer (1), or the 4 reversible layers fused (8)."""
  batch = _batch()
  first, revs, loss = _basic_model()
  model = tl.Serial([first] + revs + [loss])
  rng_init = fastmath.random.get_prng(12)
  init = lambda: model.init(batch, rng=rng_init)
  ref_weights, ref_slots, _ = _reference(model, init, optimizer_fn, 2, batch)

  init()
  trainer = rev_trainer.ReversibleSerialTrainer(
      [(first.sublayers, revs)], loss, optimizer_fn,
      segment_max_layers=segment_max_layers)
  _train(trainer, batch, 2)
  _assert_all_close(ref_weights, model.weights)
  # Default Trainer keeps one flat slot tuple per weight; ours per layer.
  _assert_all_close(ref_slots, trainer.slots)
  _host_leaves_only(model.weights)
  assert not np.allclose(np.asarray(fastmath.tree_flatten(ref_weights)[0]),
                         np.asarray(fastmath.tree_flatten(
                             _initial_weights(model, init))[0]))


def _initial_weights(model, init):
  init()
  return model.weights


def _extended_model(mid_rate=0.3):
  first = tl.Serial(tl.Embedding(9, 4), tl.Dropout(0.5), tl.Dup())
  revs1 = [tl.ReversibleHalfResidual(tl.Dense(4), tl.Dropout(0.2)),
           tl.ReversibleSwap(),
           tl.ReversibleHalfResidual(tl.Dropout(0.5), tl.Dense(4)),
           tl.ReversibleSwap()]
  mid = tl.Serial(tl.Add(), tl.Dense(4), tl.Dup())
  revs2 = [tl.ReversibleHalfResidual(tl.Dense(4), tl.Dropout(mid_rate)),
           tl.ReversibleSwap()]
  loss = tl.Serial(tl.Concatenate(), tl.Dense(19), tl.Dropout(0.3),
                   tl.LogSoftmax(), tl.CrossEntropyLoss())
  return first, revs1, mid, revs2, loss


def test_same_as_default_extended():
  """Stock's test turns memoization off (its repr keys break it); ours not.

  Segments of at most 3 layers: block 1 splits into 2 + 2, block 2 is one
  segment of 2.
  """
  batch = _batch()
  first, revs1, mid, revs2, loss = _extended_model()
  model = tl.Serial([first] + revs1 + [mid] + revs2 + [loss])
  rng_init = fastmath.random.get_prng(12)
  init = lambda: model.init(batch, rng=rng_init)
  ref_weights, ref_slots, ref_state = _reference(
      model, init, optimizers.Adam, 3, batch)

  init()
  trainer = rev_trainer.ReversibleSerialTrainer(
      [(first.sublayers, revs1), (mid.sublayers, revs2)], loss,
      optimizers.Adam, memoize_jit=True, segment_max_layers=3)
  _train(trainer, batch, 3)
  _assert_all_close(ref_weights, model.weights)
  _assert_all_close(ref_slots, trainer.slots)
  _assert_all_close(ref_state, model.state)


def test_memoization_distinguishes_layers_repr_cannot():
  """Two reversible layers differing only in a dropout rate.

  `repr` shows the same text for both, so trax's repr-keyed memoization
  gives both the first one's compiled function.
  """
  batch = _batch()
  first = tl.Serial(tl.Embedding(9, 4), tl.Dup())
  revs = [tl.ReversibleHalfResidual(tl.Dense(4), tl.Dropout(0.1)),
          tl.ReversibleSwap(),
          tl.ReversibleHalfResidual(tl.Dense(4), tl.Dropout(0.6)),
          tl.ReversibleSwap()]
  assert repr(revs[0]) == repr(revs[2])
  loss = tl.Serial(tl.Concatenate(), tl.Dense(19), tl.LogSoftmax(),
                   tl.CrossEntropyLoss())
  model = tl.Serial([first] + revs + [loss])
  rng_init = fastmath.random.get_prng(12)
  init = lambda: model.init(batch, rng=rng_init)
  ref_weights, _, _ = _reference(model, init, optimizers.Adam, 3, batch)

  init()
  trainer = rev_trainer.ReversibleSerialTrainer(
      [(first.sublayers, revs)], loss, optimizers.Adam, memoize_jit=True)
  _train(trainer, batch, 3)
  _assert_all_close(ref_weights, model.weights)


def _count_compiles():
  """Returns a list that grows by one per XLA backend compilation: the name
  of the thread that compiled."""
  events = []

  def listener(name, *unused_args, **unused_kwargs):
    if name == '/jax/core/compile/backend_compile_duration':
      events.append(threading.current_thread().name)
  jax.monitoring.register_event_duration_secs_listener(listener)
  return events


def test_identical_layers_share_one_compilation():
  batch = _batch()
  n_pairs = 3

  def make(memoize, **kwargs):
    first = tl.Serial(tl.Embedding(9, 4), tl.Dup())
    revs = []
    for _ in range(n_pairs):
      revs += [tl.ReversibleHalfResidual(tl.Dense(4), tl.Dropout(0.1)),
               tl.ReversibleSwap()]
    loss = tl.Serial(tl.Concatenate(), tl.Dense(19), tl.LogSoftmax(),
                     tl.CrossEntropyLoss())
    model = tl.Serial([first] + revs + [loss])
    model.init(batch, rng=fastmath.random.get_prng(3))
    trainer = rev_trainer.ReversibleSerialTrainer(
        [(first.sublayers, revs)], loss, optimizers.Adam, memoize_jit=memoize,
        **kwargs)
    return trainer

  # Every segment over budget: one compiled call per layer.
  make = functools.partial(make, segment_max_bytes=0)
  compiles = _count_compiles()
  make(False).one_step(batch, _RNGS[0])  # compiles the step's helper ops
  shared = make(True)
  # std, half-residual, swap, loss: forward and backward functions.
  assert shared.n_compiled_functions == 7
  # Equal layers hold one stored fingerprint (memory that does not grow
  # with depth); layers 1, 3, 5 are the half-residuals, 2, 4, 6 the swaps.
  fingerprints = [shared._fingerprint_of(i) for i in range(1, 7)]  # pylint: disable=protected-access
  assert all(fp is fingerprints[i % 2] for i, fp in enumerate(fingerprints))
  assert fingerprints[0] != fingerprints[1]
  start = len(compiles)
  shared.one_step(batch, _RNGS[0])
  shared_compiles = len(compiles) - start
  separate = make(False)
  assert separate.n_compiled_functions == 4 * n_pairs + 3
  start = len(compiles)
  separate.one_step(batch, _RNGS[0])
  separate_compiles = len(compiles) - start
  # Every distinct layer function compiles once more than the shared run:
  # 2 * (n_pairs - 1) half-residuals and swaps, forward and backward.
  assert separate_compiles - shared_compiles == 4 * (n_pairs - 1)

  # Segments of (half-residual, swap): all three equal, one compilation.
  segmented = make(True, segment_max_layers=2, segment_max_bytes=2**30)
  assert segmented.n_compiled_functions == 5  # std, segment: fwd, bwd; loss
  start = len(compiles)
  segmented.one_step(batch, _RNGS[0])
  assert len(compiles) - start == shared_compiles - 2
  assert make(False, segment_max_layers=2,
              segment_max_bytes=2**30).n_compiled_functions == 2 + 2 * n_pairs + 1


def test_fingerprint_tells_functions_and_constants_apart():
  fp = rev_trainer._fingerprint  # pylint: disable=protected-access
  assert fp(tl.Dropout(0.1)) == fp(tl.Dropout(0.1))
  assert fp(tl.Dropout(0.1)) != fp(tl.Dropout(0.2))
  assert fp(tl.Fn('f', lambda x: x * 2)) != fp(tl.Fn('f', lambda x: x * 3))
  make = lambda k: tl.Fn('f', lambda x: x * k)
  assert fp(make(2)) == fp(make(2))
  assert fp(make(2)) != fp(make(3))
  assert fp(tl.Dense(4)) != fp(tl.Dense(5))
  assert fp(optimizers.Adafactor()) != fp(optimizers.Adafactor(factored=False))


def test_same_as_default_terraformer_loss_chunking():
  inputs = np.arange(8).reshape((2, 4)) + 1
  batch = (inputs, 2 * inputs, np.ones_like(inputs))
  int_sig = shapes.ShapeDtype((2, 4), dtype=np.int32)
  input_sig = (int_sig, int_sig, int_sig)
  model = terraformer.ConfigurableTerraformer(
      20, d_model=8, d_ff=32, n_heads=1, dropout=0.0, n_encoder_layers=2,
      n_decoder_layers=2, ff_sparsity=(4, 8, 0.0, 1.0), pos_type=None,
      reversible_encoder=True)
  loss = tl.Serial(tl.LogSoftmax(), tl.CrossEntropyLoss())
  blocks, loss_layer = trax_revplus.trainer.extract_reversible_blocks(
      [model, loss], loss_chunk_size=4)
  model_with_loss = tl.Serial(model, loss)
  rng_init = fastmath.random.get_prng(12)
  init = lambda: model_with_loss.init(input_sig, rng=rng_init)
  ref_weights, _, _ = _reference(
      model_with_loss, init, optimizers.Adafactor, 3, batch)

  init()
  trainer = rev_trainer.ReversibleSerialTrainer(
      blocks, loss_layer, optimizers.Adafactor)
  _train(trainer, batch, 3)
  _assert_all_close(ref_weights, model_with_loss.weights)
  _host_leaves_only(model_with_loss.weights)


def _train_basic(n_steps=2, **kwargs):
  batch = _batch()
  first, revs, loss = _basic_model()
  model = tl.Serial([first] + revs + [loss])
  model.init(batch, rng=fastmath.random.get_prng(12))
  trainer = rev_trainer.ReversibleSerialTrainer(
      [(first.sublayers, revs)], loss, optimizers.Adam, **kwargs)
  losses = _train(trainer, batch, n_steps)
  return model, trainer, losses


def test_n_async_layers_compile_ahead_release_give_identical_weights(
    monkeypatch):
  """Also: with compile_ahead, every function of the first step compiles on
  a helper thread before the step's first call, instead of, not in addition
  to, when it is called; whether the activations reach
  `_ACTIVATION_BOUND_BYTES` changes only the backward split. Where the
  argument types cannot be known ahead, the functions compile when called,
  with the same results."""
  compiles = _count_compiles()
  settings = [dict(n_async_layers=1, compile_ahead=False),  # + helper ops
              dict(n_async_layers=0, compile_ahead=False,
                   release_host_memory=False),
              dict(n_async_layers=3),
              dict(n_async_layers=3),
              dict(n_async_layers=3)]
  results, compiled_by = [], []
  for k, kwargs in enumerate(settings):
    if k == 3:
      monkeypatch.setattr(rev_trainer, '_ACTIVATION_BOUND_BYTES', 0)
    if k == 4:  # types unknown ahead: nothing is traced
      monkeypatch.setattr(placement_lib.Placement, 'abstract_params',
                          lambda self, tree: None)
    start = len(compiles)
    # Cleared caches would make each run compile the step's helper ops.
    results.append(_train_basic(clear_compilation_caches=False, **kwargs))
    compiled_by.append(compiles[start:])
  for model, trainer, _ in results:
    _host_leaves_only(model.weights)
    _host_leaves_only(model.state)
    _host_leaves_only([o.slots for o in trainer._opts])  # pylint: disable=protected-access
  for model, trainer, _ in results[1:]:
    _assert_all_close(results[0][0].weights, model.weights, tol=0)
    _assert_all_close(results[0][1].slots, trainer.slots, tol=0)
  on_helper = [[name.startswith('trax_revplus_compile') for name in names]
               for names in compiled_by]
  # Standard layer forward and backward, segment forward, loss, and the
  # segment's backward: two 2-layer calls below the activation bound (two
  # functions, their layers differ), one 4-layer call above it (settings 3
  # and 4).
  assert len(compiled_by[1]) == len(compiled_by[2]) == 6
  assert len(compiled_by[3]) == len(compiled_by[4]) == 5
  assert on_helper[2] == [True] * 6 and on_helper[3] == [True] * 5
  assert not any(on_helper[0] + on_helper[1] + on_helper[4])


def test_free_accelerators_identical_and_weights_readable():
  caller_held = jax.numpy.arange(1000.0)
  caller_view = np.asarray(jax.numpy.arange(1000.0) * 3)
  model0, trainer0, losses0 = _train_basic(free_accelerators_on_step=False)
  model1, trainer1, losses1 = _train_basic(
      free_accelerators_on_step=True, memory_log_every_n_steps=1)
  _assert_all_close(model0.weights, model1.weights, tol=0)
  _assert_all_close(trainer0.slots, trainer1.slots, tol=0)
  _assert_all_close(losses0, losses1, tol=0)
  for x in fastmath.tree_flatten(model1.weights):
    assert isinstance(x, np.ndarray) and np.all(np.isfinite(x))
  # The returned losses, and arrays the caller held, are still readable.
  assert all(np.isfinite(float(l)) for l in losses1)
  np.testing.assert_array_equal(np.asarray(caller_held), np.arange(1000.0))
  np.testing.assert_array_equal(caller_view, np.arange(1000.0) * 3)


def test_constructor_clears_compilation_caches_unless_told_not_to():
  compiled = []
  jax.monitoring.register_event_time_span_listener(
      lambda event, *unused, fun_name=None, **unused_kw: compiled.append(
          fun_name) if event.endswith('backend_compile_duration') else None)

  def doubled_by_this_test(x):
    return x * 2
  double = jax.jit(doubled_by_this_test)
  x = jax.numpy.ones(3)
  first, revs, loss = _basic_model()
  tl.Serial([first] + revs + [loss]).init(
      _batch(), rng=fastmath.random.get_prng(12))
  counts = []
  for clear in (True, False):
    double(x)
    rev_trainer.ReversibleSerialTrainer(
        [(first.sublayers, revs)], loss, optimizers.Adam,
        clear_compilation_caches=clear)
    double(x)
    counts.append(compiled.count('jit(doubled_by_this_test)'))
  assert counts == [2, 2]


def test_init_reversible_blocks_keeps_loaded_weights():
  """Stock re-initializes every layer; ours keeps layers holding weights."""
  batch = _batch()
  sig = shapes.signature(batch)
  rng = fastmath.random.get_prng(5)

  def blocks_and_loss():
    first, revs, loss = _basic_model()
    return [(first.sublayers, revs)], loss

  stock_blocks, stock_loss = blocks_and_loss()
  rev_trainer.stock_trainer.init_reversible_blocks(
      stock_blocks, stock_loss, sig, rng)
  ours_blocks, ours_loss = blocks_and_loss()
  rev_trainer.init_reversible_blocks(ours_blocks, ours_loss, sig, rng)
  # Fresh layers: exactly stock's initialization (same RNG use).
  _assert_all_close([l.weights for l in stock_blocks[0][1]] +
                    [stock_loss.weights],
                    [l.weights for l in ours_blocks[0][1]] + [ours_loss.weights],
                    tol=0)
  # A layer that already holds weights keeps them; the others still get
  # stock's values.
  loaded_blocks, loaded_loss = blocks_and_loss()
  loaded = loaded_blocks[0][1][0]
  loaded.init((shapes.ShapeDtype((2, 4, 4)),) * 2,
              rng=fastmath.random.get_prng(99))
  loaded.weights = fastmath.nested_map(lambda w: np.full_like(w, 0.25),
                                       loaded.weights)
  rev_trainer.init_reversible_blocks(loaded_blocks, loaded_loss, sig, rng)
  for w in fastmath.tree_flatten(loaded.weights):
    np.testing.assert_array_equal(w, np.full_like(w, 0.25))
  _assert_all_close(stock_loss.weights, loaded_loss.weights, tol=0)
  _assert_all_close(stock_blocks[0][1][2].weights,
                    loaded_blocks[0][1][2].weights, tol=0)
  _host_leaves_only(loaded_loss.weights)


def test_bad_arguments_raise_clear_errors():
  first, revs, loss = _basic_model()
  with pytest.raises(ValueError, match='n_async_layers'):
    rev_trainer.ReversibleSerialTrainer(
        [(first.sublayers, revs)], loss, optimizers.Adam, n_async_layers=-1)
  with pytest.raises(ValueError, match='n_devices'):
    rev_trainer.ReversibleSerialTrainer(
        [(first.sublayers, revs)], loss, optimizers.Adam, n_devices=64)
  with pytest.raises(ValueError, match='compile_ahead'):
    rev_trainer.ReversibleSerialTrainer(
        [(first.sublayers, revs)], loss, optimizers.Adam, compile_ahead='yes')
  with pytest.raises(ValueError, match='backward_segment_max_layers'):
    rev_trainer.ReversibleSerialTrainer(
        [(first.sublayers, revs)], loss, optimizers.Adam,
        backward_segment_max_layers=0)
  with pytest.raises(ValueError, match=r'host_mmap_threshold: .*\[0, '):
    rev_trainer.ReversibleSerialTrainer(
        [(first.sublayers, revs)], loss, optimizers.Adam,
        host_mmap_threshold=64 * 2**20)


def test_host_mmap_threshold_goes_to_glibc_unless_none(monkeypatch):
  thresholds = []
  monkeypatch.setattr(rev_trainer.host_memory, 'set_mmap_threshold',
                      thresholds.append)
  batch = _batch()
  first, revs, loss = _basic_model()
  tl.Serial([first] + revs + [loss]).init(batch)
  for kwargs in (dict(host_mmap_threshold=2**20),
                 dict(host_mmap_threshold=None),
                 dict(host_mmap_threshold=0),
                 {}):
    rev_trainer.ReversibleSerialTrainer(
        [(first.sublayers, revs)], loss, optimizers.Adam,
        clear_compilation_caches=False, **kwargs)
  # The default, None, leaves glibc's own threshold.
  assert thresholds == [2**20, 0]


@functools.lru_cache(maxsize=1)
def _basic_adam_reference_3_steps():
  """trax's default Trainer on `_basic_model`, Adam, 3 steps (host copies)."""
  batch = _batch()
  first, revs, loss = _basic_model()
  model = tl.Serial([first] + revs + [loss])
  init = lambda: model.init(batch, rng=fastmath.random.get_prng(12))
  return jax.tree_util.tree_map(
      np.asarray, _reference(model, init, optimizers.Adam, 3, batch))


@pytest.mark.parametrize('backward_segment_max_layers,activation_bound_bytes,'
                         'backward_lengths',
                         [(1, None, [1, 1, 1, 1]),
                          ('auto', None, [2, 2]),  # kilobyte activations
                          ('auto', 0, [4])])  # as if activation-bound
def test_backward_segments_split_forward_ones(
    backward_segment_max_layers, activation_bound_bytes, backward_lengths,
    monkeypatch):
  """One forward segment of the 4 reversible layers, run backward as one
  call or as shorter segments: the same updates as trax's default Trainer,
  and the commits of each call wait for `n_async_layers` layers."""
  if activation_bound_bytes is not None:
    monkeypatch.setattr(rev_trainer, '_ACTIVATION_BOUND_BYTES',
                        activation_bound_bytes)
  batch = _batch()
  ref_weights, ref_slots, ref_state = _basic_adam_reference_3_steps()
  first, revs, loss = _basic_model()
  model = tl.Serial([first] + revs + [loss])
  model.init(batch, rng=fastmath.random.get_prng(12))
  trainer = rev_trainer.ReversibleSerialTrainer(
      [(first.sublayers, revs)], loss, optimizers.Adam, segment_max_layers=4,
      backward_segment_max_layers=backward_segment_max_layers,
      n_async_layers=2)
  events = []  # ('dispatch' | 'commit', layer indices of a call)
  start_collect = trainer._start_collect  # pylint: disable=protected-access
  collect = trainer._collect  # pylint: disable=protected-access

  def logged_start_collect(pending, indices, *args):
    events.append(('dispatch', list(indices)))
    return start_collect(pending, indices, *args)

  def logged_collect(entry):
    events.append(('commit', list(entry[0])))
    return collect(entry)
  monkeypatch.setattr(trainer, '_start_collect', logged_start_collect)
  monkeypatch.setattr(trainer, '_collect', logged_collect)
  _train(trainer, batch, 3)
  segment = trainer._units[1]  # pylint: disable=protected-access
  assert segment.layers == [1, 2, 3, 4]
  assert [len(u.layers) for u in trainer._backward_units(segment)] == (  # pylint: disable=protected-access
      backward_lengths)
  _assert_all_close(ref_weights, model.weights)
  _assert_all_close(ref_slots, trainer.slots)
  _assert_all_close(ref_state, model.state)
  # Backward calls of one step: loss, reversible calls last to first,
  # standard layer; each committed as soon as calls of >= 2 layers were
  # dispatched after it, the rest at the end of the step.
  calls = [[5]] + [sorted(c, reverse=True) for c in reversed(
      [list(range(k, k + n)) for k, n in zip(
          np.cumsum([1] + backward_lengths[:-1]), backward_lengths)])] + [[0]]
  step_events = events[:2 * len(calls)]
  assert [c for kind, c in step_events if kind == 'dispatch'] == calls
  assert [c for kind, c in step_events if kind == 'commit'] == calls
  last_dispatch = max(k for k, (kind, _) in enumerate(step_events)
                      if kind == 'dispatch')
  for k, (kind, call) in enumerate(step_events[:last_dispatch]):
    if kind != 'commit':
      continue
    start = step_events.index(('dispatch', call))
    after = [len(c) for kind, c in step_events[start + 1:k]
             if kind == 'dispatch']
    assert sum(after) >= 2 and sum(after) - after[-1] < 2, (call, after)
