"""Run by test_rules.py in a fresh process on N forced CPU devices: what
each placement rule places, beside the types compiled ahead for it."""

import json

import jax
import numpy as np

from trax_revplus import placement as placement_lib


def _type(x):
  """(shape, dtype, sharding) of a placed array or its abstract type; a
  host array stays a host array ('host')."""
  if isinstance(x, np.ndarray):
    return ['host', list(x.shape), str(x.dtype)]
  return [list(x.shape), str(x.dtype), repr(x.sharding)]


def placed_and_types(n_devices):
  """For each rule, [placed, abstract] (shape, dtype, sharding) of its
  leaves, as JSON (printed, the last line)."""
  p = placement_lib.Placement(n_devices)
  batch = (
    np.arange(8 * 3, dtype=np.int64).reshape(8, 3),
    np.ones((8,), np.float32),
  )
  params = [np.ones((3, 2), np.float64), np.zeros((), np.float32)]
  state = {'mean': np.ones((4,), np.float32)}
  pairs = {
    'params': (p.place_params(params), p.abstract_params(params)),
    'per_device': (p.per_device(state), p.abstract_per_device(state)),
    'batch': (p.shard_batch(batch), p.abstract_batch(batch)),
  }
  placed_batch = p.shard_batch(batch)
  # A batch placed already stays as it is, in the types as when placed.
  pairs['placed_batch'] = (
    p.shard_batch(placed_batch),
    p.abstract_batch(placed_batch),
  )
  result = {
    name: [[_type(x) for x in jax.tree_util.tree_leaves(tree)] for tree in pair]
    for name, pair in pairs.items()
  }
  print(json.dumps(result))
  return result
