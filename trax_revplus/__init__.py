"""trax_revplus: drop-in memory-efficient reversible training for Trax.

Replacements for trax 1.4.1's `ReversibleHalfResidual`, `ReversibleSerial`
and `ReversibleSerialTrainer` that run on current JAX. Switch a gin config to
them with one line, `import trax_revplus.activate`, or from Python with
`trax_revplus.activate()`.

The supported API is the names of `__all__` here and of
`trax_revplus.trainer.__all__` (the trainer's options, plan types and
errors); deeper module paths are the implementation and may move.
"""

import importlib

from trax_revplus import trax_import

__version__ = '0.1.0'

# Public names and the submodules defining them, imported on first use: the
# submodules import trax (seconds of CPU), and `import trax_revplus` must
# stay cheap so that the `trax-revplus` command answers --help and flag
# errors at once.
_EXPORTS = {
  'activate': 'trax_revplus.swap',
  'deactivate': 'trax_revplus.swap',
  'is_active': 'trax_revplus.swap',
  'ReversibleHalfResidual': 'trax_revplus.layers',
  'ReversibleSerial': 'trax_revplus.layers',
  'reconstruction_error': 'trax_revplus.layers',
  'init_reversible_blocks': 'trax_revplus.trainer',
  'ReversibleSerialTrainer': 'trax_revplus.trainer',
  'TrainerOptions': 'trax_revplus.trainer',
  'DeviceOutOfMemoryError': 'trax_revplus.trainer',
}
__all__ = sorted(_EXPORTS)  # noqa: PLE0605 (the lazily imported names)


def __getattr__(name):
  module = _EXPORTS.get(name)
  if module is None:
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
  trax_import.import_trax()
  value = getattr(importlib.import_module(module), name)
  globals()[name] = value
  return value


def __dir__():
  return sorted(set(globals()) | set(_EXPORTS))
