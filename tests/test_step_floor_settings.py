"""trax_revplus.step_floor: each attention kind timed at a few settings of
(example, head) pairs at once, and the floor as configured, at the plan's
setting and at the best setting."""

import json

import jax
import numpy as np
import pytest
from trax import layers as tl
from trax import shapes

from trax_revplus import step_floor
from trax_revplus.trainer._step import attention_heads

from conftest import self_attention_lm
from conftest import token_batch

# The backend's refusal of a program for memory, as a TPU words it.
REFUSED = (
  'RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm. Used 16.01G '
  'of 15.75G hbm.'
)


pytestmark = pytest.mark.usefixtures('stock_trax')


def _model(n_parallel_heads=1):
  """trax's ReformerLM with `SelfAttention` of 4 heads configured to
  compute `n_parallel_heads` pairs at once, initialized."""
  batch = token_batch()
  model = self_attention_lm(0.0, n_parallel_heads)
  model.init(shapes.signature(batch[:1]))
  return model


def _attention_kind(floor):
  (kind,) = [k for k in floor.kinds if k.is_attention]
  return kind


@pytest.mark.parametrize(
  'heads,rows,planned,expected',
  [
    # Configured 1 at a time, 4 heads, 2 rows a call (8 pairs): the plan's
    # first, the config's, all 8, then halvings down to the config's, at
    # most four.
    ([(4, 1)], 2, 2, [2, None, 8, 4]),
    ([(4, 1)], 2, None, [None, 8, 4, 2]),
    # The plan's is all pairs: not timed twice.
    ([(4, 1)], 2, 8, [8, None, 4, 2]),
    # A plan above the call's pairs runs all of them (trax clamps it).
    ([(4, 1)], 2, 64, [64, None, 4, 2]),
    # Configured all pairs at once: nothing between it and all pairs.
    ([(4, None)], 2, 2, [2, None]),
    # 3 rows of 4 heads: 6 and 3 do not run (trax asserts they divide the
    # heads or are multiples of them).
    ([(4, 1)], 3, None, [None, 12]),
    # enwik8's attention at 4 rows a call: 8 heads, configured 1.
    ([(8, 1)], 4, 32, [32, None, 16, 8]),
  ],
)
def test_the_settings_timed(heads, rows, planned, expected):
  settings = step_floor.parallel_heads_settings(heads, rows, planned)
  assert settings == expected
  assert all(attention_heads.runs_at(heads, n, rows) for n in settings[1:] if n)


def test_no_settings_without_attention_and_at_most_the_limit():
  assert step_floor.parallel_heads_settings([], 2, 2) == []
  assert step_floor.parallel_heads_settings([(8, 1)], 4, 32, limit=2) == [
    32,
    None,
  ]


def test_three_floors_from_the_settings_timed(monkeypatch):
  """With each setting's time given (the program of pairs at once n takes
  `times[n]`), the floor as configured sums the config's, the best the
  fastest of each kind, the plan's floor the plan's: the selection, not
  the clock, is under test."""
  times = {2: 3e-3, None: 5e-3, 8: 1e-3, 4: 2e-3}
  other = 0.5e-3
  timed = []

  class Tagged:
    def __init__(self, compiled, attention, n):
      self.compiled, self.attention, self.n = compiled, attention, n

    def __call__(self, *args):
      return self.compiled(*args)

    def cost_analysis(self):
      return self.compiled.cost_analysis()

    def memory_analysis(self):
      return self.compiled.memory_analysis()

  program = step_floor._program  # pylint: disable=protected-access

  def tagged(layer, is_loss, n, signature):
    attention = bool(attention_heads.layer_heads([layer]))
    return Tagged(program(layer, is_loss, n, signature), attention, n)

  def seconds(fn, args, warmup=2, n_timed=5):
    del args
    if not fn.attention:
      return other
    timed.append((fn.n, warmup, n_timed))
    return times[fn.n]

  monkeypatch.setattr(step_floor, '_program', tagged)
  monkeypatch.setattr(step_floor, '_median_seconds', seconds)
  model = _model(n_parallel_heads=1)
  loss = tl.WeightedCategoryCrossEntropy()
  floor = step_floor.measure(model, loss, token_batch(), 2, parallel_heads=2)
  kind = _attention_kind(floor)
  # The plan's with the floor's calls, the others with fewer.
  assert timed == [
    (2, step_floor.WARMUP_CALLS, step_floor.TIMED_CALLS),
    (None, step_floor.SETTING_WARMUP_CALLS, step_floor.SETTING_TIMED_CALLS),
    (8, step_floor.SETTING_WARMUP_CALLS, step_floor.SETTING_TIMED_CALLS),
    (4, step_floor.SETTING_WARMUP_CALLS, step_floor.SETTING_TIMED_CALLS),
  ]
  assert kind.parallel_heads_seconds == (
    (2, 3e-3),
    (1, 5e-3),
    (8, 1e-3),
    (4, 2e-3),
  )
  assert kind.seconds == 3e-3
  assert kind.configured_seconds == 5e-3
  assert kind.configured_parallel_heads == 1
  assert (kind.best_seconds, kind.best_parallel_heads) == (1e-3, 8)
  # Kinds the plan cannot change: one figure.
  for k in floor.kinds:
    if not k.is_attention:
      assert k.seconds == k.configured_seconds == k.best_seconds == other
      assert k.best_parallel_heads is None
  rest = sum(k.count * other for k in floor.kinds if k.flops > 0) - (
    kind.count * other
  )
  calls = floor.calls_per_step
  assert calls == 2 and kind.count == 2
  assert floor.seconds == pytest.approx(calls * (rest + 2 * 3e-3))
  assert floor.configured_seconds == pytest.approx(calls * (rest + 2 * 5e-3))
  assert floor.best_seconds == pytest.approx(calls * (rest + 2 * 1e-3))
  assert not floor.plan_is_configured
  figures = json.loads(json.dumps(floor.as_json()))
  assert figures['step_floor_seconds'] == pytest.approx(floor.seconds)
  assert figures['configured_step_floor_seconds'] == pytest.approx(
    floor.configured_seconds
  )
  assert figures['best_step_floor_seconds'] == pytest.approx(floor.best_seconds)
  (share,) = [s for s in figures['shares'] if s['attention']]
  assert share['best_parallel_heads'] == 8
  assert share['best_tflops_per_second'] == pytest.approx(
    kind.flops / 1e-3 / 1e12
  )
  assert share['configured_tflops_per_second'] == pytest.approx(
    kind.flops / 5e-3 / 1e12
  )
  assert share['seconds_per_step'] == pytest.approx(2 * 2 * 3e-3)
  assert all(
    'best_parallel_heads' not in s
    for s in figures['shares']
    if not s['attention']
  )
  json_kind = next(k for k in figures['kinds'] if k['name'] == kind.name)
  assert json_kind['parallel_heads_seconds'] == [
    [2, 3e-3],
    [1, 5e-3],
    [8, 1e-3],
    [4, 2e-3],
  ]


def test_the_three_floors_on_the_device():
  """Timed for real: the plan's setting and the config's are among those
  timed, so the best floor is at most either; a whole program (at the
  plan's setting, which is not the config's) counts for the plan's floor
  and the best, not for the floor as configured."""
  model = _model(n_parallel_heads=1)
  loss = tl.WeightedCategoryCrossEntropy()
  batch = token_batch()
  floor = step_floor.measure(model, loss, batch, 2, parallel_heads=2)
  kind = _attention_kind(floor)
  assert [n for n, _ in kind.parallel_heads_seconds] == [2, 1, 8, 4]
  assert all(t > 0 for _, t in kind.parallel_heads_seconds)
  assert kind.seconds == kind.parallel_heads_seconds[0][1]
  assert kind.configured_seconds == kind.parallel_heads_seconds[1][1]
  assert kind.best_seconds == min(t for _, t in kind.parallel_heads_seconds)
  assert dict(kind.parallel_heads_seconds)[kind.best_parallel_heads] == (
    kind.best_seconds
  )
  assert floor.best_layer_seconds <= floor.layer_seconds
  assert floor.best_layer_seconds <= floor.configured_layer_seconds
  assert floor.configured_layer_seconds == pytest.approx(
    floor.calls_per_step
    * sum(k.configured_seconds * k.count for k in floor.kinds if k.flops > 0)
  )
  whole = step_floor.measure_whole(floor, model, loss, batch)
  assert whole.whole_seconds > 0
  assert whole.seconds == min(whole.layer_seconds, whole.whole_seconds)
  assert whole.best_seconds == min(
    whole.best_layer_seconds, whole.whole_seconds
  )
  assert whole.configured_seconds == whole.configured_layer_seconds
  assert whole.best_seconds <= whole.seconds
  assert whole.best_seconds <= whole.configured_seconds
  # The layers are as configured again after every trace.
  assert {n for _, n in attention_heads.layer_heads([model])} == {1}


def test_a_plan_as_configured_is_one_floor_as_configured():
  model = _model(n_parallel_heads=1)
  loss = tl.WeightedCategoryCrossEntropy()
  batch = token_batch()
  floor = step_floor.measure(model, loss, batch, 2)
  kind = _attention_kind(floor)
  assert floor.plan_is_configured and floor.parallel_heads is None
  assert kind.configured_seconds == kind.seconds
  assert [n for n, _ in kind.parallel_heads_seconds] == [1, 8, 4, 2]
  whole = step_floor.measure_whole(floor, model, loss, batch)
  assert whole.configured_seconds == whole.seconds
  assert whole.best_seconds <= whole.seconds
  # The plan's 1 at a time, as configured: the same.
  at_one = step_floor.measure(model, loss, batch, 2, parallel_heads=1)
  assert at_one.plan_is_configured


def test_a_setting_refused_for_memory_is_skipped(monkeypatch):
  """All pairs at once refused at compile time, 4 at once when it runs:
  both skipped, recorded as refused, the best of the rest."""
  program = step_floor._program  # pylint: disable=protected-access

  def refuses_at_run(*args):
    del args
    raise RuntimeError(REFUSED)

  def refusing(layer, is_loss, n, signature):
    if attention_heads.layer_heads([layer]) and n == 8:
      raise jax.errors.JaxRuntimeError(REFUSED)
    compiled = program(layer, is_loss, n, signature)
    if attention_heads.layer_heads([layer]) and n == 4:
      return refuses_at_run
    return compiled

  monkeypatch.setattr(step_floor, '_program', refusing)
  model = _model(n_parallel_heads=1)
  loss = tl.WeightedCategoryCrossEntropy()
  floor = step_floor.measure(model, loss, token_batch(), 2, parallel_heads=2)
  kind = _attention_kind(floor)
  found = dict(kind.parallel_heads_seconds)
  assert list(found) == [2, 1, 8, 4]
  assert found[8] is None and found[4] is None
  assert found[2] > 0 and found[1] > 0
  assert kind.best_seconds == min(found[2], found[1])
  assert kind.best_parallel_heads in (2, 1)
  assert floor.best_seconds <= floor.seconds
  json.dumps(floor.as_json())


def test_the_config_refused_leaves_no_floor_as_configured(monkeypatch):
  program = step_floor._program  # pylint: disable=protected-access

  def refusing(layer, is_loss, n, signature):
    if attention_heads.layer_heads([layer]) and n is None:
      raise RuntimeError(REFUSED)
    return program(layer, is_loss, n, signature)

  monkeypatch.setattr(step_floor, '_program', refusing)
  model = _model(n_parallel_heads=1)
  loss = tl.WeightedCategoryCrossEntropy()
  floor = step_floor.measure(model, loss, token_batch(), 2, parallel_heads=2)
  kind = _attention_kind(floor)
  assert kind.configured_seconds is None
  assert dict(kind.parallel_heads_seconds)[1] is None
  assert floor.configured_seconds is None and floor.seconds > 0
  assert floor.as_json()['configured_step_floor_seconds'] is None
  assert floor.best_seconds <= floor.seconds


def test_other_errors_are_raised(monkeypatch):
  program = step_floor._program  # pylint: disable=protected-access

  def failing(layer, is_loss, n, signature):
    if attention_heads.layer_heads([layer]) and n == 8:
      raise RuntimeError('INTERNAL: something else')
    return program(layer, is_loss, n, signature)

  monkeypatch.setattr(step_floor, '_program', failing)
  model = _model(n_parallel_heads=1)
  loss = tl.WeightedCategoryCrossEntropy()
  with pytest.raises(RuntimeError, match='INTERNAL'):
    step_floor.measure(model, loss, token_batch(), 2, parallel_heads=2)


def test_each_setting_computes_trax_results():
  """Only the grouping of pairs changes: the outputs and gradients of the
  attention kind's program at every setting timed are trax's own (its
  layer's `pure_fn` as configured, and its gradient)."""
  model = _model(n_parallel_heads=1)
  loss = tl.WeightedCategoryCrossEntropy()
  batch = token_batch(rows=2)
  blocks, loss = step_floor.stock_trainer.extract_reversible_blocks(
    [model, loss]
  )
  (layer, inputs) = next(
    (layer, inputs)
    for layer, inputs in step_floor.layer_inputs(blocks, loss, batch)
    if attention_heads.layer_heads([layer])
  )
  heads = attention_heads.layer_heads([layer])
  args = (
    step_floor._example(inputs, jax.random.PRNGKey(1), None),  # pylint: disable=protected-access
    layer.weights,
    layer.state,
    jax.random.PRNGKey(0),
    step_floor._example(  # pylint: disable=protected-access
      step_floor._cotangents(layer, inputs),  # pylint: disable=protected-access
      jax.random.PRNGKey(2),
      None,
    ),
  )
  trax_outputs = layer.pure_fn(*args[:4], use_cache=False)[0]
  settings = step_floor.parallel_heads_settings(heads, 2, 2)
  assert settings == [2, None, 8, 4]
  results = [
    step_floor._forward_and_gradient(layer, False, n)(*args)  # pylint: disable=protected-access
    for n in settings
  ]
  for gradients, outputs in results:
    for a, b in zip(jax.tree_util.tree_leaves(outputs), trax_outputs):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(
      jax.tree_util.tree_leaves(gradients),
      jax.tree_util.tree_leaves(results[1][0]),
    ):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
  assert {n for _, n in heads} == {1}
  assert {n for _, n in attention_heads.layer_heads([layer])} == {1}


def test_counted_only_or_without_settings():
  model = _model(n_parallel_heads=1)
  loss = tl.WeightedCategoryCrossEntropy()
  counted = step_floor.measure(model, loss, token_batch(), 2, timed=False)
  assert counted.seconds is None
  assert counted.configured_seconds is None and counted.best_seconds is None
  assert all(k.parallel_heads_seconds == () for k in counted.kinds)
  plan_only = step_floor.measure(
    model, loss, token_batch(), 2, parallel_heads=2, settings=False
  )
  # Not timed at settings: no kind counts as one, and no floor as
  # configured or at the best setting.
  assert not any(k.is_attention for k in plan_only.kinds)
  assert plan_only.seconds > 0
  assert plan_only.configured_seconds is None
  assert plan_only.best_seconds is None


def test_a_plan_by_kind_runs_each_kind_at_its_number():
  """A plan's pairs at once by kind (`plan.PairsByKind`): the kind it
  names runs at its number first, a kind it does not name as configured;
  the floor says so in its JSON and the summary's words."""
  # pylint: disable=g-import-not-at-top
  from trax_revplus.cli import summary

  model = _model(n_parallel_heads=1)
  loss = tl.WeightedCategoryCrossEntropy()
  batch = token_batch()
  named = attention_heads.by_kind({'SelfAttention': 4})
  floor = step_floor.measure(
    model, loss, batch, 2, timed=False, parallel_heads=named
  )
  assert floor.parallel_heads == named and not floor.plan_is_configured
  other = attention_heads.by_kind({'LSHSelfAttention': 4})
  unnamed = step_floor.measure(
    model, loss, batch, 2, timed=False, parallel_heads=other
  )
  assert unnamed.plan_is_configured
  data = json.loads(json.dumps(floor.as_json()))
  assert data['parallel_heads'] == [['SelfAttention', 4]]
  assert summary._pairs(data['parallel_heads']) == (  # pylint: disable=protected-access
    'SelfAttention 4 (example, head) pairs at once'
  )
  # Timed: the kind's settings start at the plan's number for it.
  timed = step_floor.measure(model, loss, batch, 2, parallel_heads=named)
  kind = _attention_kind(timed)
  assert [n for n, _ in kind.parallel_heads_seconds][:2] == [4, 1]
