"""trax 1.4.1's own test files, loaded from the installed package and run.

`load(name)` imports e.g. `trax.optimizers.trainer_test` as trax ships it,
with the one import fix current JAX needs applied while it loads: these
files do `from jax.config import config`, and JAX has no `jax.config` module
any more (the object `jax.config`, which they use, remains). Nothing under
site-packages is edited, and the stand-in module is removed again once the
file is loaded.

`run(test_class, method, implementation)` runs one trax test method with
stock trax ('stock') or with `trax_revplus.activate()` applied first
('revplus'), in the state a fresh process would give it, and returns how it
ended.

The tables below say what is known of each test on this setup (one CPU
device, current JAX): which fail on stock trax and why, which do nothing on
one device, and which take minutes. `docs/compatibility.md` lists them for
users; the test modules of this directory check them.
"""

import contextlib
import importlib
import os
import sys
import types
import unittest

from absl import flags
import jax

import trax_revplus

IMPLEMENTATIONS = ('stock', 'revplus')

# Set to 1 to run the whole matrix: every test with both implementations,
# the slow one included (68 runs, about 6 minutes of CPU time).
FULL_ENV = 'TRAX_REVPLUS_FULL_TRAX_TESTS'

# Tests that fail on this setup: (test, implementation) -> (text the
# failure shows, why). Four tests restore a checkpoint with optimizer slots,
# which stock trax cannot: its `fastmath.tree_unflatten` tests `leaf in
# [None, ()]`, which a `jax.Array` cannot answer (trax_revplus binds
# `compat.tree_unflatten`, which can). One of them then fails with
# trax_revplus too, in its own last line, on current numpy.
_SLOTS_RESTORE = (
  "unsupported operand type(s) for ==: 'ArrayImpl' and 'tuple'",
  'fastmath.tree_unflatten compares each restored optimizer '
  'slot with `in [None, ()]`, which a jax.Array cannot '
  'answer (TypeError)',
)
EXPECTED_FAILURES = {
  ('TrainingTest.test_restores_from_smaller_model', 'stock'): _SLOTS_RESTORE,
  (
    'TrainingTest.test_restores_memory_efficient_from_standard',
    'stock',
  ): _SLOTS_RESTORE,
  ('TrainingTest.test_restores_step_bfloat16', 'stock'): _SLOTS_RESTORE,
  ('TrainingTest.test_train_save_restore_dense', 'stock'): _SLOTS_RESTORE,
  ('TrainingTest.test_train_save_restore_dense', 'revplus'): (
    'np.testing.assert_array_equal(slots1, slots2)',
    'the checkpoint restore passes; the last line then compares the two '
    "Loops' optimizer slots, a tuple of arrays of shapes (1, 1) and "
    '(1,) each, with np.testing.assert_array_equal, which numpy >= 2 '
    'refuses for such ragged nests (ValueError: setting an array '
    'element with a sequence) whatever their values',
  ),
}


# Tests that return before doing anything on a single device (their own
# guards), with both implementations: test -> why.
ONE_DEVICE_NO_OPS = {
  'TrainerTest.test_run_sharded_terraformer': (
    'returns when fastmath.local_device_count() == 1'
  ),
  'TrainerTest.test_run_reversible_large_weights': (
    'returns on one device (needs > 18 GB of memory: ram_limited)'
  ),
  'TrainerTest.test_run_reversible_weights_trainsfer_xprof': (
    'run_this_test = False: a manual TPU profiling run'
  ),
  'TrainingTest.test_train_save_restore_sharded': (
    'returns when fastmath.local_device_count() < 2'
  ),
  'TrainingTest.test_train_memory_efficient': (
    'returns on one device (needs > 16 GB of memory: ram_limited)'
  ),
}

# Tests left out of the default suite: test -> why. Run with FULL_ENV=1.
SLOW = {
  'TrainerTest.test_run_reversible_same_as_default_terraformer': (
    'takes about 3.5 minutes per implementation on 2 CPU cores, mostly '
    'compiling; tests/trainer/test_trainer.py::test_same_as_default_'
    'terraformer_loss_chunking makes the same comparison on the same '
    f'model, with the loss chunked. Run it with {FULL_ENV}=1'
  ),
}


def full_matrix():
  """Whether FULL_ENV asks for every test with both implementations."""
  return os.environ.get(FULL_ENV, '') not in ('', '0')


@contextlib.contextmanager
def _jax_config_module():
  """`from jax.config import config` finds `jax.config` while loading."""
  name = 'jax.config'
  if name in sys.modules:
    yield
    return
  stand_in = types.ModuleType(name)
  stand_in.config = jax.config
  sys.modules[name] = stand_in
  try:
    yield
  finally:
    if sys.modules.get(name) is stand_in:
      del sys.modules[name]


def load(name):
  """Imports trax's test module `name` (e.g. 'trax.layers.reversible_test').

  Also marks absl's flags as parsed, with their defaults, as trax's
  `test_utils.ensure_flag` would (it parses `sys.argv`, which under pytest
  holds pytest's own flags); absltest's `create_tempdir` reads
  `--test_tmpdir` from them.
  """
  with _jax_config_module():
    module = importlib.import_module(name)
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
  return module


def test_ids(test_class):
  """'Class.method' for each `test*` method of a TestCase class, sorted."""
  return [
    f'{test_class.__name__}.{name}'
    for name in unittest.TestLoader().getTestCaseNames(test_class)
  ]


def matrix(test_class):
  """(test id, implementation) pairs the suite runs for `test_class`.

  By default: every test with trax_revplus, and with stock trax the tests
  known to fail there (to check why); stock passes the others (checked
  with FULL_ENV=1). With FULL_ENV=1: every test with
  both.
  """
  pairs = []
  for test_id in test_ids(test_class):
    for implementation in IMPLEMENTATIONS:
      if (
        full_matrix()
        or implementation == 'revplus'
        or (test_id, implementation) in EXPECTED_FAILURES
      ):
        pairs.append((test_id, implementation))
  return pairs


class Outcome:
  """How one trax test method ended.

  Attributes:
    status: 'passed', 'failed' (an assertion), 'error' (an exception) or
      'skipped'.
    details: the traceback or skip reason; '' if it passed.
  """

  def __init__(self, status, details=''):
    self.status = status
    self.details = details

  def __repr__(self):
    return f'Outcome({self.status!r})\n{self.details}'


def _fresh_trax_state():
  """Resets what trax keeps per process and its tests expect unused."""
  from trax.data import inputs  # pylint: disable=g-import-not-at-top
  from trax.layers import base  # pylint: disable=g-import-not-at-top

  inputs.data_counters.clear()  # CountAndSkip positions
  base.N_WEIGHTS_SHARDS = 1


def run(test_class, test_id, implementation):
  """Runs one trax test method with stock trax or trax_revplus.

  Args:
    test_class: a trax `absltest.TestCase` class.
    test_id: 'Class.method', as `test_ids` gives it.
    implementation: 'stock' (`trax_revplus.deactivate()` first) or 'revplus'
      (`trax_revplus.activate()` first); stock trax is bound again after.

  Returns:
    An `Outcome`.
  """
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(
      f'implementation must be one of {IMPLEMENTATIONS}, got '
      f'{implementation!r}.'
    )
  method = test_id.split('.', 1)[1]
  result = unittest.TestResult()
  trax_revplus.deactivate()
  _fresh_trax_state()
  if implementation == 'revplus':
    trax_revplus.activate()
  try:
    test_class(method).run(result)
  finally:
    trax_revplus.deactivate()
    _fresh_trax_state()
  if result.errors:
    return Outcome('error', result.errors[0][1])
  if result.failures:
    return Outcome('failed', result.failures[0][1])
  if result.skipped:
    return Outcome('skipped', result.skipped[0][1])
  return Outcome('passed')


def check(test_class, test_id, implementation):
  """Runs a trax test and asserts the outcome the tables above predict.

  A test in `EXPECTED_FAILURES` must fail with the text given there (for
  the reason given); every other test must pass, with both
  implementations.
  """
  if test_id in SLOW and not full_matrix():
    import pytest  # pylint: disable=g-import-not-at-top

    pytest.skip(SLOW[test_id])
  outcome = run(test_class, test_id, implementation)
  expected = EXPECTED_FAILURES.get((test_id, implementation))
  if expected is None:
    assert outcome.status == 'passed', outcome
  else:
    text, why = expected
    assert outcome.status in ('failed', 'error'), (
      f'{test_id} was expected to fail with {implementation} ({why}); '
      f'update EXPECTED_FAILURES and docs/compatibility.md. {outcome!r}'
    )
    assert text in outcome.details, outcome
