"""Equal blocks of a reversible run as one loop (`chains.repeats`,
`chains.scanned_forward_fn`, `chains.scanned_reverse_and_grad`): the
unrolled walk's outputs and gradients, a program that does not grow with
depth."""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from trax import fastmath
from trax import layers as tl
from trax import optimizers
from trax import shapes

from conftest import run_multidevice_worker
import trainer_cases as cases
from trax_revplus import trainer as rev_trainer
from trax_revplus.trainer._search import speed_rank
from trax_revplus.trainer._step import chains
from trax_revplus.trainer._step import fused_fns
from trax_revplus.trainer._step import step_fns

pytestmark = pytest.mark.usefixtures('stock_trax')

_ROWS, _LENGTH, _D = 2, 16, 16


def _reversible_layers(n_layers, dropout=0.1, attention_types=None):
  """The reversible layers of a ReformerLM of `n_layers` blocks (d_model
  16, 2 heads), initialized, and the stack depth they read."""
  model = cases.small_reformer_lm(
    attention_types or tl.SelfAttention,
    n_layers=n_layers,
    max_len=_LENGTH,
    dropout=dropout,
    d_model=_D,
  )
  blocks, loss = rev_trainer.extract_reversible_blocks(
    [model, tl.WeightedCategoryCrossEntropy()]
  )
  tokens = np.zeros((_ROWS, _LENGTH), np.int32)
  rev_trainer.init_reversible_blocks(
    blocks,
    loss,
    shapes.signature((tokens, tokens, np.ones_like(tokens, np.float32))),
    fastmath.random.get_prng(3),
  )
  ((_, revs),) = [b for b in blocks if b[1]]
  return revs


def _arguments(layers, seed=0):
  depth = chains.chain_depth(layers)
  keys = jax.random.split(jax.random.PRNGKey(seed), depth + len(layers))
  inputs = tuple(
    jax.random.normal(k, (_ROWS, _LENGTH, _D)) for k in keys[:depth]
  )
  weights = [layer.weights for layer in layers]
  states = [layer.state for layer in layers]
  rngs = list(keys[depth:])
  return inputs, weights, states, rngs


def test_the_longest_run_of_equal_blocks():
  # A ReformerLM block: attention half-residual, swap, feed-forward
  # half-residual, swap.
  assert chains.repeats(_reversible_layers(4)) == chains.Repeats(0, 4, 4)
  # Two attention kinds in turn: blocks of 8 layers.
  mixed = [
    functools.partial(tl.SelfAttention, chunk_len=4, n_chunks_before=1),
    tl.SelfAttention,
  ]
  layers = _reversible_layers(4, attention_types=mixed)
  assert chains.repeats(layers) == chains.Repeats(0, 8, 2)
  # One block: nothing repeats.
  assert chains.repeats(_reversible_layers(1)) is None
  # Two blocks of two kinds: no block repeats.
  assert chains.repeats(_reversible_layers(2, attention_types=mixed)) is None


def _unrolled(layers):
  return chains.reversible_run_fn(layers)


def _looped(layers):
  return chains.reversible_run_fn(layers, chains.repeats(layers))


def _loss_and_grads(run, args):
  inputs, weights, states, rngs = args

  def loss(x, w):
    outputs, _ = run(x, w, states, rngs)
    return sum(jnp.sum(jnp.sin(y)) for y in outputs)

  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(inputs, weights)


_KINDS = {
  'one-kind': None,
  'two-kinds': [
    functools.partial(tl.SelfAttention, chunk_len=4, n_chunks_before=1),
    tl.SelfAttention,
  ],
  # Layers with state (each block's hash RNG and buckets) and shared
  # query-key attention.
  'lsh': functools.partial(
    tl.LSHSelfAttention, chunk_len=4, n_buckets=4, n_hashes=2
  ),
}


@pytest.mark.parametrize('kinds', list(_KINDS))
def test_the_loop_computes_the_unrolled_walk(kinds):
  attention = _KINDS[kinds]
  layers = _reversible_layers(4, dropout=0.1, attention_types=attention)
  assert chains.repeats(layers) is not None
  args = _arguments(layers)
  looped = _looped(layers)
  unrolled = _unrolled(layers)
  out_l, states_l = jax.jit(looped)(*args)
  out_u, states_u = jax.jit(unrolled)(*args)
  for a, b in zip(
    jax.tree_util.tree_leaves((out_l, states_l)),
    jax.tree_util.tree_leaves((out_u, states_u)),
  ):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
  (loss_l, grads_l) = _loss_and_grads(looped, args)
  (loss_u, grads_u) = _loss_and_grads(unrolled, args)
  np.testing.assert_allclose(loss_l, loss_u, rtol=1e-6)
  leaves_l = jax.tree_util.tree_leaves(grads_l)
  leaves_u = jax.tree_util.tree_leaves(grads_u)
  assert len(leaves_l) == len(leaves_u) > 0
  for a, b in zip(leaves_l, leaves_u):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
  # Each block with its own weights and RNG: not the first block's for all.
  assert not np.allclose(grads_l[1][0][0], grads_l[1][4][0])  # pylint: disable=unsubscriptable-object


def _program_chars(run, layers):
  args = _arguments(layers)
  return len(
    jax.jit(lambda *a: _loss_and_grads_fn(run)(*a)).lower(*args).as_text()
  )


def _loss_and_grads_fn(run):
  def fn(inputs, weights, states, rngs):
    def loss(x, w):
      outputs, _ = run(x, w, states, rngs)
      return sum(jnp.sum(y) for y in outputs)

    return jax.value_and_grad(loss, argnums=(0, 1))(inputs, weights)

  return fn


def test_the_program_does_not_grow_with_depth():
  shallow, deep = _reversible_layers(2), _reversible_layers(8)
  looped = _program_chars(_looped(deep), deep) / (
    _program_chars(_looped(shallow), shallow)
  )
  unrolled = _program_chars(_unrolled(deep), deep) / _program_chars(
    _unrolled(shallow), shallow
  )
  # 8 blocks against 2: the unrolled program traces each block (seen
  # 2.9x the text); the loop's body is one block whatever the depth (the
  # stacking and unstacking of each layer's weights grow with it: seen
  # 1.26x).
  assert unrolled > 2.5
  assert looped < 1.5


def _adam_updates(layers, seed=0, clip_grad_norm=None):
  """Per layer: Adam (as trax's trainers build it per layer), its update
  (`step_fns.update_fn`) and its arguments: random gradients, the
  layer's weights, the slots after one update, the opt params."""
  # Hyperparameters that differ by layer: arguments of the update.
  opts = [
    optimizers.Adam(b1=0.9 - 0.01 * k, clip_grad_norm=clip_grad_norm)
    for k in range(len(layers))
  ]
  weights = [layer.weights for layer in layers]
  drawn = [0]

  def normal(x):
    drawn[0] += 1
    key = jax.random.fold_in(jax.random.PRNGKey(seed), drawn[0])
    return jax.random.normal(key, x.shape, x.dtype)

  def like(w):
    return jax.tree_util.tree_map(normal, w)

  grads = [like(w) for w in weights]
  slots, opt_params = [], []
  for opt, w in zip(opts, weights):
    s, p = opt.tree_init(w)
    if jax.tree_util.tree_leaves(w):
      # One update first: slots that differ by layer.
      _, s, _ = opt.tree_update(1, like(w), w, s, p, store_slots=False)
    slots.append(s)
    opt_params.append(p)
  updates = [step_fns.update_fn(opt, 1, False) for opt in opts]
  return opts, updates, (grads, weights, slots, opt_params)


@pytest.mark.parametrize('clip_grad_norm', [None, 0.5])
def test_equal_blocks_update_as_each_layer_alone(clip_grad_norm):
  # Each layer's update mapped over the stacked blocks: trax's own
  # `Optimizer.tree_update` of each layer alone (its norms, clipping and
  # statistics per layer).
  layers = _reversible_layers(4)
  opts, updates, args = _adam_updates(layers, clip_grad_norm=clip_grad_norm)
  blocks = chains.looped_blocks(layers)
  assert blocks == [chains.Repeats(0, 4, 4)]
  assert step_fns.updated_together(blocks, opts, adasum=False) == blocks
  assert not step_fns.updated_together(blocks, opts, adasum=True)
  step = jnp.array(2)
  new_weights, new_slots, stats = jax.jit(
    lambda *a: step_fns.update_each(updates, *a, step, blocks=blocks)
  )(*args)
  grads, weights, slots, opt_params = args
  for k, opt in enumerate(opts):
    if not jax.tree_util.tree_leaves(weights[k]):
      assert stats[k] == {}
      continue
    want = opt.tree_update(
      step, grads[k], weights[k], slots[k], opt_params[k], store_slots=False
    )
    cases.assert_all_close(
      want, (new_weights[k], new_slots[k], stats[k]), tol=1e-6
    )


def test_blocks_of_other_optimizers_update_layer_by_layer():
  layers = _reversible_layers(4)
  opts, _, _ = _adam_updates(layers)
  # Clipping is the optimizer's own setting, not an argument of its update.
  opts[5] = optimizers.Adam(clip_grad_norm=1.0)
  blocks = chains.looped_blocks(layers)
  assert not step_fns.updated_together(blocks, opts, adasum=False)


def test_the_update_does_not_grow_with_depth():
  def square_roots(n_blocks, together):
    # Adam's update takes a square root per array and trax's norms one
    # per layer: how many updates the program traces.
    layers = _reversible_layers(n_blocks)
    _, updates, args = _adam_updates(layers)
    blocks = chains.looped_blocks(layers) if together else ()
    fn = lambda *a: step_fns.update_each(updates, *a, 2, blocks=blocks)
    return jax.jit(fn).lower(*args).as_text().count('stablehlo.sqrt')

  # 8 blocks against 2: layer by layer, 4x the updates; mapped, one update
  # per position in a block whatever the depth.
  assert square_roots(8, False) == 4 * square_roots(2, False) > 0
  assert square_roots(8, True) == square_roots(2, True) > 0


@pytest.mark.parametrize('slices', [1, 2])
def test_a_fused_program_that_loops_trains_as_stock(monkeypatch, slices):
  # The CPU's rule keeps the fused program unrolled; a backend that loops
  # (as accelerators do) on the CPU's devices: the weights and losses of
  # 3 steps of a 4-block ReformerLM with dropout, in 1 or 2 batch slices,
  # are stock trax's.
  monkeypatch.setitem(speed_rank.SCAN_EQUAL_BLOCKS, jax.default_backend(), True)
  looped_runs = []
  scanned = chains.scanned_forward_fn

  def counted(layers, run):
    looped_runs.append(run)
    return scanned(layers, run)

  monkeypatch.setattr(chains, 'scanned_forward_fn', counted)
  together = []
  updated_together = step_fns.updated_together

  def recorded(*args, **kwargs):
    runs = updated_together(*args, **kwargs)
    together.extend(runs)
    return runs

  monkeypatch.setattr(step_fns, 'updated_together', recorded)
  monkeypatch.setattr(fused_fns, 'updated_together', recorded)
  batch = cases.self_attention_lm_batch()
  model = lambda: cases.small_reformer_lm(
    tl.SelfAttention, n_layers=4, dropout=0.1
  )
  plans = []

  def ours(blocks, loss):
    trainer = rev_trainer.ReversibleSerialTrainer(blocks, loss, optimizers.Adam)
    cases.set_plan(trainer, batch, cases.fused_plan(trainer, batch, slices))
    plans.append(trainer.planned(batch).plan)
    return trainer

  expected_weights, expected_losses = cases.train_lm(
    cases.stock_trainer, model(), batch, 3
  )
  weights, losses = cases.train_lm(ours, model(), batch, 3)
  assert plans[0].fused_from < plans[0].loss
  # The fused program's reversible run: 4 blocks of 4 layers, one loop.
  assert chains.Repeats(0, 4, 4) in looped_runs
  # Its layers updated by one mapped update per position in the block.
  assert together and all(run.count == 4 for run in together)
  np.testing.assert_allclose(losses, expected_losses, rtol=0, atol=1e-5)
  cases.assert_all_close(expected_weights, weights)


def test_a_run_after_other_layers_and_a_block_that_changes_its_items():
  layers = _reversible_layers(4)
  # Three distinct layers before the repeats: still found.
  head = [tl.ReversibleSwap()] + _reversible_layers(1)[:2]
  found = chains.repeats(head + layers)
  # (From the head's last swap on, blocks of swap, attention, swap,
  # feed-forward repeat as often: as few layers to trace.)
  assert (found.period, found.count) == (4, 4) and found.start >= 2
  # Swaps of items of other shapes: each block changes its items' shapes,
  # which a loop cannot carry; the unrolled walk runs.
  swaps = [tl.ReversibleSwap()] * 3
  assert chains.repeats(swaps) == chains.Repeats(0, 1, 3)
  inputs = (jnp.zeros((2, 3)), jnp.ones((2, 5)))
  outputs, _ = jax.jit(chains.reversible_run_fn(swaps, chains.repeats(swaps)))(
    inputs, [()] * 3, [()] * 3, list(jax.random.split(jax.random.PRNGKey(0), 3))
  )
  assert [y.shape for y in outputs] == [(2, 5), (2, 3)]


def test_a_looped_program_on_2_devices_trains_as_the_default_trainer():
  # Gradients averaged over the devices inside the mapped update: the
  # weights of 2 steps are trax's default Trainer's on one device.
  result = run_multidevice_worker(
    2,
    'looped_on_devices',
    script=os.path.join(os.path.dirname(__file__), 'layer_scan_worker.py'),
  )
  assert result['local_devices'] == 2, result
  assert result['updated_together'], result
  assert all(count >= 2 for _, _, count in result['updated_together'])
  assert result['max_diff'] <= 1e-5, result
