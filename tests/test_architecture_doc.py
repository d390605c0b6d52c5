"""docs/architecture.md names every module of the package, and no module
that is gone."""

import os
import re

import trax_revplus

_PACKAGE = os.path.dirname(os.path.abspath(trax_revplus.__file__))
_REPO = os.path.dirname(_PACKAGE)
_DOC = os.path.join(_REPO, 'docs', 'architecture.md')


def _doc():
  with open(_DOC, encoding='utf-8') as f:
    return f.read()


def _modules():
  """Every .py file of the package, as its path under trax_revplus/."""
  modules = []
  for directory, subdirectories, files in os.walk(_PACKAGE):
    subdirectories[:] = [d for d in subdirectories if d != '__pycache__']
    modules += [
      os.path.relpath(os.path.join(directory, f), _PACKAGE)
      for f in files
      if f.endswith('.py')
    ]
  return sorted(m.replace(os.sep, '/') for m in modules)


def test_every_module_is_named():
  doc = _doc()
  modules = _modules()
  assert len(modules) > 100  # The walk found the package.
  missing = [m for m in modules if f'`{m}`' not in doc]
  assert not missing, (
    f'docs/architecture.md does not name {missing}: add each to its '
    f"package's table under 'Every module'"
  )


def test_every_module_named_exists():
  doc = _doc()
  # The tables' modules, and every path (the other names of a .py file
  # there are another project's, e.g. optax's `base.py`).
  named = set(re.findall(r'^\| `([\w/]+\.py)` \|', doc, flags=re.M)) | set(
    re.findall(r'`([\w]+/[\w/]+\.py)`', doc)
  )
  gone = sorted(
    m
    for m in named
    if not os.path.exists(os.path.join(_PACKAGE, m))
    and not os.path.exists(os.path.join(_REPO, m))
  )
  assert not gone, f'docs/architecture.md names modules that are gone: {gone}'
