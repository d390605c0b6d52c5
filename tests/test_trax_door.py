"""The private trax names `trax_revplus.trax_door` uses exist in this trax.

Every entry of `registry.PRIVATE_NAMES` and `patches.PATCHES` is checked
against the installed trax: an attribute on a built instance of its owner
(with the value its `check` accepts), a method or function with the
leading parameters we pass. Outside the door, no module of trax_revplus
names one of these private attributes.
"""

import importlib
import inspect
import os
import re
import tokenize

import numpy as np
import pytest
from trax import layers as tl
from trax import optimizers
from trax import shapes
from trax.layers.research import efficient_attention
from trax.layers.research import position_encodings
from trax.optimizers import trainer as stock_trainer_lib
from trax.supervised import training

import trax_revplus
from trax_revplus import swap
from trax_revplus.trax_door import functions
from trax_revplus.trax_door import layers
from trax_revplus.trax_door import loop
from trax_revplus.trax_door import patches
from trax_revplus.trax_door import registry
from trax_revplus.trax_door import trainers

PACKAGE = os.path.dirname(trax_revplus.__file__)
DOOR = os.path.join(PACKAGE, 'trax_door')
DOOR_MODULES = (functions, layers, loop, patches, trainers)
NAMES = {p.name for p in registry.PRIVATE_NAMES}


def _resolve(dotted):
  """The module or class named by a dotted path."""
  try:
    return importlib.import_module(dotted)
  except ImportError:
    module, _, name = dotted.rpartition('.')
    return getattr(importlib.import_module(module), name)


def _batch():
  x = np.arange(8).reshape((2, 4)) % 9
  return (x, x, np.ones_like(x, dtype=np.float32))


def _built_loop(tmp_path):
  """A stock-mode Loop (trax's default `Trainer`) with an eval task."""

  def stream():
    while True:
      yield _batch()

  model = tl.Serial(tl.Embedding(9, 4), tl.Dense(9), tl.LogSoftmax())
  task = training.TrainTask(stream(), tl.CrossEntropyLoss(), optimizers.Adam())
  eval_task = training.EvalTask(stream(), [tl.CrossEntropyLoss()])
  return training.Loop(
    model,
    [task],
    eval_tasks=[eval_task],
    output_dir=str(tmp_path),
    random_seed=0,
  )


def _stock_reversible_trainer():
  """Stock `ReversibleSerialTrainer` on a tiny model, built."""
  first = tl.Serial(tl.Embedding(9, 4), tl.Dup())
  reversible = [tl.ReversibleHalfResidual(tl.Dense(4)), tl.ReversibleSwap()]
  loss = tl.Serial(
    tl.Concatenate(), tl.Dense(9), tl.LogSoftmax(), tl.CrossEntropyLoss()
  )
  blocks = [(first.sublayers, reversible)]
  stock_trainer_lib.init_reversible_blocks(
    blocks, loss, shapes.signature(_batch()), np.zeros((2,), dtype=np.uint32)
  )
  return stock_trainer_lib.ReversibleSerialTrainer(
    blocks, loss, optimizers.Adam, n_devices=1
  )


def _initialized(layer, x):
  layer.init(shapes.signature(x))
  return layer


@pytest.fixture(name='instances', scope='module')
def fixture_instances(tmp_path_factory):
  """A built instance of each owner class of an ATTRIBUTE entry."""
  trax_revplus.deactivate()
  stock = _stock_reversible_trainer()
  trax_revplus.activate()
  try:
    built = _built_loop(tmp_path_factory.mktemp('loop'))
  finally:
    trax_revplus.deactivate()
  x = np.ones((2, 16, 8), dtype=np.float32)
  return {
    loop.LOOP: built,
    trainers.TRAINER: loop.trainers(built)[0],
    trainers.STOCK: stock,
    layers.LAYER: _initialized(tl.Dense(4), x),
    layers.SELECT: tl.ReversibleSwap(),
    layers.DROPOUT: tl.Dropout(0.5, shared_axes=[1]),
    layers.SELF_ATTENTION: efficient_attention.SelfAttention(
      n_heads=2, d_qk=4, d_v=4
    ),
    layers.LSH_SELF_ATTENTION: efficient_attention.LSHSelfAttention(
      n_heads=2, d_qk=4, d_v=4, chunk_len=4, n_buckets=4
    ),
    layers.POSITIONAL_ENCODING: tl.PositionalEncoding(max_len=16),
    layers.AXIAL_POSITIONAL_ENCODING: (
      position_encodings.AxialPositionalEncoding(shape=(4, 4), d_embs=(4, 4))
    ),
  }


def _leading_parameters(fn, skip_self):
  params = list(inspect.signature(fn).parameters)
  return tuple(params[1:] if skip_self else params)


def _entry_id(entry):
  return f'{entry.owner}.{entry.name}'


@pytest.mark.parametrize('entry', registry.PRIVATE_NAMES, ids=_entry_id)
def test_each_private_name_exists_as_relied_on(entry, instances):
  assert entry.relied_on, f'{_entry_id(entry)}: say what we rely on'
  if entry.kind == registry.ATTRIBUTE:
    assert entry.owner in instances, (
      f'no built {entry.owner} to check {entry.name} on: add one to '
      f'fixture_instances'
    )
    instance = instances[entry.owner]
    assert isinstance(instance, _resolve(entry.owner))
    assert entry.name in vars(instance), (
      f'{entry.owner} instances no longer have {entry.name}'
    )
    if entry.check is not None:
      value = vars(instance)[entry.name]
      assert entry.check(value), f'{_entry_id(entry)} = {value!r}'
    return
  owner = _resolve(entry.owner)
  assert hasattr(owner, entry.name), f'{_entry_id(entry)} is gone'
  target = getattr(owner, entry.name)
  if entry.kind == registry.CLASS:
    assert inspect.isclass(target)
  else:
    assert callable(target)
  n = len(entry.parameters)
  found = _leading_parameters(target, skip_self=entry.kind == registry.METHOD)
  assert found[:n] == entry.parameters, (_entry_id(entry), found)


@pytest.mark.parametrize(
  'patch', patches.PATCHES, ids=lambda p: f'{p.owner}.{p.name}@{p.by}'
)
def test_each_patched_attribute_exists_with_its_parameters(patch):
  owner = _resolve(patch.owner)
  assert patch.name in vars(owner) or any(
    patch.name in vars(base) for base in owner.__mro__
  ), f'{patch.owner}.{patch.name} is gone'
  target = getattr(owner, patch.name)
  n = len(patch.parameters)
  found = _leading_parameters(target, skip_self=True)
  assert found[:n] == patch.parameters, (patch, found)
  assert patch.why and importlib.import_module(patch.by)


def test_every_loop_method_swap_binds_is_listed():
  listed = {
    p.name
    for p in patches.PATCHES
    if p.by == 'trax_revplus.swap'
    and p.owner == loop.LOOP
    and p.scope == patches.CLASS_SCOPE
  }
  assert set(swap._loop_methods()) == listed  # pylint: disable=protected-access


def test_every_door_function_declares_its_trax_names():
  declared = {(p.owner, p.name) for p in registry.PRIVATE_NAMES}
  for module in DOOR_MODULES:
    for name, fn in vars(module).items():
      if (
        inspect.isfunction(fn)
        and fn.__module__ == module.__name__
        and not name.startswith('_')
      ):
        assert getattr(fn, 'trax_names', ()), (
          f'{module.__name__}.{name} declares no trax name (`uses`)'
        )
        assert set(fn.trax_names) <= declared


def _private_names_in(path):
  """(line number, name) of each private attribute `x._name` (x not self
  or cls) and each '_name' string in the file's code."""
  found = []
  with tokenize.open(path) as f:
    tokens = [
      t
      for t in tokenize.generate_tokens(f.readline)
      if t.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT)
    ]
  for before, dot, token in zip(tokens, tokens[1:], tokens[2:]):
    if (
      token.type == tokenize.NAME
      and token.string.startswith('_')
      and not token.string.startswith('__')
      and dot.string == '.'
      and before.string not in ('self', 'cls')
    ):
      found.append((token.start[0], token.string))
  for token in tokens:
    if token.type == tokenize.STRING and re.fullmatch(
      r"'_[A-Za-z]\w*'", token.string
    ):
      found.append((token.start[0], token.string.strip("'")))
  return found


def _python_files(top):
  for root, _, files in os.walk(top):
    for name in sorted(files):
      if name.endswith('.py'):
        yield os.path.join(root, name)


def test_every_private_name_the_door_uses_is_listed():
  used = {
    name for path in _python_files(DOOR) for _, name in _private_names_in(path)
  }
  own = {
    '_is_int',
    '_is_list',
    '_is_bool',
    '_INIT',
    '_N_HEADS',
    '_INCREMENTAL',
  }  # the door's own helpers
  assert used - own <= NAMES, used - own - NAMES


def test_no_module_outside_the_door_reaches_a_door_name():
  """Outside the door: no `x._name` or `getattr(x, '_name')` of a name the
  door lists (strings only where getattr, hasattr, setattr or delattr take
  them), and no protected-access pragma on a line naming one."""
  reached = []
  for path in _python_files(PACKAGE):
    if path.startswith(DOOR + os.sep):
      continue
    with open(path, encoding='utf-8') as f:
      lines = f.read().splitlines()
    for number, name in _private_names_in(path):
      line = lines[number - 1]
      attribute = re.search(r'\w\.' + name + r'\b', line)
      by_name = re.search(r'(get|has|set|del)attr\([^)]*\'' + name + "'", line)
      if name in NAMES and (attribute or by_name):
        reached.append(f'{os.path.relpath(path, PACKAGE)}:{number}: {line}')
    for number, line in enumerate(lines, 1):
      if 'protected-access' in line and any(
        re.search(r'\._?' + re.escape(n.lstrip('_')) + r'\b', line)
        and n in line
        for n in NAMES
      ):
        reached.append(f'{os.path.relpath(path, PACKAGE)}:{number}: {line}')
  assert not reached, '\n'.join(reached)
