"""trax_revplus's packages import in one direction.

Inside `trainer/`, each sub-package is a layer that imports only its own
modules and those of the layers below it (`TRAINER_LAYERS`, lowest first;
docs/architecture.md, "The trainer's layers"). Across the package, no two
packages import each other, directly or through others: a package is a
first-level folder or top-level module of `trax_revplus`, and inside
`trainer/`, each of its layers.

Every import counts: at a module's top, inside a function, under
`typing.TYPE_CHECKING`, relative, and `trax_import.module(...)` or
`importlib.import_module(...)` with a module of ours as its constant
argument.
"""

import ast
import os

import trax_revplus

_PACKAGE = os.path.dirname(os.path.abspath(trax_revplus.__file__))
_ROOT = 'trax_revplus'
_TRAINER = f'{_ROOT}.trainer'

# trainer/'s layers, lowest first; '' is trainer/'s own modules, its top.
TRAINER_LAYERS = (
  '_plan',  # what a step is to do: `StepPlan`, its dimensions, the options
  '_step',  # how a step runs: its programs, its walk, the host store
  '_accounting',  # the walk on types: a step's memory, accounted ahead
  '_search',  # the plan a budget chooses: candidates, bounds, the planner
  '',  # the trainer: its surface, inquiries, initializer and errors
)


def _modules():
  """{dotted module name: (its path, its source)} of every module of the
  package."""
  modules = {}
  for directory, subdirectories, files in os.walk(_PACKAGE):
    subdirectories[:] = [d for d in subdirectories if d != '__pycache__']
    for name in files:
      if not name.endswith('.py'):
        continue
      path = os.path.join(directory, name)
      parts = os.path.relpath(path, _PACKAGE)[: -len('.py')].split(os.sep)
      if parts[-1] == '__init__':
        parts = parts[:-1]
      with open(path, encoding='utf-8') as f:
        modules['.'.join([_ROOT] + parts)] = (path, f.read())
  return modules


def _imports_of(module, is_package, source, known):
  """{module of ours that `source` imports: its first line}. `from a import
  b` imports a.b where that is a module of `known`, else a; a name that is
  no module counts as the module it is in."""
  names = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      names += [(alias.name, node.lineno) for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ''
      if node.level:
        parts = module.split('.')
        # A package's level 1 is itself; a module's is its package.
        keep = len(parts) - node.level + (1 if is_package else 0)
        base = '.'.join(parts[:keep] + ([base] if base else []))
      for alias in node.names:
        full = f'{base}.{alias.name}'
        names.append((full if full in known else base, node.lineno))
    elif (
      isinstance(node, ast.Call)
      and isinstance(node.func, ast.Attribute)
      and node.func.attr in ('module', 'import_module')
      and node.args
      and isinstance(node.args[0], ast.Constant)
      and isinstance(node.args[0].value, str)
    ):
      names.append((node.args[0].value, node.lineno))
  found = {}
  for name, line in sorted(names, key=lambda n: n[1]):
    while name and name not in known:
      name = name.rpartition('.')[0]
    if name and name != module:
      found.setdefault(name, line)
  return found


def _imports(modules):
  """{module: {module of ours it imports: first line}}."""
  return {
    module: _imports_of(module, path.endswith('__init__.py'), source, modules)
    for module, (path, source) in modules.items()
  }


def _trainer_layer(module):
  """The layer of a module under trainer/ (see `TRAINER_LAYERS`), or None
  for a module outside it."""
  if module != _TRAINER and not module.startswith(_TRAINER + '.'):
    return None
  rest = module[len(_TRAINER) + 1 :].split('.')
  return rest[0] if len(rest) > 1 or rest[0].startswith('_') else ''


def _package(module):
  """The package a module belongs to for the cycle check: trax_revplus's
  first-level folder or module, and trainer/'s layer."""
  if module == _ROOT:
    return '__init__'
  first = module.split('.')[1]
  layer = _trainer_layer(module)
  return f'{first}/{layer}' if layer else first


def _path(module, modules):
  return os.path.relpath(modules[module][0], os.path.dirname(_PACKAGE))


def test_the_reader_finds_every_kind_of_import():
  source = '\n'.join(
    [
      'import typing',
      'from trax_revplus import errors',
      'from . import units',
      'from .step_run import StepRun',
      'if typing.TYPE_CHECKING:',
      '  from trax_revplus.trainer._accounting import on_types',
      'def f():',
      '  import trax_revplus.memory.log',
      "  return trax_import.module('trax_revplus.placement')",
    ]
  )
  modules = _modules()
  module = f'{_TRAINER}._step.slices'
  assert module in modules
  assert set(_imports_of(module, False, source, modules)) == {
    f'{_ROOT}.errors',
    f'{_TRAINER}._step.units',
    f'{_TRAINER}._step.step_run',
    f'{_TRAINER}._accounting.on_types',
    f'{_ROOT}.memory.log',
    f'{_ROOT}.placement',
  }


def test_every_trainer_package_is_a_layer():
  modules = _modules()
  assert len(modules) > 100  # The walk found the package.
  unknown = sorted(
    {_trainer_layer(m) for m in modules} - set(TRAINER_LAYERS) - {None}
  )
  assert not unknown, (
    f'trainer/ sub-packages in no layer: {unknown}; add each to '
    f'TRAINER_LAYERS in its place (and docs/architecture.md)'
  )


def test_trainer_layers_import_only_those_below():
  modules = _modules()
  order = {layer: i for i, layer in enumerate(TRAINER_LAYERS)}
  upward = []
  for module, imported in sorted(_imports(modules).items()):
    layer = _trainer_layer(module)
    if layer not in order:
      continue
    for name, line in sorted(imported.items()):
      other = _trainer_layer(name)
      if other in order and order[other] > order[layer]:
        upward.append(
          f'{_path(module, modules)}:{line} (layer {layer or "trainer"}) '
          f'imports {name} (layer {other or "trainer"}, above it)'
        )
  assert not upward, (
    "imports upward in trainer/'s layers (lowest first: "
    f'{", ".join(layer or "trainer" for layer in TRAINER_LAYERS)}); move '
    'the module, or what it imports, to the layer its idea belongs to:\n'
    + '\n'.join(upward)
  )


def _cycles(edges):
  """The strongly connected sets of more than one package (Tarjan's)."""
  index, low, stack, on_stack, found = {}, {}, [], set(), []
  nodes = sorted({a for a, _ in edges} | {b for _, b in edges})
  successors = {n: sorted(b for a, b in edges if a == n) for n in nodes}

  def visit(node):
    index[node] = low[node] = len(index)
    stack.append(node)
    on_stack.add(node)
    for other in successors[node]:
      if other not in index:
        visit(other)
        low[node] = min(low[node], low[other])
      elif other in on_stack:
        low[node] = min(low[node], index[other])
    if low[node] == index[node]:
      members = []
      while True:
        member = stack.pop()
        on_stack.discard(member)
        members.append(member)
        if member == node:
          break
      if len(members) > 1:
        found.append(sorted(members))

  for node in nodes:
    if node not in index:
      visit(node)
  return found


def test_no_cycle_between_packages():
  modules = _modules()
  edges = {}
  for module, imported in _imports(modules).items():
    for name in imported:
      a, b = _package(module), _package(name)
      if a != b:
        edges.setdefault((a, b), []).append((module, name))
  assert ('cli', 'multiprocess') in edges  # The reader found imports.
  problems = []
  for members in _cycles(edges):
    problems.append(f'packages {members} import each other:')
    for (a, b), pairs in sorted(edges.items()):
      if a in members and b in members:
        module, name = sorted(pairs)[0]
        problems.append(
          f'  {a} -> {b}: {_path(module, modules)} imports {name}'
          + (f' (and {len(pairs) - 1} more)' if len(pairs) > 1 else '')
        )
  assert not problems, '\n'.join(problems)
