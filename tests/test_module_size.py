"""No module of the package grows past the size of one job."""

import os

import trax_revplus

_PACKAGE = os.path.dirname(os.path.abspath(trax_revplus.__file__))
# A module over this many lines does more than one job: split it by job,
# each part with a name that says what it does (docs/contributing.md).
MAX_LINES = 400


def _line_counts():
  """{path under trax_revplus/: lines} of every .py file of the package."""
  counts = {}
  for directory, subdirectories, files in os.walk(_PACKAGE):
    subdirectories[:] = [d for d in subdirectories if d != '__pycache__']
    for name in files:
      if name.endswith('.py'):
        path = os.path.join(directory, name)
        with open(path, encoding='utf-8') as f:
          counts[os.path.relpath(path, _PACKAGE)] = sum(1 for _ in f)
  return counts


def test_no_module_is_over_the_limit():
  counts = _line_counts()
  assert len(counts) > 100  # the walk found the package
  over = {path: n for path, n in counts.items() if n > MAX_LINES}
  assert not over, f'modules over {MAX_LINES} lines (split each by job): {over}'
