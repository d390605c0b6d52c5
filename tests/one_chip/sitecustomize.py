"""A simulated one-chip host: JAX's backend opens in one process at a time.

On a TPU host a chip belongs to one process: libtpu takes a lockfile,
which it keeps open, and a second process that opens JAX's backend fails
with "Unable to initialize backend 'tpu': ABORTED: Internal error when
accessing libtpu multi-process lockfile. Run "$ sudo rm
/tmp/libtpu_lockfile"." (JAX 0.10.2 on a v5e host; other libtpu versions
say "The TPU is already in use by process with pid N"). This module makes
the CPU backend behave so, for tests: with this directory on PYTHONPATH
(Python imports `sitecustomize` at start-up) and
`TRAX_REVPLUS_ONE_CHIP_LOCK` naming a lock file, the first backend a
process opens takes a non-blocking exclusive `fcntl.flock` on that file,
kept open until the process ends; a process that finds it held fails as
on a TPU, naming the lock file (`TRAX_REVPLUS_ONE_CHIP_MESSAGE=pid`: the
holder's pid instead). Child processes inherit the variables, so a parent
that opened the backend makes its children fail, as it would on the chip.

Test-only: it wraps a private JAX function (`jax._src.xla_bridge.
_init_backend`) once JAX imports that module, and imports nothing of JAX
before then. Without the variable it does nothing. `tests/one_chip_host.py`
builds the environment.
"""

import os

LOCK_ENV = 'TRAX_REVPLUS_ONE_CHIP_LOCK'
MESSAGE_ENV = 'TRAX_REVPLUS_ONE_CHIP_MESSAGE'
_BRIDGE = 'jax._src.xla_bridge'
_held_fd = None  # The lock file, open and locked, once this process holds it.


def _hold_the_chip(path):
  """Takes the lock at `path` for the rest of this process.

  Raises:
    RuntimeError: another process holds it (the message TPU hosts give).
  """
  global _held_fd
  if _held_fd is not None:
    return
  import fcntl  # pylint: disable=g-import-not-at-top

  # Not inherited by children (Python's descriptors are non-inheritable):
  # a child must take the lock itself.
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    holder = os.pread(fd, 32, 0).decode(errors='replace').strip() or '?'
    os.close(fd)
    if os.environ.get(MESSAGE_ENV) == 'pid':
      raise RuntimeError(
        f'ABORTED: The TPU is already in use by process with pid {holder}.'
        f' Not attempting to load libtpu.so in this process. (simulated '
        f'one-chip host)'
      ) from None
    raise RuntimeError(
      f'ABORTED: Internal error when accessing libtpu multi-process '
      f'lockfile. Run "$ sudo rm {path}". (simulated one-chip host)'
    ) from None
  os.ftruncate(fd, 0)
  os.pwrite(fd, str(os.getpid()).encode(), 0)
  _held_fd = fd


def _wrap(bridge, path):
  """Makes `bridge._init_backend` take the lock before it opens a backend.

  JAX's `backends()` calls it for each platform and reports what it raises
  as "Unable to initialize backend '<platform>': <message>".
  """
  init_backend = bridge._init_backend  # pylint: disable=protected-access

  def _init_backend(platform):
    _hold_the_chip(path)
    return init_backend(platform)

  bridge._init_backend = _init_backend  # pylint: disable=protected-access


def _install(path):
  """Wraps the bridge module as soon as JAX imports it."""
  import importlib.abc  # pylint: disable=g-import-not-at-top
  import importlib.machinery  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top

  class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, search_path, target=None):
      del target
      if fullname != _BRIDGE:
        return None
      spec = importlib.machinery.PathFinder.find_spec(fullname, search_path)
      if spec is None or spec.loader is None:
        return spec
      exec_module = spec.loader.exec_module

      def exec_and_wrap(module):
        exec_module(module)
        _wrap(module, path)

      spec.loader.exec_module = exec_and_wrap
      return spec

  sys.meta_path.insert(0, _Finder())


if os.environ.get(LOCK_ENV):
  _install(os.environ[LOCK_ENV])
