"""Installs `refusal` in a process started with this folder on PYTHONPATH.

Python imports `sitecustomize` at start-up. Where `refusal.LIMIT_ENV` (or
`refusal.FAILURE_ENV`) holds a number of bytes, every program over it is
refused when compiled (`refusal.install`), from the moment JAX imports its
compiler module; without either variable nothing happens and JAX is not
imported. Independent of any other simulation: each is enabled by its own
variable, and a process that needs two imports the other's hook module
itself.
"""

import os
import sys


def _install_when_imported(refusal, limit_bytes, status):
  """Installs `refusal` once JAX imports `jax._src.compiler`."""
  import importlib.abc  # pylint: disable=g-import-not-at-top
  import importlib.machinery  # pylint: disable=g-import-not-at-top

  class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, search_path, target=None):
      del target
      if fullname != 'jax._src.compiler':
        return None
      sys.meta_path.remove(self)
      spec = importlib.machinery.PathFinder.find_spec(fullname, search_path)
      exec_module = spec.loader.exec_module

      def exec_then_install(module):
        exec_module(module)
        refusal.install(limit_bytes, status)

      spec.loader.exec_module = exec_then_install
      return spec

  sys.meta_path.insert(0, _Finder())


def _main():
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  import refusal  # pylint: disable=g-import-not-at-top

  sys.path.pop(0)
  for env, status in (
    (refusal.LIMIT_ENV, refusal.OUT_OF_MEMORY),
    (refusal.FAILURE_ENV, refusal.FAILED),
  ):
    if os.environ.get(env):
      _install_when_imported(refusal, int(os.environ[env]), status)
      return


_main()
