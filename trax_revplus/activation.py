"""Swap trax's reversible layers and trainer for trax_revplus's, and back.

trax's own modules reach the classes through many names
(`trax.layers.ReversibleSerial`, `trax.layers.reversible.ReversibleSerial`,
`trax.optimizers.ReversibleSerialTrainer`, `optimizers.trainer.
init_reversible_blocks` as called by `training.Loop`, ...). Rather than list
them, `activate()` walks every loaded `trax.*` module and replaces each
attribute that *is* a stock object by its replacement, remembering what it
replaced so that `deactivate()` restores exactly the previous bindings.
Methods of trax's `training.Loop` that ours extend are swapped the same way:
the binding found at `activate()` is remembered and put back.
"""

import sys
import threading

from trax import fastmath as _fastmath
from trax.layers import acceleration as _stock_acceleration
from trax.layers import reversible as _stock_reversible
from trax.optimizers import trainer as _stock_trainer
from trax.supervised import training as _training

_lock = threading.Lock()
# (module, attribute name, stock object) for every binding we replaced.
_replaced = []
_stock_init_trainer = _training.Loop._init_trainer


def _replacements():
  """Maps each stock object (by id) to (stock object, replacement)."""
  # Imported here: these modules import trax_revplus.activation indirectly.
  from trax_revplus import compat  # pylint: disable=g-import-not-at-top
  from trax_revplus import layers  # pylint: disable=g-import-not-at-top
  from trax_revplus import trainer  # pylint: disable=g-import-not-at-top
  pairs = [
      (_stock_reversible.ReversibleHalfResidual, layers.ReversibleHalfResidual),
      (_stock_reversible.ReversibleSerial, layers.ReversibleSerial),
      (_stock_trainer.ReversibleSerialTrainer, trainer.ReversibleSerialTrainer),
      (_stock_trainer.init_reversible_blocks, trainer.init_reversible_blocks),
      # Helpers of trax's Loop that current JAX broke or deprecated.
      (_fastmath.tree_unflatten, compat.tree_unflatten),
      (_stock_acceleration.for_n_devices, compat.for_n_devices),
      (_stock_acceleration._accelerate, compat.accelerate),  # pylint: disable=protected-access
      (_training.init_host_and_devices, compat.init_host_and_devices),
  ]
  return {id(stock): (stock, ours) for stock, ours in pairs}


def _trax_modules():
  return [m for name, m in list(sys.modules.items())
          if m is not None and (name == 'trax' or name.startswith('trax.'))]


def _init_trainer_with_output_dir(loop, task):
  """`training.Loop._init_trainer`, then tells our trainer the Loop's dir.

  The memory log needs `Loop.output_dir` to write `memory.jsonl` and
  TensorBoard scalars; stock `Loop` does not pass it to the trainer.
  """
  trainer = _stock_init_trainer(loop, task)
  set_output_dir = getattr(trainer, 'set_output_dir', None)
  if set_output_dir is not None:
    set_output_dir(loop.output_dir)
  return trainer


def _loop_methods():
  """Maps names of `training.Loop` methods to trax_revplus's versions."""
  from trax_revplus import checkpoints  # pylint: disable=g-import-not-at-top
  return {
      '_init_trainer': _init_trainer_with_output_dir,
      'save_checkpoint': checkpoints.save_checkpoint,
      'load_checkpoint': checkpoints.load_checkpoint,
  }


def activate():
  """Makes trax resolve its reversible classes to trax_revplus's.

  After this call `trax.layers.ReversibleHalfResidual`,
  `trax.layers.ReversibleSerial`, `trax.optimizers.ReversibleSerialTrainer`
  and `trax.optimizers.trainer.init_reversible_blocks` (and every other name
  a loaded trax module binds to them) are the trax_revplus versions, so
  models built afterwards (e.g. `trax.models.ReformerLM`) and
  `training.Loop(use_memory_efficient_trainer=...)` use them. It also
  binds `trax_revplus.compat`'s current-JAX versions of trax's
  `fastmath.tree_unflatten` (checkpoint restore of optimizer slots),
  `layers.for_n_devices` (multi-device replication),
  `training.init_host_and_devices` and `acceleration._accelerate` (no
  deprecated `jax.host_count` or `jit(..., device=...)`), and
  `training.Loop.save_checkpoint` / `load_checkpoint` to
  `trax_revplus.checkpoints`' (checkpoint files written and loaded as a
  consistent set; the Loop's RNG and data position resumed). Layers built
  before the call keep their classes. Calling it twice is harmless.
  """
  with _lock:
    if _replaced:
      return
    table = _replacements()
    for module in _trax_modules():
      for name, value in list(vars(module).items()):
        hit = table.get(id(value))
        if hit is not None and hit[0] is value:
          setattr(module, name, hit[1])
          _replaced.append((module, name, value))
    for name, ours in _loop_methods().items():
      _replaced.append((_training.Loop, name, vars(_training.Loop)[name]))
      setattr(_training.Loop, name, ours)


def deactivate():
  """Restores every binding `activate()` replaced; stock trax again."""
  with _lock:
    while _replaced:
      module, name, stock = _replaced.pop()
      setattr(module, name, stock)


def is_active():
  """Returns True between `activate()` and `deactivate()`."""
  return bool(_replaced)
