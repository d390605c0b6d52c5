"""The private trax names `trax_revplus.trax_door` uses exist in this trax.

Every entry of `registry.PRIVATE_NAMES` and `patches.PATCHES` is checked
against the installed trax: an attribute on a built instance of its owner
(with the value its `check` accepts), a method or function with the
leading parameters we pass. Outside the door, no module of trax_revplus
names one of these private attributes, and no class of trax_revplus that
subclasses a trax class reaches, through `self` or `cls`, a private
attribute one of its trax base classes defines.
"""

import ast
import importlib
import inspect
import os
import re
import textwrap
import tokenize
import types

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
from trax_revplus import interrupt
from trax_revplus import swap
from trax_revplus.multiprocess import ending
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


def _made_classes():
  """The classes of trax_revplus made inside a function (their base comes
  with trax, which their module does not import at its top), by
  qualified name."""
  made = [
    interrupt._callback_class(),  # pylint: disable=protected-access
    ending.stop_together(None),
  ]
  return {f'{c.__module__}.{c.__qualname__}': c for c in made}


def _classes_of(path):
  """(qualified name, ClassDef) of each class in the file, e.g.
  'trax_revplus.interrupt._callback_class.<locals>._StopOnSignalCallback'."""
  module = os.path.relpath(path, os.path.dirname(PACKAGE))[:-3]
  module = module.replace(os.sep, '.').removesuffix('.__init__')
  found = []

  def visit(node, prefix):
    for child in ast.iter_child_nodes(node):
      if isinstance(child, ast.ClassDef):
        found.append((f'{prefix}.{child.name}', child))
        visit(child, f'{prefix}.{child.name}')
      elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
        visit(child, f'{prefix}.{child.name}.<locals>')
      else:
        visit(child, prefix)

  with open(path, encoding='utf-8') as f:
    visit(ast.parse(f.read()), module)
  return found


def _self_private_attributes(class_def):
  """(line number, name) of each `self._name` or `cls._name` in the class's
  own methods (a nested class's are its own)."""
  found = []

  def visit(node):
    for child in ast.iter_child_nodes(node):
      if isinstance(child, ast.ClassDef):
        continue
      if (
        isinstance(child, ast.Attribute)
        and isinstance(child.value, ast.Name)
        and child.value.id in ('self', 'cls')
        and child.attr.startswith('_')
        and not child.attr.startswith('__')
      ):
        found.append((child.lineno, child.attr))
      visit(child)

  visit(class_def)
  return found


def _resolve_class(qualified_name, made):
  """The class object of `qualified_name`: a module's (nested) class, or a
  function-made one of `made`; None where it is neither."""
  if qualified_name in made:
    return made[qualified_name]
  if '<locals>' in qualified_name:
    return None
  parts = qualified_name.split('.')
  for i in range(len(parts) - 1, 0, -1):
    try:
      found = importlib.import_module('.'.join(parts[:i]))
    except ImportError:
      continue
    for name in parts[i:]:
      found = getattr(found, name, None)
    return found if inspect.isclass(found) else None
  return None


def _trax_private_attributes(cls):
  """The private names trax's classes among `cls`'s bases define: their
  class attributes (methods, properties, constants) and the instance
  attributes their methods assign (`self._name = ...`)."""
  names = set()
  for base in cls.__mro__:
    if base.__module__.partition('.')[0] != 'trax':
      continue
    names.update(vars(base))
    try:
      source = textwrap.dedent(inspect.getsource(base))
    except (OSError, TypeError):
      source = ''
    for node in ast.walk(ast.parse(source)):
      if (
        isinstance(node, ast.Attribute)
        and isinstance(node.ctx, ast.Store)
        and isinstance(node.value, ast.Name)
        and node.value.id == 'self'
      ):
        names.add(node.attr)
  return {n for n in names if n.startswith('_') and not n.startswith('__')}


def _subclass_private_access(paths, made):
  """'path:line: Class._name' for each private trax attribute a subclass
  of a trax class reaches through `self` or `cls` in `paths`, and
  'path: name not found' for each class made inside a function whose
  object the test cannot find (add its maker to `_made_classes`)."""
  reached = []
  for path in paths:
    for qualified_name, class_def in _classes_of(path):
      accessed = _self_private_attributes(class_def)
      if not accessed or not class_def.bases:
        continue
      where = os.path.relpath(path, PACKAGE)
      cls = _resolve_class(qualified_name, made)
      if cls is None:
        reached.append(f'{where}: {qualified_name} not found')
        continue
      trax_names = _trax_private_attributes(cls)
      reached += [
        f'{where}:{number}: {class_def.name}.{name}'
        for number, name in accessed
        if name in trax_names
      ]
  return reached


def test_no_subclass_outside_the_door_reaches_a_private_trax_name():
  """A class of ours that subclasses a trax class reads or sets none of
  the private attributes its trax base classes define through `self`:
  it uses trax's public API (constructor arguments, properties) or a door
  function (`registry.uses`)."""
  paths = [
    path
    for path in _python_files(PACKAGE)
    if not path.startswith(DOOR + os.sep)
  ]
  reached = _subclass_private_access(paths, _made_classes())
  assert not reached, '\n'.join(reached)


def test_the_subclass_check_sees_what_it_checks(tmp_path):
  """A trax subclass setting `self._n_in` is found; its own private
  attribute, and a class that subclasses no trax class, are not."""
  path = tmp_path / 'layer_module.py'
  path.write_text(
    'from trax.layers import base\n'
    'class Mine(base.Layer):\n'
    '  def __init__(self):\n'
    '    super().__init__()\n'
    '    self._n_in = 2\n'
    '    self._mine = 1\n'
    'class Other(dict):\n'
    '  def f(self):\n'
    '    return self._n_in\n'
  )
  module = types.ModuleType('layer_module')
  exec(compile(path.read_text(), str(path), 'exec'), module.__dict__)  # pylint: disable=exec-used
  made = {'Mine': module.Mine, 'Other': module.Other}
  assert _trax_private_attributes(module.Other) == set()
  assert {'_n_in', '_n_out', '_sublayers'} <= _trax_private_attributes(
    tl.Serial
  )
  found = []
  for _, class_def in _classes_of(str(path)):
    trax_names = _trax_private_attributes(made[class_def.name])
    found += [
      (number, attr)
      for number, attr in _self_private_attributes(class_def)
      if attr in trax_names
    ]
  assert found == [(5, '_n_in')]
