"""trax_revplus.memory.probes and transfers: bytes in use, bytes moved."""

import gc
import json
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import psutil

from trax_revplus import memory


def test_host_rss_matches_psutil():
  direct = psutil.Process(os.getpid()).memory_info().rss
  probed = memory.host_rss_bytes()
  assert isinstance(probed, int)
  assert abs(probed - direct) <= 0.1 * direct


def test_device_bytes_grow_by_array_nbytes():
  device = jax.local_devices()[0]
  gc.collect()  # Garbage from earlier tests must not be freed mid-count.
  before = memory.device_bytes_in_use([device])
  host = np.arange(512 * 1024, dtype=np.float32)  # 2 MiB
  x = jax.device_put(host, device)
  after = memory.device_bytes_in_use([device])
  grown = after['device_bytes_in_use'] - before['device_bytes_in_use']
  assert after['device_bytes_in_use'] > 0
  # Allocator slack only where the backend reports its own figures.
  slack = 1 << 20 if after['device_bytes_source'] == 'memory_stats' else 0
  assert abs(grown - host.nbytes) <= slack
  assert after['device_bytes_in_use_per_device'] == [
    after['device_bytes_in_use']
  ]
  if device.memory_stats() is None:
    assert after['device_bytes_source'] == 'live_arrays'
    assert after['device_peak_bytes'] is None
  x.delete()
  freed = memory.device_bytes_in_use([device])
  assert (
    after['device_bytes_in_use'] - freed['device_bytes_in_use']
    >= host.nbytes - slack
  )


def test_device_bytes_count_each_shard_on_its_device():
  # The memory package imports JAX only, not trax: the subprocess starts fast.
  script = textwrap.dedent("""
      import json
      import jax, numpy as np
      from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
      from trax_revplus import memory
      devices = jax.local_devices()
      mesh = Mesh(np.array(devices), ('batch',))
      before = memory.device_bytes_in_use(devices)[
          'device_bytes_in_use_per_device']
      sharded = jax.device_put(np.ones((8, 1024), np.float32),
                               NamedSharding(mesh, P('batch')))
      replicated = jax.device_put(np.ones((256,), np.float32),
                                  NamedSharding(mesh, P()))
      after = memory.device_bytes_in_use(devices)
      first = memory.device_bytes_in_use(devices[:1])
      print(json.dumps({'before': before, 'after': after, 'first': first}))
  """)
  env = dict(
    os.environ,
    XLA_FLAGS='--xla_force_host_platform_device_count=4',
    JAX_PLATFORMS='cpu',
  )
  out = subprocess.run(
    [sys.executable, '-c', script],
    env=env,
    check=True,
    capture_output=True,
    text=True,
  )
  result = json.loads(out.stdout.strip().splitlines()[-1])
  before = result['before']
  after = result['after']['device_bytes_in_use_per_device']
  # Each device holds 2 of the 8 rows (2 * 1024 * 4 bytes) and a full copy of
  # the replicated 256 floats (1024 bytes).
  expected = 2 * 1024 * 4 + 256 * 4
  assert [a - b for a, b in zip(after, before)] == [expected] * 4
  assert result['after']['device_bytes_in_use'] == sum(after)
  assert result['first']['device_bytes_in_use_per_device'] == after[:1]


class _FakeAccelerator:
  """Stands for a GPU/TPU device, whose runtime reports memory_stats()."""

  def __init__(self, in_use, peak):
    self._stats = {
      'bytes_in_use': in_use,
      'peak_bytes_in_use': peak,
      'bytes_limit': 1 << 34,
    }

  def memory_stats(self):
    return self._stats


def test_device_bytes_use_memory_stats_where_reported():
  devices = [_FakeAccelerator(100, 300), _FakeAccelerator(50, 70)]
  assert memory.device_bytes_in_use(devices) == {
    'device_bytes_in_use': 150,
    'device_peak_bytes': 370,
    'device_bytes_source': 'memory_stats',
    'device_bytes_in_use_per_device': [100, 50],
  }
  # One device without stats sends all to the live-array count, so the
  # figures of one record always share one source.
  local = jax.local_devices()[0]
  if local.memory_stats() is None:
    mixed = memory.device_bytes_in_use([devices[0], local])
    assert mixed['device_bytes_source'] == 'live_arrays'
    assert mixed['device_bytes_in_use_per_device'][0] == 0


def test_array_bytes_sums_leaves():
  leaves = [
    np.zeros((3, 4), np.float32),
    np.zeros((5,), np.int8),
    np.float64(1.0),
  ]
  tree = {
    'a': (leaves[0], ()),
    'b': [leaves[1], {'c': leaves[2]}],
    'd': None,
    'e': 3,
  }
  assert memory.array_bytes(tree) == sum(x.nbytes for x in leaves)
  assert memory.array_bytes(()) == 0
  assert memory.array_bytes(((), ((),))) == 0
  abstract = [
    jax.ShapeDtypeStruct((4, 6), np.float32),
    jax.ShapeDtypeStruct((), np.int16),
  ]
  assert memory.array_bytes(abstract) == 4 * 6 * 4 + 2
  x = jax.numpy.ones((7, 3), jax.numpy.bfloat16)
  assert memory.array_bytes((x, leaves[0])) == 7 * 3 * 2 + leaves[0].nbytes


def test_transfer_counter():
  counter = memory.TransferCounter()
  assert counter.snapshot() == (0, 0)
  counter.add_h2d(np.int64(100))
  counter.add_d2h(30)
  snap = counter.snapshot()
  counter.add_h2d(5)
  counter.add_d2h(7)
  assert (counter.h2d_bytes, counter.d2h_bytes) == (105, 37)
  assert counter.since(snap) == (5, 7)
  assert isinstance(counter.h2d_bytes, int)
