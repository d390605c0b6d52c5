"""Function-level imports: trax and JAX only through `trax_import` (JAX as
its typed attributes, `trax_import.jax`; trax through `module`), anything
else only with a comment saying why it is not at the top.

Processes that must not import JAX (`import trax_revplus`, the
`trax-revplus` command before its command runs, the parents of `compare`
and `launch`) import modules that use trax or JAX later; where those
imports happen is kept to one place (trax_revplus/trax_import.py) so that
it can be seen, and JAX's uses there are type checked (mypy reads
`trax_import.jax` as the module).
"""

import ast
import io
import os
import re
import tokenize

import trax_revplus

_PACKAGE = os.path.dirname(os.path.abspath(trax_revplus.__file__))
# The one module that imports trax and JAX inside its functions.
_LAZY_HOME = 'trax_import.py'
_LAZY_PACKAGES = ('jax', 'jaxlib', 'trax')
# Directives, which do not say why: pylint's, ruff's and mypy's.
_DIRECTIVE = re.compile(
  r'pylint:\s*(disable|enable)(-next)?=[\w,-]+|'
  r'noqa(:\s*[A-Z]+\d+(,\s*[A-Z]+\d+)*)?|'
  r'type:\s*ignore(\[[\w,-]+\])?'
)


def _sources():
  for directory, subdirectories, files in os.walk(_PACKAGE):
    subdirectories[:] = [d for d in subdirectories if d != '__pycache__']
    for name in files:
      if name.endswith('.py'):
        path = os.path.join(directory, name)
        with open(path, encoding='utf-8') as f:
          yield os.path.relpath(path, _PACKAGE).replace(os.sep, '/'), f.read()


def _function_level_imports(tree):
  """The Import and ImportFrom nodes inside any function of `tree`."""
  found = []

  def visit(node, in_function):
    for child in ast.iter_child_nodes(node):
      if isinstance(child, (ast.Import, ast.ImportFrom)) and in_function:
        found.append(child)
      visit(
        child,
        in_function
        or isinstance(
          child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
        ),
      )

  visit(tree, False)
  return found


def _imported(node):
  """The absolute names of the modules an import statement names."""
  if isinstance(node, ast.Import):
    return [alias.name for alias in node.names]
  return [node.module or ''] if node.level == 0 else []


def _is_lazy_package(name):
  return name.partition('.')[0] in _LAZY_PACKAGES


def _comments(source):
  """Comment text by line number, directives removed."""
  comments = {}
  for token in tokenize.generate_tokens(io.StringIO(source).readline):
    if token.type == tokenize.COMMENT:
      parts = [
        _DIRECTIVE.sub('', part).strip(' ,') for part in token.string.split('#')
      ]
      comments[token.start[0]] = ' '.join(p for p in parts if p)
  return comments


def _has_reason(node, lines, comments):
  """A comment on the import's lines, or above it: directly, or above the
  imports and directive-only comments it follows."""
  if any(comments.get(n) for n in range(node.lineno, node.end_lineno + 1)):
    return True
  number = node.lineno - 1
  while number >= 1:
    text = lines[number - 1].strip()
    if comments.get(number) and text.startswith('#'):
      return True
    if not (text.startswith(('#', 'import ', 'from ')) or text.startswith(')')):
      return False
    number -= 1
  return False


def _import_module_calls(tree):
  """`importlib.import_module('<trax or JAX module>')` calls."""
  return [
    node
    for node in ast.walk(tree)
    if isinstance(node, ast.Call)
    and ast.unparse(node.func).endswith('import_module')
    and node.args
    and isinstance(node.args[0], ast.Constant)
    and isinstance(node.args[0].value, str)
    and _is_lazy_package(node.args[0].value)
  ]


def _untyped_jax_reads(tree):
  """`trax_import.module('<JAX module>')` calls, which mypy reads as
  untyped, and `from trax_revplus.trax_import import <attribute>`, which
  imports JAX when the module is."""
  found = [
    node
    for node in ast.walk(tree)
    if isinstance(node, ast.Call)
    and ast.unparse(node.func).endswith('trax_import.module')
    and node.args
    and isinstance(node.args[0], ast.Constant)
    and isinstance(node.args[0].value, str)
    and node.args[0].value.partition('.')[0] in ('jax', 'jaxlib')
  ]
  found += [
    node
    for node in ast.walk(tree)
    if isinstance(node, ast.ImportFrom)
    and node.module == 'trax_revplus.trax_import'
  ]
  return found


def test_jax_is_read_through_typed_attributes():
  untyped = []
  for path, source in _sources():
    if path == _LAZY_HOME:
      continue
    untyped += [
      f'{path}:{node.lineno}' for node in _untyped_jax_reads(ast.parse(source))
    ]
  assert not untyped, (
    f'JAX read without its types at {untyped}: read it as '
    f'`trax_import.jax` (or another of `trax_import._LAZY_JAX`, adding the '
    f'module there) inside the function'
  )


def test_trax_and_jax_are_imported_lazily_in_one_place():
  misplaced = []
  for path, source in _sources():
    if path == _LAZY_HOME:
      continue
    tree = ast.parse(source)
    for node in _function_level_imports(tree) + _import_module_calls(tree):
      names = (
        _imported(node)
        if not isinstance(node, ast.Call)
        else [node.args[0].value]
      )
      if any(_is_lazy_package(name) for name in names):
        misplaced.append(f'{path}:{node.lineno}')
  assert len(list(_sources())) > 100  # The walk found the package.
  assert not misplaced, (
    f'trax or JAX imported inside a function at {misplaced}: import it at '
    f"the module's top, or, where the module must stay free of them, "
    f'read JAX as trax_revplus.trax_import.jax (or another of its typed '
    f"attributes) and trax through trax_import.module('trax...')"
  )


def test_every_other_function_level_import_says_why():
  unexplained = []
  for path, source in _sources():
    tree = ast.parse(source)
    lines = source.splitlines()
    comments = _comments(source)
    for node in _function_level_imports(tree):
      if not _has_reason(node, lines, comments):
        unexplained.append(f'{path}:{node.lineno}')
  assert not unexplained, (
    f'function-level imports without a comment saying why: {unexplained}: '
    f"move each to the module's top, or say why it must wait (a cycle, "
    f'a heavy import a light process must not pay for)'
  )


def test_the_checks_see_what_they_check():
  source = (
    'def f():\n'
    '  import jax  # pylint: disable=g-import-not-at-top\n'
    '  # Heavy: the command answers --help before it.\n'
    '  import gin  # pylint: disable=g-import-not-at-top\n'
    '  import numpy  # noqa: F401\n'
    '  return importlib.import_module("trax.layers")\n'
  )
  tree = ast.parse(source)
  nodes = _function_level_imports(tree)
  assert [_imported(n) for n in nodes] == [['jax'], ['gin'], ['numpy']]
  reasons = [
    _has_reason(n, source.splitlines(), _comments(source)) for n in nodes
  ]
  assert reasons == [False, True, True]  # numpy: the block's comment.
  assert len(_import_module_calls(tree)) == 1
  untyped = ast.parse(
    'from trax_revplus.trax_import import jax\n'
    'def f():\n'
    "  trax_import.module('jax.sharding')\n"
    "  trax_import.module('trax.layers')\n"
    '  return trax_import.jax\n'
  )
  assert sorted(n.lineno for n in _untyped_jax_reads(untyped)) == [1, 3]
