"""`placement.OneDevice`: values placed whole on one device, their types
as `jax.device_put` gives them, their copies deleted after use."""

import jax
import numpy as np

from trax_revplus import memory
from trax_revplus import placement as placement_lib


def _tree():
  return {
    'f32': np.arange(6, dtype=np.float32).reshape(2, 3),
    'f64': np.linspace(0, 1, 5),  # copied: float32 on the device
    'int': 3,
    'float': 0.5,
    'empty': (),
  }


def test_types_are_those_of_the_placed_values():
  device = jax.local_devices()[0]
  one = placement_lib.OneDevice(device)
  tree = _tree()
  types = one.types(tree)
  placed, _ = one.put(tree)
  expected = jax.tree_util.tree_map(
    lambda x: jax.ShapeDtypeStruct(
      x.shape, x.dtype, sharding=x.sharding, weak_type=x.weak_type
    ),
    placed,
  )
  assert types == expected
  for x in jax.tree_util.tree_leaves(placed):
    assert x.committed and x.sharding == one.sharding


def test_put_counts_host_bytes_and_passes_arrays_already_there():
  device = jax.local_devices()[0]
  transfers = memory.TransferCounter()
  one = placement_lib.OneDevice(device, transfers)
  there = jax.device_put(np.ones(4, np.float32), device)
  placed, copies = one.put((there, np.zeros(8, np.float32)))
  assert placed[0] is there
  assert len(copies) == 1 and copies[0] is placed[1]
  assert transfers.h2d_bytes == 32


def test_release_deletes_copies_but_not_the_sources_memory():
  device = jax.local_devices()[0]
  one = placement_lib.OneDevice(device)
  tree = _tree()
  kept = {k: np.array(v) for k, v in tree.items() if k != 'empty'}
  placed, copies = one.put(tree)
  released = one.release(copies, tree)
  f64 = placed['f64']
  assert f64.is_deleted()  # A float32 copy of float64 values.
  assert released >= f64.nbytes
  for x in copies:
    # Any copy not deleted is the memory of its source (the CPU backend
    # may alias a numpy array), which stays as it was.
    assert x.is_deleted() or x.unsafe_buffer_pointer() == (
      tree['f32'].ctypes.data
    )
  for k, v in kept.items():
    np.testing.assert_array_equal(np.asarray(tree[k]), v)
