"""How many public functions leave parameters unannotated, per directory.

`python tools/annotations.py [DIR ...]` (default `trax_revplus/trainer`)
prints, for each DIR, the public functions and methods (names without a
leading underscore, and `__init__`) of its modules, and how many have a
parameter without an annotation (`self` and `cls` excepted) or no return
annotation. Read from the source with `ast`; nothing is imported.

`--recursive` takes each DIR's subdirectories too. `--check` prints one
line per function not fully annotated instead, and exits 1 where there is
one (CI runs `--check --recursive trax_revplus`).
"""

import argparse
import ast
import os
import sys
from typing import Iterator, NamedTuple


class Function(NamedTuple):
  path: str
  line: int
  name: str
  unannotated_parameters: tuple[str, ...]
  return_annotated: bool


def _parameters(
  node: ast.FunctionDef | ast.AsyncFunctionDef, is_method: bool
) -> list[ast.arg]:
  args = node.args
  positional = args.posonlyargs + args.args
  if is_method and positional and positional[0].arg in ('self', 'cls'):
    positional = positional[1:]
  extra = [a for a in (args.vararg, args.kwarg) if a is not None]
  return positional + args.kwonlyargs + extra


def _is_public(name: str) -> bool:
  return not name.startswith('_') or name == '__init__'


def functions(path: str) -> Iterator[Function]:
  """The public functions of module `path`: top level, and methods of its
  public top-level classes."""
  with open(path, encoding='utf-8') as f:
    tree = ast.parse(f.read(), path)
  def_types = (ast.FunctionDef, ast.AsyncFunctionDef)
  found = [(node, False) for node in tree.body if isinstance(node, def_types)]
  for cls in tree.body:
    if isinstance(cls, ast.ClassDef) and _is_public(cls.name):
      found += [
        (node, True) for node in cls.body if isinstance(node, def_types)
      ]
  for node, is_method in found:
    if not _is_public(node.name):
      continue
    missing = tuple(
      a.arg for a in _parameters(node, is_method) if a.annotation is None
    )
    returns = node.returns is not None or node.name == '__init__'
    yield Function(path, node.lineno, node.name, missing, returns)


def modules(directory: str) -> list[str]:
  return sorted(
    os.path.join(directory, name)
    for name in os.listdir(directory)
    if name.endswith('.py')
  )


def subdirectories(directory: str) -> list[str]:
  """`directory` and every directory below it holding a module, in order
  (caches excepted)."""
  return sorted(
    root
    for root, dirs, files in os.walk(directory)
    if os.path.basename(root) != '__pycache__'
    and any(name.endswith('.py') for name in files)
  )


def gap(f: Function) -> str:
  """'path:line name: what is missing', for a function not fully
  annotated."""
  missing = [f'parameter {name}' for name in f.unannotated_parameters]
  if not f.return_annotated:
    missing.append('return')
  return f'{f.path}:{f.line} {f.name}: no annotation of {", ".join(missing)}'


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('dirs', nargs='*', default=['trax_revplus/trainer'])
  parser.add_argument(
    '--list', action='store_true', help='also list each function with a gap'
  )
  parser.add_argument(
    '--recursive', action='store_true', help="also each DIR's subdirectories"
  )
  parser.add_argument(
    '--check',
    action='store_true',
    help='one line per public function not fully '
    'annotated; exit 1 where there is one',
  )
  flags = parser.parse_args(argv)
  directories = (
    [d for top in flags.dirs for d in subdirectories(top)]
    if flags.recursive
    else flags.dirs
  )
  if flags.check:
    gaps = [
      gap(f)
      for directory in directories
      for path in modules(directory)
      for f in functions(path)
      if f.unannotated_parameters or not f.return_annotated
    ]
    for line in gaps:
      print(line)
    return 1 if gaps else 0
  for directory in directories:
    found = [f for path in modules(directory) for f in functions(path)]
    parameters = [f for f in found if f.unannotated_parameters]
    returns = [f for f in found if not f.return_annotated]
    print(
      f'{directory}: {len(found)} public functions; '
      f'{len(parameters)} with unannotated parameters '
      f'({len(parameters) / max(len(found), 1):.0%}), '
      f'{len(returns)} without a return annotation'
    )
    if flags.list:
      for f in parameters:
        print(
          f'  {f.path}:{f.line} {f.name}: {", ".join(f.unannotated_parameters)}'
        )
  return 0


if __name__ == '__main__':
  sys.exit(main())
