"""Fingerprints, compiled-function sharing, compiling ahead, cache clearing.

Results are compared with trax's default Trainer (memoization) or with the
trainer's own run without the feature (compiling ahead changes when, not
what, is compiled); compilations are counted from JAX's own monitoring
events.
"""

import functools

import jax
import pytest

from trax import fastmath
from trax import layers as tl
from trax import optimizers

import trainer_cases as cases
from trax_revplus import placement as placement_lib
from trax_revplus import trainer as rev_trainer
from trax_revplus.trainer._plan import segment_lengths
from trax_revplus.trainer._step import fingerprints as fingerprints_lib

pytestmark = pytest.mark.usefixtures('stock_trax')


def test_memoization_distinguishes_layers_repr_cannot():
  """Two reversible layers differing only in a dropout rate.

  `repr` shows the same text for both, so trax's repr-keyed memoization
  gives both the first one's compiled function.
  """
  batch = cases.batch()
  first = tl.Serial(tl.Embedding(9, 4), tl.Dup())
  revs = [
    tl.ReversibleHalfResidual(tl.Dense(4), tl.Dropout(0.1)),
    tl.ReversibleSwap(),
    tl.ReversibleHalfResidual(tl.Dense(4), tl.Dropout(0.6)),
    tl.ReversibleSwap(),
  ]
  assert repr(revs[0]) == repr(revs[2])
  loss = tl.Serial(
    tl.Concatenate(), tl.Dense(19), tl.LogSoftmax(), tl.CrossEntropyLoss()
  )
  model = tl.Serial([first] + revs + [loss])
  rng_init = fastmath.random.get_prng(12)
  init = lambda: model.init(batch, rng=rng_init)
  ref_weights, _, _ = cases.reference(model, init, optimizers.Adam, 3, batch)

  init()
  trainer = rev_trainer.ReversibleSerialTrainer(
    [(first.sublayers, revs)], loss, optimizers.Adam, memoize_jit=True
  )
  cases.train(trainer, batch, 3)
  cases.assert_all_close(ref_weights, model.weights)


@pytest.mark.slow
def test_identical_layers_share_one_compilation():
  batch = cases.batch()
  n_pairs = 3

  def make(memoize, **kwargs):
    first = tl.Serial(tl.Embedding(9, 4), tl.Dup())
    revs = []
    for _ in range(n_pairs):
      revs += [
        tl.ReversibleHalfResidual(tl.Dense(4), tl.Dropout(0.1)),
        tl.ReversibleSwap(),
      ]
    loss = tl.Serial(
      tl.Concatenate(), tl.Dense(19), tl.LogSoftmax(), tl.CrossEntropyLoss()
    )
    model = tl.Serial([first] + revs + [loss])
    model.init(batch, rng=fastmath.random.get_prng(3))
    trainer = rev_trainer.ReversibleSerialTrainer(
      [(first.sublayers, revs)],
      loss,
      optimizers.Adam,
      memoize_jit=memoize,
      **kwargs,
    )
    return trainer

  # Every segment over budget: one compiled call per layer (the settings as
  # given, unplanned).
  make = functools.partial(
    make, segment_max_bytes=0, device_memory_budget_bytes=None
  )
  compiles = cases.count_compiles()
  make(False).one_step(batch, cases.RNGS[0])  # compiles the step's helper ops
  shared = make(True)
  # Planning the first step compiles its functions ahead.
  start = len(compiles)
  shared.planned(batch)
  # std, half-residual: forward and backward functions; loss. Swaps only
  # permute the stack and run without a compiled call.
  assert shared.n_compiled_functions == 5
  # Equal layers hold one stored fingerprint (memory that does not grow
  # with depth); layers 1, 3, 5 are the half-residuals, 2, 4, 6 the swaps.
  fingerprints = [shared._compiler.fingerprint_of(i) for i in range(1, 7)]  # pylint: disable=protected-access
  assert all(fp is fingerprints[i % 2] for i, fp in enumerate(fingerprints))
  assert fingerprints[0] != fingerprints[1]
  shared.one_step(batch, cases.RNGS[0])
  shared_compiles = len(compiles) - start
  separate = make(False)
  start = len(compiles)
  separate.planned(batch)
  assert separate.n_compiled_functions == 2 * n_pairs + 3
  separate.one_step(batch, cases.RNGS[0])
  separate_compiles = len(compiles) - start
  # Every distinct layer function compiles once more than the shared run:
  # n_pairs - 1 half-residuals, forward and backward.
  assert separate_compiles - shared_compiles == 2 * (n_pairs - 1)

  # Segments of (half-residual, swap): all three equal, one compilation.
  segmented = make(True, segment_max_layers=2, segment_max_bytes=2**30)
  start = len(compiles)
  segmented.planned(batch)
  assert segmented.n_compiled_functions == 5  # std, segment: fwd, bwd; loss
  segmented.one_step(batch, cases.RNGS[0])
  # The segment's two functions take the place of the half-residual's.
  assert len(compiles) - start == shared_compiles
  unshared = make(False, segment_max_layers=2, segment_max_bytes=2**30)
  unshared.planned(batch)
  assert unshared.n_compiled_functions == 2 + 2 * n_pairs + 1


def test_fingerprint_tells_functions_and_constants_apart():
  fp = fingerprints_lib.of
  assert fp(tl.Dropout(0.1)) == fp(tl.Dropout(0.1))
  assert fp(tl.Dropout(0.1)) != fp(tl.Dropout(0.2))
  assert fp(tl.Fn('f', lambda x: x * 2)) != fp(tl.Fn('f', lambda x: x * 3))
  make = lambda k: tl.Fn('f', lambda x: x * k)
  assert fp(make(2)) == fp(make(2))
  assert fp(make(2)) != fp(make(3))
  assert fp(tl.Dense(4)) != fp(tl.Dense(5))
  assert fp(optimizers.Adafactor()) != fp(optimizers.Adafactor(factored=False))


def test_n_async_layers_compile_ahead_release_give_identical_weights(
  monkeypatch,
):
  """Also: with compile_ahead, every function of the first step compiles on
  a helper thread before the step's first call, instead of, not in addition
  to, when it is called; whether the activations reach
  `segment_lengths.ACTIVATION_BOUND_BYTES` changes only the backward split.
  Where the argument types cannot be known ahead, the functions compile
  when called, with the same results."""
  compiles = cases.count_compiles()
  settings = [
    dict(n_async_layers=1, compile_ahead=False),  # + helper ops
    dict(n_async_layers=0, compile_ahead=False, release_host_memory=False),
    dict(n_async_layers=3),
    dict(n_async_layers=3),
    dict(n_async_layers=3),
  ]
  results, compiled_by = [], []
  for k, kwargs in enumerate(settings):
    if k == 3:
      monkeypatch.setattr(segment_lengths, 'ACTIVATION_BOUND_BYTES', 0)
    if k == 4:  # types unknown ahead: nothing is traced
      monkeypatch.setattr(
        placement_lib.Placement, 'abstract_params', lambda self, tree: None
      )
    start = len(compiles)
    # Cleared caches would make each run compile the step's helper ops; the
    # settings as given (unplanned), whose calls the counts below name.
    results.append(
      cases.train_basic(
        clear_compilation_caches=False,
        device_memory_budget_bytes=None,
        **kwargs,
      )
    )
    compiled_by.append(compiles[start:])
  for model, trainer, _ in results:
    cases.host_leaves_only(model.weights)
    cases.host_leaves_only(model.state)
    cases.host_leaves_only([o.slots for o in trainer._store.optimizers])  # pylint: disable=protected-access
  for model, trainer, _ in results[1:]:
    cases.assert_all_close(results[0][0].weights, model.weights, tol=0)
    cases.assert_all_close(results[0][1].slots, trainer.slots, tol=0)
  on_helper = [
    [name.startswith('trax_revplus_compile') for name in names]
    for names in compiled_by
  ]
  # Standard layer forward and backward, segment forward, loss, and the
  # segment's backward: two 2-layer calls below the activation bound (two
  # functions, their layers differ), one 4-layer call above it (settings 3
  # and 4).
  assert len(compiled_by[1]) == len(compiled_by[2]) == 6
  assert len(compiled_by[3]) == len(compiled_by[4]) == 5
  assert on_helper[2] == [True] * 6 and on_helper[3] == [True] * 5
  assert not any(on_helper[0] + on_helper[1] + on_helper[4])


def test_constructor_clears_compilation_caches_unless_told_not_to():
  compiled = []
  jax.monitoring.register_event_time_span_listener(
    lambda event, *unused, fun_name=None, **unused_kw: (
      compiled.append(fun_name)
      if event.endswith('backend_compile_duration')
      else None
    )
  )

  def doubled_by_this_test(x):
    return x * 2

  double = jax.jit(doubled_by_this_test)
  x = jax.numpy.ones(3)
  first, revs, loss = cases.basic_model()
  tl.Serial([first] + revs + [loss]).init(
    cases.batch(), rng=fastmath.random.get_prng(12)
  )
  counts = []
  for clear in (True, False):
    double(x)
    rev_trainer.ReversibleSerialTrainer(
      [(first.sublayers, revs)],
      loss,
      optimizers.Adam,
      clear_compilation_caches=clear,
    )
    double(x)
    counts.append(compiled.count('jit(doubled_by_this_test)'))
  assert counts == [2, 2]
