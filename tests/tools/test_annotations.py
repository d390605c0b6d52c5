"""tools/annotations.py: which public functions leave parameters bare."""

from tools import annotations

_MODULE = """
def typed(a: int, *args: int, b: str = '', **kwargs: float) -> None:
  pass


def bare(a, b: int) -> int:
  return b


def no_return(a: int):
  return a


def _private(a):
  return a


class Public:

  def __init__(self, x):
    self.x = x

  def method(self, y: int) -> int:
    return y

  @classmethod
  def make(cls, *args) -> 'Public':
    return cls(*args)

  def _hidden(self, z):
    return z


class _Private:

  def method(self, y):
    return y
"""


def test_counts_public_functions_and_their_bare_parameters(tmp_path, capsys):
  (tmp_path / 'module.py').write_text(_MODULE)
  (tmp_path / 'notes.txt').write_text('def ignored(a): pass\n')
  found = {
    f.name: f for f in annotations.functions(str(tmp_path / 'module.py'))
  }
  assert sorted(found) == [
    '__init__',
    'bare',
    'make',
    'method',
    'no_return',
    'typed',
  ]
  assert found['typed'].unannotated_parameters == ()
  assert found['bare'].unannotated_parameters == ('a',)
  assert found['__init__'].unannotated_parameters == ('x',)
  assert found['make'].unannotated_parameters == ('args',)
  assert found['method'].unannotated_parameters == ()
  assert not found['no_return'].return_annotated
  assert found['__init__'].return_annotated

  assert annotations.main([str(tmp_path), '--list']) == 0
  out = capsys.readouterr().out.splitlines()
  assert out[0] == (
    f'{tmp_path}: 6 public functions; 3 with unannotated '
    f'parameters (50%), 1 without a return annotation'
  )
  assert len(out) == 4


def test_check_names_each_gap_and_fails_until_there_is_none(tmp_path, capsys):
  """`--check --recursive`: one line per public function with a bare
  parameter or no return annotation, in subdirectories too; exit 1, then
  0 once every one is annotated."""
  package = tmp_path / 'package'
  (package / 'sub' / '__pycache__').mkdir(parents=True)
  (package / 'sub' / 'module.py').write_text(_MODULE)
  (package / 'sub' / '__pycache__' / 'cached.py').write_text(
    'def bare(a): pass\n'
  )
  (package / 'typed.py').write_text('def f(a: int) -> int:\n  return a\n')
  assert annotations.main(['--check', str(package)]) == 0
  assert capsys.readouterr().out == ''

  assert annotations.main(['--check', '--recursive', str(package)]) == 1
  path = package / 'sub' / 'module.py'
  assert capsys.readouterr().out.splitlines() == [
    f'{path}:6 bare: no annotation of parameter a',
    f'{path}:10 no_return: no annotation of return',
    f'{path}:20 __init__: no annotation of parameter x',
    f'{path}:27 make: no annotation of parameter args',
  ]

  (package / 'sub' / 'module.py').write_text(
    'def f(a: int, *args: int) -> int:\n  return a\n'
  )
  assert annotations.main(['--check', '--recursive', str(package)]) == 0
  assert capsys.readouterr().out == ''
