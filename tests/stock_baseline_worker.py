"""Stock trax's memory-efficient Loop on a stand-in accelerator.

Run in a fresh process with two forced CPU devices
(`--xla_force_host_platform_device_count=2`): before trax is imported, the
second CPU device is made the one TPU device `jax.devices('tpu')` answers,
and one device is counted, so stock's one-device step places the step's
weights there (`tl.on_accelerator`) as on a chip, while the Loop's RNG
stays in host memory (`tl.on_cpu`: the first CPU device). Prints one JSON
line: the error of stock as it ships, and whether stock within
`compat.stock_baseline()` ends with the weights of the same run with no
accelerator.
"""

import json

import jax
import numpy as np

_devices = jax.devices
_accelerator = {'on': False}


def _devices_with_a_stand_in(backend=None):
  if backend == 'tpu' and _accelerator['on']:
    return [_devices('cpu')[1]]
  return _devices(backend)


jax.devices = _devices_with_a_stand_in
# Stock's step on one device (trax reads the count through this name).
jax.local_device_count = lambda backend=None: 1  # noqa: E731

# pylint: disable=g-import-not-at-top,wrong-import-position
from trax import layers as tl  # noqa: E402
from trax import optimizers  # noqa: E402
from trax.supervised import training  # noqa: E402

from trax_revplus import compat  # noqa: E402

from conftest import reversible_lm  # noqa: E402

# pylint: enable=g-import-not-at-top,wrong-import-position


def _batches():
  rng = np.random.default_rng(0)
  while True:
    x = rng.integers(1, 9, size=(2, 8)).astype(np.int32)
    yield x, x, np.ones_like(x, dtype=np.float32)


def _weights_after_two_steps():
  """The model's weights after two steps of stock's memory-efficient Loop."""
  model = reversible_lm()
  task = training.TrainTask(
    _batches(), tl.WeightedCategoryCrossEntropy(), optimizers.Adam
  )
  loop = training.Loop(
    model, [task], use_memory_efficient_trainer=True, random_seed=0
  )
  initial = [np.asarray(w) for w in jax.tree_util.tree_leaves(model.weights)]
  loop.run(2)
  final = [np.asarray(w) for w in jax.tree_util.tree_leaves(model.weights)]
  return initial, final


def main():
  _accelerator['on'] = False
  initial, on_the_host = _weights_after_two_steps()
  _accelerator['on'] = True
  try:
    _weights_after_two_steps()
    stock_error = None
  except ValueError as e:
    stock_error = str(e).splitlines()[0]
  with compat.stock_baseline():
    _, on_the_stand_in = _weights_after_two_steps()
  print(
    json.dumps(
      {
        'stock_error': stock_error,
        'same_weights': len(on_the_host) == len(on_the_stand_in)
        and all(
          np.array_equal(a, b) for a, b in zip(on_the_host, on_the_stand_in)
        ),
        'weight_arrays': len(on_the_host),
        'trained': not any(
          np.array_equal(a, b) for a, b in zip(initial, on_the_host)
        ),
      }
    )
  )


if __name__ == '__main__':
  main()
