"""trax_revplus.placement: host/device copies and safe freeing (one CPU device).

Multi-device layouts are covered by tests/test_multidevice.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trax_revplus import memory
from trax_revplus import placement as placement_lib
from trax_revplus import validation


def test_replicate_and_collect_round_trip_counts_bytes():
  counter = memory.TransferCounter()
  p = placement_lib.Placement(1, counter)
  host = {
    'w': np.arange(12, dtype=np.float32).reshape(3, 4),
    'b': np.ones(4, np.float32),
  }
  placed = p.replicate(host)
  assert all(
    isinstance(x, jax.Array) for x in jax.tree_util.tree_leaves(placed)
  )
  assert counter.h2d_bytes == 64
  # Already on the device: no second copy.
  p.replicate(placed)
  assert counter.h2d_bytes == 64
  back = p.start_to_host(jax.tree_util.tree_map(lambda x: x * 2, placed))
  assert counter.d2h_bytes == 64
  out = back.collect()
  for k in host:
    assert isinstance(out[k], np.ndarray)
    np.testing.assert_array_equal(out[k], host[k] * 2)


def test_collect_keeps_cpu_device_buffers_as_views_that_outlive_freeing():
  """On CPU the updates' buffers are host memory: collected without a copy,
  and a held view stays intact through freeing and through a donated call
  that takes it as an argument (the step's next update)."""
  p = placement_lib.Placement(1)
  large = jnp.arange(2**14, dtype=jnp.float32)  # 64 KiB
  small = jnp.arange(2**14 - 1, dtype=jnp.float32)
  out = p.start_to_host({'large': large * 2, 'small': small * 2}).collect()
  np.testing.assert_array_equal(out['large'], np.arange(2**14) * 2)
  np.testing.assert_array_equal(out['small'], np.arange(2**14 - 1) * 2)
  if p.platform == 'cpu':
    assert not out['large'].flags.owndata
    assert not out['small'].flags.owndata
  p.free_device_buffers([])
  update = jax.jit(lambda w: w * 0 - 1, donate_argnums=0)
  new = update(p.place_params(out['large']))
  p.free_device_buffers([new])
  np.testing.assert_array_equal(out['large'], np.arange(2**14) * 2)
  np.testing.assert_array_equal(p.to_host(new), -np.ones(2**14))


def test_shard_batch_rejects_indivisible_batch():
  p = placement_lib.Placement(1)
  assert p.shard_batch(np.zeros((3, 2))).shape == (3, 2)
  with pytest.raises(ValueError, match='n_devices'):
    placement_lib.Placement(len(jax.local_devices()) + 1)


def test_shard_batch_checks_the_batch_as_validation_does():
  """A batch the devices do not divide gets `validation.check_batch`'s
  error (on two devices as the placement counts them: the check runs
  before anything is placed)."""
  p = placement_lib.Placement(1)
  p.n_devices = p.n_local_devices = 2
  x = np.zeros((3, 2))
  with pytest.raises(
    validation.BatchSizeError,
    match=r'batch element 1 has batch size 3 \(shape \(3, 2\)\), not '
    r'divisible by the 2 devices; use a batch size that is a multiple of 2 '
    r'\(e\.g\. 2\) or set n_devices to a divisor of 3\.$',
  ):
    p.shard_batch((np.zeros((4, 2)), x))
  with pytest.raises(validation.BatchSizeError, match='element 0 is a scalar'):
    p.shard_batch((np.float32(1.0),))


def test_free_never_touches_held_arrays_or_numpy_views():
  p = placement_lib.Placement(1)
  kept = jnp.arange(100.0)
  caller_held = jnp.arange(100.0) * 2
  view = np.asarray(jnp.arange(100.0) * 3)  # numpy view of a device buffer
  aliasing = jax.device_put(view)  # on CPU may share the view's buffer
  del aliasing
  freed_arrays, freed_bytes = p.free_device_buffers([kept])
  assert freed_arrays >= 0 and freed_bytes >= 0
  np.testing.assert_array_equal(np.asarray(kept), np.arange(100.0))
  np.testing.assert_array_equal(np.asarray(caller_held), np.arange(100.0) * 2)
  np.testing.assert_array_equal(view, np.arange(100.0) * 3)
  assert not kept.is_deleted() and not caller_held.is_deleted()


def test_free_releases_cyclic_garbage():
  p = placement_lib.Placement(1)

  class Holder:
    pass

  a, b = Holder(), Holder()
  a.other, b.other = b, a  # a cycle only the cyclic collector frees
  a.array = jnp.ones((1000,), jnp.float32) + 1
  del a, b
  freed_arrays, freed_bytes = p.free_device_buffers([])
  assert freed_arrays >= 1 and freed_bytes >= 4000


def test_donation_leaves_host_weights_intact():
  """Donating a device copy of host weights never corrupts the host copy."""
  p = placement_lib.Placement(1)
  update = jax.jit(lambda w: w * 0 - 1, donate_argnums=0)
  host = np.asarray(jnp.arange(1000.0))  # as collected weights are held
  expected = np.arange(1000.0, dtype=np.float32)
  placed = p.replicate(host)
  new = update(placed)
  p.free_device_buffers([new])
  np.testing.assert_array_equal(host, expected)
  np.testing.assert_array_equal(p.to_host(new), -np.ones(1000))


def test_abstract_types_serve_the_placed_calls_without_compiling_again():
  """Compiled ahead for `abstract_per_device` arguments and for a traced
  function's results typed by `per_device_types`, calls on the placed
  batch and state and on the first call's results compile nothing."""
  compiles = []

  def listener(name, *unused_args, **unused_kwargs):
    if name == '/jax/core/compile/backend_compile_duration':
      compiles.append(name)

  jax.monitoring.register_event_duration_secs_listener(listener)
  p = placement_lib.Placement(1)
  batch = np.arange(12, dtype=np.float32).reshape(3, 4)
  state = {'count': np.zeros((), np.int32), 'mean': np.ones(4, np.float32)}
  first = jax.jit(
    lambda x, s: (
      x * 3 + s['mean'],
      {'count': s['count'] + 1, 'mean': s['mean'] / 2},
    )
  )
  second = jax.jit(lambda y, s: y.sum() + s['mean'].sum())
  traced = first.trace(p.shard_batch(batch), p.abstract_per_device(state))
  outputs, new_state = p.per_device_types(traced.out_info)
  assert all(
    x.sharding is not None
    for x in jax.tree_util.tree_leaves((outputs, new_state))
  )
  traced.lower().compile()
  second.trace(outputs, new_state).lower().compile()
  start = len(compiles)
  y, s = first(p.shard_batch(batch), p.per_device(state))
  total = second(y, s)
  assert len(compiles) == start
  np.testing.assert_allclose(float(total), (batch * 3 + 1).sum() + 2)
  assert p.abstract_per_device({'count': 1}) is None  # type not known


def test_arrays_waiting_on_the_host_come_back_as_they_left():
  """Values, dtypes, weak types and shardings as the device arrays had
  them (a call compiled for those takes them without compiling again);
  host values and None pass through."""
  counter = memory.TransferCounter()
  p = placement_lib.Placement(1, counter)
  placed = p.replicate({'x': np.arange(6, dtype=np.float32).reshape(2, 3)})
  scale = jax.jit(lambda: 2.0)()  # weak-typed float32
  tree = {
    'x': placed['x'] * 3,
    'scale': scale,
    'i': jnp.int32(4),
    'host': np.ones(2, np.int64),
    'none': None,
  }
  moves = memory.TransferCounter()
  waiting = placement_lib.WaitingOnHost(tree, moves)
  cpu = jax.local_devices(backend='cpu')[0]
  assert all(x.sharding.device_set == {cpu} for x in waiting.arrays())
  back = waiting.place_back(moves)
  assert back['none'] is None and back['host'] is tree['host']
  for key in ('x', 'scale', 'i'):
    assert isinstance(back[key], jax.Array)
    assert back[key].dtype == tree[key].dtype
    assert back[key].weak_type == tree[key].weak_type
    assert back[key].sharding == tree[key].sharding
    np.testing.assert_array_equal(back[key], tree[key])
  assert back['scale'].weak_type
  if p.platform != 'cpu':  # on the CPU backend nothing leaves the device
    assert moves.d2h_bytes == moves.h2d_bytes == 24 + 4 + 4


def test_float0_cotangents_cross_a_compiled_call_as_empty_device_arrays():
  """A float0 result would be a numpy array, which keeps every call of the
  function off JAX's compiled dispatch path; it leaves as an empty device
  array and arrives at the next call as float0 of its shape again."""
  from trax_revplus.placement import layouts  # pylint: disable=g-import-not-at-top

  r = layouts.Layout.REPLICATED

  def backward(x, tokens):
    _, vjp_fn = jax.vjp(lambda x, t: x * t.sum(), x, tokens)
    return vjp_fn(jnp.ones(3))

  def consumer(x_ct, tokens_ct):
    assert tokens_ct.dtype == jax.dtypes.float0, tokens_ct.dtype
    return (x_ct + 1, jnp.zeros(tokens_ct.shape))

  produce = layouts.jit(backward, [r, r], [r, r], None)
  x_ct, tokens_ct = produce(jnp.arange(3.0), np.ones((2, 5), np.int32))
  assert isinstance(tokens_ct, jax.Array)
  assert (tokens_ct.shape, tokens_ct.dtype, tokens_ct.nbytes) == (
    (2, 5, 0),
    np.bool_,
    0,
  )
  np.testing.assert_array_equal(x_ct, np.full(3, 10.0))
  consume = layouts.jit(consumer, [r, r], [r, r], None)
  _, zeros = consume(x_ct, tokens_ct)
  assert zeros.shape == (2, 5)
