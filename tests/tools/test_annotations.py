"""tools/annotations.py: which public functions leave parameters bare."""

from tools import annotations

_MODULE = '''
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
'''


def test_counts_public_functions_and_their_bare_parameters(tmp_path,
                                                            capsys):
  (tmp_path / 'module.py').write_text(_MODULE)
  (tmp_path / 'notes.txt').write_text('def ignored(a): pass\n')
  found = {f.name: f for f in annotations.functions(
      str(tmp_path / 'module.py'))}
  assert sorted(found) == ['__init__', 'bare', 'make', 'method',
                           'no_return', 'typed']
  assert found['typed'].unannotated_parameters == ()
  assert found['bare'].unannotated_parameters == ('a',)
  assert found['__init__'].unannotated_parameters == ('x',)
  assert found['make'].unannotated_parameters == ('args',)
  assert found['method'].unannotated_parameters == ()
  assert not found['no_return'].return_annotated
  assert found['__init__'].return_annotated

  assert annotations.main([str(tmp_path), '--list']) == 0
  out = capsys.readouterr().out.splitlines()
  assert out[0] == (f'{tmp_path}: 6 public functions; 3 with unannotated '
                    f'parameters (50%), 1 without a return annotation')
  assert len(out) == 4
