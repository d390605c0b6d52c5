"""trax_revplus.step_floor: a step's arithmetic, layer by layer, timed."""

import jax
import pytest
from trax import layers as tl
from trax import shapes

from trax_revplus import step_floor
from trax_revplus import trainer as rev_trainer

from conftest import lsh_reformer_lm
from conftest import self_attention_lm
from conftest import token_batch


pytestmark = pytest.mark.usefixtures('stock_trax')


def _initialized(model, batch):
  model.init(shapes.signature(batch[:1]))
  return model


def _whole_gradient_flops(model, loss, batch):
  """XLA's count of the whole model's forward and gradient, one program,
  differentiated by `jax.vjp` directly."""
  whole = tl.Serial(model, loss)
  state, rng = whole.state, jax.random.PRNGKey(0)

  def loss_of(weights):
    return whole.pure_fn(batch, weights, state, rng)[0]

  def gradient(weights):
    value, vjp = jax.vjp(loss_of, weights)
    return vjp(jax.numpy.ones_like(value))

  compiled = jax.jit(gradient).lower(whole.weights).compile()
  return step_floor._flops(compiled)  # pylint: disable=protected-access


def test_layer_by_layer_count_is_the_whole_models_count():
  """Without custom gradients (no recomputation to tell apart: a swap is
  the model's only reversible layer), the layers' forward and gradient
  programs, each counted once per layer, add up to XLA's count of the
  whole model's gradient by `jax.vjp`."""
  batch = token_batch()
  model = _initialized(
    tl.Serial(
      tl.Embedding(16, 64),
      tl.Dense(64),
      tl.Relu(),
      tl.Dense(64),
      tl.Relu(),
      tl.Dup(),
      tl.ReversibleSwap(),
      tl.Concatenate(),
      tl.Dense(16),
      tl.LogSoftmax(),
    ),
    batch,
  )
  loss = tl.WeightedCategoryCrossEntropy()
  floor = step_floor.measure(model, loss, batch, rows_per_call=4, timed=False)
  whole = _whole_gradient_flops(model, loss, batch)
  assert floor.flops_per_step == pytest.approx(whole, rel=0.05)
  # The equal Dense(64) and Relu layers compile once each; the loss layer
  # (what follows the last reversible layer, as trax's trainers cut it)
  # comes last.
  counts = {k.name.split(' ')[0]: k.count for k in floor.kinds}
  assert counts['Dense_64'] == 2 and counts['Relu'] == 2
  assert floor.kinds[-1].name == 'loss' and floor.kinds[-1].flops > 0


def test_attention_a_pair_at_a_time_is_counted_whole():
  """XLA counts a loop's body once: trax's attention computing one
  (example, head) pair at a time (a `fori_loop` over 16 pairs) is counted
  as its program with all pairs at once, which the whole model's gradient
  by `jax.vjp` with all pairs at once counts as well."""
  batch = token_batch(rows=4, length=32)
  loss = tl.WeightedCategoryCrossEntropy()
  looped = _initialized(self_attention_lm(0.0, 1), batch)
  floor = step_floor.measure(looped, loss, batch, rows_per_call=4, timed=False)
  every_pair = self_attention_lm(0.0, None)
  every_pair.weights, every_pair.state = looped.weights, looped.state
  whole = _whole_gradient_flops(every_pair, loss, batch)
  assert floor.flops_per_step == pytest.approx(whole, rel=0.05)
  assert floor.parallel_heads is None
  # At the plan's pairs at once: the same count, recorded with the floor.
  at_two = step_floor.measure(
    looped, loss, batch, rows_per_call=4, timed=False, parallel_heads=2
  )
  assert at_two.flops_per_step == pytest.approx(floor.flops_per_step)
  assert at_two.as_json()['parallel_heads'] == 2


def test_equal_layers_share_a_kind_and_calls_multiply_the_floor():
  model = _initialized(lsh_reformer_lm(n_layers=3), token_batch())
  loss = tl.WeightedCategoryCrossEntropy()
  batch = token_batch(rows=4)
  floor = step_floor.measure(model, loss, batch, rows_per_call=2)
  by_name = {k.name.split(' ')[0]: k for k in floor.kinds}
  # Three attention and three feed-forward half-residuals, one kind each.
  assert by_name['ReversibleHalfResidualDecoderAttn'].count == 3
  assert by_name['ReversibleHalfResidualDecoderFF'].count == 3
  assert floor.calls_per_step == 2 and floor.rows_per_call == 2
  assert all(k.seconds > 0 for k in floor.kinds)
  # Kinds without arithmetic (the swaps) add nothing.
  assert any(k.flops == 0 and k.seconds > 0 for k in floor.kinds)
  assert floor.layer_seconds == pytest.approx(
    2 * sum(k.seconds * k.count for k in floor.kinds if k.flops > 0)
  )
  assert floor.seconds == floor.layer_seconds  # No whole program timed.
  assert floor.flops_per_step == pytest.approx(
    2 * sum(k.flops * k.count for k in floor.kinds)
  )
  whole = step_floor.measure_whole(floor, model, loss, batch)
  assert whole.whole_seconds > 0 and whole.whole_note is None
  assert whole.seconds == min(whole.layer_seconds, whole.whole_seconds)
  assert whole.tflops_per_second(0.5) == pytest.approx(
    floor.flops_per_step / 0.5 / 1e12
  )
  assert step_floor.measure(model, loss, batch, 2, timed=False).seconds is None
  # Each kind with arithmetic's share of the floor, largest first; the
  # shares add up to the whole floor (kinds without arithmetic add none).
  shares = floor.shares()
  assert sum(share for _, share, _ in shares) == pytest.approx(1.0)
  assert [share for _, share, _ in shares] == sorted(
    (share for _, share, _ in shares), reverse=True
  )
  for kind, share, rate in shares:
    assert share == pytest.approx(
      kind.seconds * kind.count * 2 / floor.layer_seconds
    )
    assert rate == pytest.approx(kind.flops / kind.seconds / 1e12)


def test_rows_per_call_are_the_plans():
  """A call of trax_revplus's step gets the rows its plan's batch slices
  leave; a trainer without a plan (trax's) the whole batch."""
  from conftest import initialized  # pylint: disable=g-import-not-at-top
  from conftest import reversible_lm_blocks  # pylint: disable=g-import-not-at-top

  first, reversible, loss = reversible_lm_blocks()
  batch = token_batch(rows=4, length=8)
  batch = (batch[0] % 9, batch[1] % 9, batch[2])
  blocks, loss = initialized([(first.sublayers, reversible)], loss, batch)
  trainer = rev_trainer.ReversibleSerialTrainer(
    blocks, loss, trax_revplus_optimizer(), batch_slices=2
  )
  assert step_floor.rows_per_call(trainer, batch, 1) == 2
  assert step_floor.rows_per_call(object(), batch, 2) == 2
  with pytest.raises(ValueError, match='rows_per_call = 3 does not divide'):
    step_floor.measure(tl.Serial(*first.sublayers), loss, batch, 3)


def trax_revplus_optimizer():
  from trax import optimizers  # pylint: disable=g-import-not-at-top

  return optimizers.Adam
