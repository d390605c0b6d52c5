"""The one-line switch: `import trax_revplus.activate` in gin, and back."""

import importlib
import sys

import gin
import pytest
import trax
from trax import layers as tl
from trax import models
from trax import fastmath
from trax.layers import acceleration as stock_acceleration
from trax.layers import reversible as stock_reversible
from trax.optimizers import trainer as stock_trainer
from trax.supervised import training

import trax_revplus
from trax_revplus import compat
from trax_revplus import layers as revplus_layers
from trax_revplus import swap
from trax_revplus import trainer as revplus_trainer

STOCK_TO_OURS = {
  stock_reversible.ReversibleHalfResidual: (
    revplus_layers.ReversibleHalfResidual
  ),
  stock_reversible.ReversibleSerial: revplus_layers.ReversibleSerial,
  stock_trainer.ReversibleSerialTrainer: (
    revplus_trainer.ReversibleSerialTrainer
  ),
  stock_trainer.init_reversible_blocks: revplus_trainer.init_reversible_blocks,
  fastmath.tree_unflatten: compat.tree_unflatten,
  stock_acceleration.for_n_devices: compat.for_n_devices,
  stock_acceleration._accelerate: compat.accelerate,  # pylint: disable=protected-access
  training.init_host_and_devices: compat.init_host_and_devices,
}
# training.Loop methods trax_revplus extends.
LOOP_METHODS = (
  '__init__',
  '_init_trainer',
  '_init_evaluator',
  'save_checkpoint',
  'load_checkpoint',
)


def _bindings_to(objects):
  """Every (module, name) of a loaded trax module bound to one of objects."""
  ids = {id(o) for o in objects}
  found = {}
  for module_name, module in list(sys.modules.items()):
    if module is None or not (
      module_name == 'trax' or module_name.startswith('trax.')
    ):
      continue
    for name, value in list(vars(module).items()):
      if id(value) in ids:
        found[(module_name, name)] = value
  return found


def _parse_activation_line():
  """Parses the gin one-liner as a fresh process would."""
  sys.modules.pop('trax_revplus.activate', None)
  gin.parse_config('import trax_revplus.activate')


pytestmark = pytest.mark.usefixtures('stock_trax_and_empty_gin')


def test_gin_line_swaps_all_classes_and_deactivate_restores_them():
  stock_bindings = _bindings_to(STOCK_TO_OURS)
  # The names the issue and trax's own modules use must all be among them.
  for name in [
    ('trax.layers', 'ReversibleHalfResidual'),
    ('trax.layers', 'ReversibleSerial'),
    ('trax.layers.reversible', 'ReversibleSerial'),
    ('trax.optimizers', 'ReversibleSerialTrainer'),
    ('trax.optimizers.trainer', 'ReversibleSerialTrainer'),
    ('trax.optimizers.trainer', 'init_reversible_blocks'),
    ('trax.fastmath', 'tree_unflatten'),
    ('trax.fastmath.numpy', 'tree_unflatten'),
    ('trax.layers', 'for_n_devices'),
    ('trax.layers.acceleration', '_accelerate'),
    ('trax.supervised.training', 'init_host_and_devices'),
  ]:
    assert name in stock_bindings
  assert not trax_revplus.is_active()
  stock_methods = {name: vars(training.Loop)[name] for name in LOOP_METHODS}

  _parse_activation_line()

  assert trax_revplus.is_active()
  assert tl.ReversibleHalfResidual is revplus_layers.ReversibleHalfResidual
  assert tl.ReversibleSerial is revplus_layers.ReversibleSerial
  assert (
    trax.optimizers.ReversibleSerialTrainer
    is revplus_trainer.ReversibleSerialTrainer
  )
  # What training.Loop._init_trainer reaches through `optimizers.`.
  assert (
    training.optimizers.ReversibleSerialTrainer
    is revplus_trainer.ReversibleSerialTrainer
  )
  assert (
    training.optimizers.trainer.init_reversible_blocks
    is revplus_trainer.init_reversible_blocks
  )
  for (module_name, name), stock in stock_bindings.items():
    assert getattr(sys.modules[module_name], name) is STOCK_TO_OURS[stock], (
      module_name,
      name,
    )
  for name, stock in stock_methods.items():
    assert vars(training.Loop)[name] is not stock, name

  trax_revplus.deactivate()

  assert not trax_revplus.is_active()
  for name, stock in stock_methods.items():
    assert vars(training.Loop)[name] is stock, name
  assert _bindings_to(STOCK_TO_OURS) == stock_bindings
  for (module_name, name), stock in stock_bindings.items():
    assert getattr(sys.modules[module_name], name) is stock
  assert not _bindings_to(set(STOCK_TO_OURS.values()))


def test_python_api_still_callable_after_the_gin_import():
  _parse_activation_line()
  trax_revplus.deactivate()
  # The import bound the submodule `trax_revplus.activate` on the package.
  trax_revplus.activate()
  assert trax_revplus.is_active()
  assert tl.ReversibleSerial is revplus_layers.ReversibleSerial
  trax_revplus.deactivate()
  assert tl.ReversibleSerial is stock_reversible.ReversibleSerial


def test_gin_line_activates_again_after_deactivate():
  _parse_activation_line()
  trax_revplus.deactivate()
  gin.clear_config()
  # As a config parsed again in the same process: the module was imported.
  gin.parse_config('import trax_revplus.activate')
  assert trax_revplus.is_active()
  assert tl.ReversibleSerial is revplus_layers.ReversibleSerial
  trax_revplus.deactivate()
  importlib.import_module('trax_revplus.activate')  # `import` in Python.
  assert trax_revplus.is_active()


def test_python_api_bound_before_the_gin_import_still_activates():
  sys.modules.pop('trax_revplus.activate', None)
  vars(trax_revplus).pop('activate', None)
  from trax_revplus import activate  # pylint: disable=g-import-not-at-top

  assert activate is swap.activate
  _parse_activation_line()
  # The package's name is now the module; the function bound before works.
  assert trax_revplus.activate is sys.modules['trax_revplus.activate']
  trax_revplus.deactivate()
  activate()
  assert tl.ReversibleSerial is revplus_layers.ReversibleSerial
  trax_revplus.deactivate()
  trax_revplus.activate()
  assert tl.ReversibleSerial is revplus_layers.ReversibleSerial


def _reversible_layer_types(layer):
  found = []

  def walk(l):
    if isinstance(
      l,
      (
        stock_reversible.ReversibleSerial,
        stock_reversible.ReversibleHalfResidual,
      ),
    ):
      found.append(type(l))
    for sub in l.sublayers:
      walk(sub)

  walk(layer)
  return found


_TINY_REFORMER = [
  'ReformerLM.vocab_size = 32',
  'ReformerLM.d_model = 8',
  'ReformerLM.d_ff = 16',
  'ReformerLM.d_attention_key = 4',
  'ReformerLM.d_attention_value = 4',
  'ReformerLM.n_heads = 2',
  'ReformerLM.n_layers = 2',
  'ReformerLM.max_len = 16',
  'ReformerLM.attention_type = @trax.layers.SelfAttention',
]


def test_reformer_built_from_gin_uses_our_layers_only_when_active():
  gin.parse_config(_TINY_REFORMER)
  stock_types = _reversible_layer_types(models.ReformerLM(mode='train'))
  assert set(stock_types) == {
    stock_reversible.ReversibleSerial,
    stock_reversible.ReversibleHalfResidual,
  }

  _parse_activation_line()
  gin.parse_config(_TINY_REFORMER)
  ours = _reversible_layer_types(models.ReformerLM(mode='train'))
  assert len(ours) == len(stock_types)
  assert set(ours) == {
    revplus_layers.ReversibleSerial,
    revplus_layers.ReversibleHalfResidual,
  }
