"""Trains on N forced CPU devices and prints figures as one JSON line.

Run by tests/placement/test_multidevice.py (2 devices) and
tools/multidevice_smoke.py (4) in a fresh process, because the device count
is fixed when JAX starts:

  XLA_FLAGS=--xla_force_host_platform_device_count=N \
      python tests/placement/multidevice_worker.py N

Printed (last line of stdout), all differences as max absolute values:
  n_devices, local_devices,
  max_diff_vs_default_1dev: ours on N devices vs trax's default Trainer on
    one device (dropout-free `conftest.reversible_lm_blocks`, 2 steps, Adam,
    learning-rate override),
  max_diff_vs_ours_1dev: ours on N devices vs ours on one device,
  max_diff_free: ours on N devices with free_accelerators_on_step=True vs
    False, loss_shape: shape of the returned loss,
  max_diff_slices_vs_default_1dev: ours on N devices with batch_slices=2
    (each device's rows in 2 slices) vs trax's default Trainer,
  max_diff_chunks_vs_default_1dev: ours on N devices with
    sequence_chunks=2 and batch_slices=2 (the loss layer's tail over 2
    chunks of the sequence in each slice) vs trax's default Trainer,
  max_diff_fused_vs_default_1dev: ours on N devices running every layer
    in the loss's one program (the plan a budget chooses first where it
    fits; set directly here) vs trax's default Trainer, fused_layers: the
    layers that program ran,
  max_diff_budget_vs_default_1dev: ours on N devices under a device memory
    budget (planned: every candidate's step accounted from XLA on N
    devices) vs trax's default Trainer, budget_plan: the plan it chose,
    least_budget: [the least plan's peak bytes, what ours under that budget
    then chose], max_diff_least_vs_default_1dev: that run vs the default
    Trainer,
  max_diff_saved_on_host_vs_default_1dev: ours on N devices with each
    unit's saved inputs and states waiting on the host between its forward
    and its backward vs trax's default Trainer, saved_on_host: whether the
    plan that ran said so,
  max_diff_lsh_slices: a ReformerLM with LSH attention on N devices,
    batch_slices=2 vs 1 (LSH hashes with per-row state),
  adasum_finite: ours with adasum=True trains to finite weights,
  adasum_diff_vs_mean: how far Adasum's weights are from plain averaging
    (> 0: the flag changes the update),
  weights_are_numpy: every weight a host numpy.ndarray after one_step,
  compiles_ahead: [on helper threads, in all] XLA compilations of the
    trainer's layer functions (`jit(per_device)`) in two steps with
    compile_ahead=True, compiles_when_called: in all, with False (equal
    totals: nothing compiled ahead compiles again when called).
"""

import json
import os
import sys
import threading

import numpy as np

from trax_revplus import trax_import

trax_import.import_trax()  # Before any trax module: see trax_import.

# pylint: disable=g-import-not-at-top,g-bad-import-order,wrong-import-position
from trax import fastmath
from trax import layers as tl
from trax import optimizers

# tests/, for conftest's models.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=g-import-not-at-top,wrong-import-position
from conftest import replan
from conftest import reversible_lm_blocks
import trax_revplus
from trax_revplus import trainer as rev_trainer
# pylint: enable=g-import-not-at-top,wrong-import-position


_BATCH = (
  np.arange(32).reshape((8, 4)) % 9,
  (3 * np.arange(32).reshape((8, 4)) + 1) % 9,
  np.ones((8, 4), dtype=np.float32),
)
_RNGS = [fastmath.random.get_prng(7), fastmath.random.get_prng(8)]
_LRS = [None, 0.02]


def _max_diff(a, b):
  fa, fb = fastmath.tree_flatten(a), fastmath.tree_flatten(b)
  assert len(fa) == len(fb) and fa
  return max(
    float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in zip(fa, fb)
  )


def _default_weights_and_losses():
  """trax's default Trainer on one device: (weights, list of the loss each
  step returned)."""
  first, revs, loss = reversible_lm_blocks()
  model = tl.Serial([first] + revs + [loss])
  model.init(_BATCH, rng=fastmath.random.get_prng(12))
  opt = optimizers.Adam()
  opt.tree_init(model.weights)
  trainer = optimizers.Trainer(model, opt, n_devices=1)
  losses = []
  for rng, lr in zip(_RNGS, _LRS):
    loss_value, _ = trainer.one_step(_BATCH, rng, learning_rate=lr)
    losses.append(np.asarray(loss_value))
  return model.weights, losses


def _ours(n_devices, **kwargs):
  weights, loss_value, _ = _ours_and_plan(n_devices, **kwargs)
  return weights, loss_value


def _ours_and_plan(n_devices, **kwargs):
  """`_ours_with_losses` with the last step's loss alone: (weights, loss,
  the plan's settings)."""
  weights, losses, settings = _ours_with_losses(n_devices, **kwargs)
  return weights, losses[-1], settings


def _lm_trainer(n_devices, **settings):
  """(model, ours on N devices with `settings`, Adam) of
  `reversible_lm_blocks`, initialized as `_default_weights_and_losses`'
  model."""
  first, revs, loss = reversible_lm_blocks()
  model = tl.Serial([first] + revs + [loss])
  model.init(_BATCH, rng=fastmath.random.get_prng(12))
  return model, rev_trainer.ReversibleSerialTrainer(
    [(first.sublayers, revs)],
    loss,
    optimizers.Adam,
    n_devices=n_devices,
    **settings,
  )


def _least_bytes(n_devices):
  """Peak device bytes of the least plan on N devices (`least_plan`)."""
  _, trainer = _lm_trainer(n_devices, device_memory_budget_bytes=None)
  _, step = trainer.planner.least_plan(_BATCH)
  return step.peak_device_bytes


def _lsh_trained(n_devices, **settings):
  """Ours with `settings` on a tiny LSH ReformerLM after 2 steps."""
  import functools  # pylint: disable=g-import-not-at-top
  import trax  # pylint: disable=g-import-not-at-top
  from trax import shapes  # pylint: disable=g-import-not-at-top

  model = trax.models.ReformerLM(
    16,
    d_model=16,
    d_ff=32,
    d_attention_key=8,
    d_attention_value=8,
    n_layers=1,
    n_heads=2,
    max_len=32,
    dropout=0.0,
    attention_type=functools.partial(
      tl.LSHSelfAttention, chunk_len=4, n_buckets=4, n_hashes=2
    ),
    mode='train',
  )
  tokens = (np.arange(8 * 16).reshape((8, 16)) * 7 + 3) % 15 + 1
  batch = (tokens, tokens, np.ones((8, 16), np.float32))
  blocks, loss = rev_trainer.extract_reversible_blocks(
    [model, tl.WeightedCategoryCrossEntropy()]
  )
  rev_trainer.init_reversible_blocks(
    blocks, loss, shapes.signature(batch), fastmath.random.get_prng(3)
  )
  trainer = rev_trainer.ReversibleSerialTrainer(
    blocks, loss, optimizers.Adam, n_devices=n_devices, **settings
  )
  for rng, lr in zip(_RNGS, _LRS):
    trainer.one_step(batch, rng, learning_rate=lr)
  return trainer


def _lsh(n_devices, batch_slices):
  """Weights and state of `_lsh_trained` with `batch_slices`."""
  trainer = _lsh_trained(n_devices, batch_slices=batch_slices)
  return [(l.weights, l.state) for l in trainer.all_layers]


def main():
  n = int(sys.argv[1])
  trax_revplus.deactivate()
  import jax  # pylint: disable=g-import-not-at-top

  compiled_by = []  # thread name per XLA compilation of a layer function

  def listener(name, *unused_args, fun_name=None, **unused_kwargs):
    # The step's helper ops (RNG splits, ...) compile in whichever run
    # first needs them; the trainer's shard_map-ed functions in each.
    if (
      name == '/jax/core/compile/backend_compile_duration'
      and fun_name == 'jit(per_device)'
    ):
      compiled_by.append(threading.current_thread().name)

  jax.monitoring.register_event_duration_secs_listener(listener)
  reference, _ = _default_weights_and_losses()
  ours_1, _ = _ours(1)
  start = len(compiled_by)
  ours_n, loss_n = _ours(n)
  ahead = compiled_by[start:]
  start = len(compiled_by)
  _ours(n, compile_ahead=False)
  when_called = compiled_by[start:]
  ours_free, _ = _ours(
    n, free_accelerators_on_step=True, memory_log_every_n_steps=1
  )
  adasum, _ = _ours(n, adasum=True)
  sliced, _ = _ours(n, batch_slices=2)
  chunked, _ = _ours(n, batch_slices=2, sequence_chunks=2)
  fused, _, fused_plan = _ours_and_plan(n, fused=True, compile_ahead=False)
  budgeted, _, budget_plan = _ours_and_plan(n, device_memory_budget_bytes=2**30)
  least_bytes = _least_bytes(n)
  least, _, least_plan = _ours_and_plan(
    n, device_memory_budget_bytes=least_bytes
  )
  # The settings as given (unplanned: segments), saved entries on the host.
  on_host, _, on_host_plan = _ours_and_plan(
    n, saved_on_host=True, compile_ahead=False, device_memory_budget_bytes=None
  )
  result = {
    'n_devices': n,
    'local_devices': len(jax.local_devices()),
    'xla_flags': os.environ.get('XLA_FLAGS', ''),
    'max_diff_vs_default_1dev': _max_diff(ours_n, reference),
    'max_diff_vs_ours_1dev': _max_diff(ours_n, ours_1),
    'max_diff_free': _max_diff(ours_n, ours_free),
    'max_diff_slices_vs_default_1dev': _max_diff(sliced, reference),
    'max_diff_chunks_vs_default_1dev': _max_diff(chunked, reference),
    'max_diff_fused_vs_default_1dev': _max_diff(fused, reference),
    'fused_layers': fused_plan['fused_layers'],
    'max_diff_budget_vs_default_1dev': _max_diff(budgeted, reference),
    'budget_plan': budget_plan,
    'least_budget': [least_bytes, least_plan],
    'max_diff_least_vs_default_1dev': _max_diff(least, reference),
    'max_diff_saved_on_host_vs_default_1dev': _max_diff(on_host, reference),
    'saved_on_host': on_host_plan['saved_on_host'],
    'max_diff_lsh_slices': _max_diff(_lsh(n, 2), _lsh(n, 1)),
    'loss_shape': list(loss_n.shape),
    'adasum_finite': all(
      np.all(np.isfinite(x)) for x in fastmath.tree_flatten(adasum)
    ),
    'adasum_diff_vs_mean': _max_diff(adasum, ours_n),
    'weights_are_numpy': all(
      isinstance(x, np.ndarray)
      for x in fastmath.tree_flatten((ours_n, ours_free, adasum))
    ),
    'compiles_ahead': [
      sum(t.startswith('trax_revplus_compile') for t in ahead),
      len(ahead),
    ],
    'compiles_when_called': len(when_called),
  }
  print(json.dumps(result))


# Micro-batches (`micro_batches_main`), run by
# tests/trainer/test_batch_parts.py.


def _ours_with_losses(
  n_devices, fused=False, saved_on_host=False, grads_on_host=False, **kwargs
):
  """Ours on N devices, 2 steps; its plan with every layer in the loss's
  program where `fused`, saved inputs and states on the host where
  `saved_on_host`, accumulated gradients on the host where
  `grads_on_host`: (weights, list of the loss each step returned, the
  plan's settings)."""
  model, trainer = _lm_trainer(n_devices, **kwargs)
  if fused:
    replan(trainer, _BATCH, fused_from=0)
  if saved_on_host:
    replan(trainer, _BATCH, saved_on_host=True)
  if grads_on_host:
    replan(trainer, _BATCH, grads_on_host=True)
  losses = []
  for rng, lr in zip(_RNGS, _LRS):
    loss_value, _ = trainer.one_step(_BATCH, rng, learning_rate=lr)
    losses.append(np.asarray(loss_value))
  return (model.weights, losses, trainer.planned(_BATCH).plan.settings())


def _lsh_micro(n_devices, micro_batches):
  """Weights, slots and state of `_lsh_trained` with `micro_batches`."""
  trainer = _lsh_trained(
    n_devices, micro_batches=micro_batches, device_memory_budget_bytes=None
  )
  return (
    [l.weights for l in trainer.all_layers],
    trainer.slots,
    [l.state for l in trainer.all_layers],
  )


def micro_batches_main(n):
  """Micro-batches on N devices; prints one JSON line:
  n_devices, local_devices,
  max_diff_micro_vs_default_1dev: ours on N devices with micro_batches=2
    (each device's rows in 2 parts) vs trax's default Trainer on one
    device (`_default_weights_and_losses`' run), micro_plan: the plan
    that ran,
  max_diff_micro_slices_vs_default_1dev: with micro_batches=2 and
    batch_slices=2, micro_slices_plan: the plan that ran,
  max_diff_micro_host_vs_default_1dev: with micro_batches=2, the
    accumulated gradients on the host, micro_host_plan: the plan that
    ran,
  max_diff_micro_loss_vs_default_1dev: each step's loss with
    micro_batches=2 (one entry per device: its rows' loss, as without
    micro-batches), averaged over the devices, vs the default Trainer's
    (`_BATCH`'s loss weights are all ones: each device's rows weigh
    alike, so the average is the batch's loss),
  max_diff_micro_loss_vs_ours_nd: each device's entry of each step's
    loss, micro_batches=2 vs 1 on N devices,
  max_diff_lsh_micro: `_lsh`'s ReformerLM with LSH attention on N
    devices, micro_batches=2 vs 1 (weights and slots),
  lsh_state_equal: whether their layers' states (per-row LSH state
    joined from the parts on each device) are equal.
  """
  trax_revplus.deactivate()
  import jax  # pylint: disable=g-import-not-at-top

  reference, reference_losses = _default_weights_and_losses()
  micro, micro_losses, micro_plan = _ours_with_losses(
    n, micro_batches=2, device_memory_budget_bytes=None
  )
  _, one_pass_losses, _ = _ours_with_losses(
    n, micro_batches=1, device_memory_budget_bytes=None
  )
  micro_sliced, _, micro_slices_plan = _ours_with_losses(
    n, micro_batches=2, batch_slices=2, device_memory_budget_bytes=None
  )
  micro_host, _, micro_host_plan = _ours_with_losses(
    n, grads_on_host=True, micro_batches=2, device_memory_budget_bytes=None
  )
  lsh_whole = _lsh_micro(n, 1)
  lsh_parts = _lsh_micro(n, 2)
  state_whole, state_parts = lsh_whole[2], lsh_parts[2]
  lsh_state_equal = jax.tree_util.tree_structure(
    state_whole
  ) == jax.tree_util.tree_structure(state_parts) and all(
    np.array_equal(np.asarray(x), np.asarray(y))
    for x, y in zip(
      fastmath.tree_flatten(state_whole), fastmath.tree_flatten(state_parts)
    )
  )
  result = {
    'n_devices': n,
    'local_devices': len(jax.local_devices()),
    'max_diff_micro_vs_default_1dev': _max_diff(micro, reference),
    'micro_plan': micro_plan,
    'max_diff_micro_slices_vs_default_1dev': _max_diff(micro_sliced, reference),
    'micro_slices_plan': micro_slices_plan,
    'max_diff_micro_host_vs_default_1dev': _max_diff(micro_host, reference),
    'micro_host_plan': micro_host_plan,
    'max_diff_micro_loss_vs_default_1dev': max(
      abs(float(np.mean(ours)) - float(ref))
      for ours, ref in zip(micro_losses, reference_losses)
    ),
    'max_diff_micro_loss_vs_ours_nd': _max_diff(micro_losses, one_pass_losses),
    'micro_loss_shape': list(micro_losses[0].shape),
    'micro_losses': [l.tolist() for l in micro_losses],
    'default_losses': [l.tolist() for l in reference_losses],
    'max_diff_lsh_micro': _max_diff(lsh_whole[:2], lsh_parts[:2]),
    'lsh_state_equal': bool(lsh_state_equal),
  }
  print(json.dumps(result))


# Attention heads at a time (`attention_heads_main`), run by
# tests/trainer/test_attention_heads.py.


def attention_heads_main(n):
  """One attention head at a time on N devices; prints one JSON line:
  n_devices, local_devices,
  max_diff_heads_vs_default_1dev: weights after 2 steps of ours with
    parallel_heads=1 on N devices against trax's default Trainer on one
    device, on a dropout-free ReformerLM with trax's `SelfAttention`
    (4 heads, all pairs at once as configured),
  heads_plan: the plan that ran.
  """
  trax_revplus.deactivate()
  import jax  # pylint: disable=g-import-not-at-top
  import trax  # pylint: disable=g-import-not-at-top
  from trax import shapes  # pylint: disable=g-import-not-at-top

  tokens = (np.arange(8 * 16).reshape((8, 16)) * 7 + 3) % 15 + 1
  batch = (tokens, tokens, np.ones((8, 16), np.float32))

  def initialized():
    model = tl.Serial(
      trax.models.ReformerLM(
        16,
        d_model=16,
        d_ff=32,
        d_attention_key=8,
        d_attention_value=8,
        n_layers=1,
        n_heads=4,
        max_len=32,
        dropout=0.0,
        attention_type=tl.SelfAttention,
        mode='train',
      ),
      tl.WeightedCategoryCrossEntropy(),
    )
    model.init(shapes.signature(batch), rng=fastmath.random.get_prng(12))
    return model

  reference = initialized()
  opt = optimizers.Adam()
  opt.tree_init(reference.weights)
  default = optimizers.Trainer(reference, opt, n_devices=1)
  ours_model = initialized()
  blocks, loss = rev_trainer.extract_reversible_blocks(
    list(ours_model.sublayers)
  )
  ours = rev_trainer.ReversibleSerialTrainer(
    blocks,
    loss,
    optimizers.Adam,
    n_devices=n,
    parallel_heads=1,
    device_memory_budget_bytes=None,
  )
  for rng, lr in zip(_RNGS, _LRS):
    default.one_step(batch, rng, learning_rate=lr)
    ours.one_step(batch, rng, learning_rate=lr)
  print(
    json.dumps(
      {
        'n_devices': n,
        'local_devices': len(jax.local_devices()),
        'max_diff_heads_vs_default_1dev': _max_diff(
          ours_model.weights, reference.weights
        ),
        'heads_plan': ours.planned(batch).plan.settings(),
      }
    )
  )


# Weights and slots kept on the device (`params_on_device_main`), run by
# tests/trainer/test_params_on_device.py.


def params_on_device_main(n):
  """Ours with weights and slots kept on N devices, fused and unfused
  (micro-batches too), against trax's default Trainer on one device; what
  the steps after the first copy; whether the updates stay where a call
  takes them (no copy between devices either)."""
  import jax  # pylint: disable=g-import-not-at-top

  trax_revplus.deactivate()
  reference, _ = _default_weights_and_losses()
  result = {'n_devices': n}
  for name, settings in (
    ('unfused', {}),
    ('fused', {'fused': True}),
    ('micro', {'micro_batches': 2}),
  ):
    for on_device in (True, False):
      model, trainer = _lm_trainer(
        n,
        params_on_device=on_device,
        device_memory_budget_bytes=None,
        micro_batches=settings.get('micro_batches', 1),
      )
      if settings.get('fused'):
        replan(trainer, _BATCH, fused_from=0)
      transfers = trainer.placement.transfers
      moved = []
      for rng, lr in zip(_RNGS, _LRS):
        h2d, d2h = transfers.h2d_bytes, transfers.d2h_bytes
        trainer.one_step(_BATCH, rng, learning_rate=lr)
        moved.append([transfers.h2d_bytes - h2d, transfers.d2h_bytes - d2h])
      leaves = jax.tree_util.tree_leaves(model.weights)
      placed = trainer.placement.place_params(leaves)
      result[f'{name}_{"device" if on_device else "host"}'] = {
        'plan_on_device': trainer.planned(_BATCH).plan.params_on_device,
        'max_diff_vs_default_1dev': _max_diff(model.weights, reference),
        'moved': moved,
        'params_bytes': sum(trainer._store.params_bytes().values()),  # pylint: disable=protected-access
        'device_arrays': all(isinstance(x, jax.Array) for x in leaves),
        'stay_as_placed': all(a is b for a, b in zip(placed, leaves)),
      }
  print(json.dumps(result))


if __name__ == '__main__':
  main()
