"""What a layer (or optimizer) computes, as a hashable value.

Layers with equal fingerprints compute the same thing, so they can share
one compiled function (`compilation.Compiler`); equal optimizer
hyperparameters can share one placed copy (`store.LayerStore`).
"""

import functools
import hashlib
import types
from typing import Any, Hashable

import jax
import numpy as np
from trax.layers import base
from trax.optimizers import base as optimizer_base

# Attributes that are arguments of the compiled functions (weights, state,
# slots, opt params) or that never enter the computation (rng, caller info,
# caches) are left out; anything this code cannot compare by value is
# compared by identity, so the worst case is a missed sharing, never a
# wrong one.

_LAYER_SKIP = frozenset(
  [
    '_weights',
    '_state',
    '_rng',
    '_rng_seed_int',
    '_caller',
    '_init_cached',
    '_jit_cache',
    '_sublayers_to_print',
  ]
)
_OPTIMIZER_SKIP = frozenset(['_slots', '_init_opt_params'])
_ATOMS = (type(None), bool, int, float, complex, str, bytes)


class _Unique:
  """A fingerprint part equal only to itself."""

  __slots__ = ()


def of(obj: Any, active: dict[int, int] | None = None) -> Hashable:
  """Returns a hashable value equal for objects that compute the same thing.

  Args:
    obj: a layer, optimizer, function, array, container or atom.
    active: internal, id of each object being fingerprinted -> its number
      in the order entered (cycles).

  Returns:
    A hashable fingerprint: equal for equal classes, hyperparameters,
    functions (code, defaults, closure contents) and constants (compared
    by value, arrays by content).
  """
  if isinstance(obj, _ATOMS):
    return (type(obj).__name__, obj)
  if active is None:
    active = {}
  key = id(obj)
  if key in active:
    return ('cycle', active[key])
  if isinstance(obj, (np.ndarray, np.generic, jax.Array)):
    x = np.asarray(obj)
    digest = hashlib.sha1(np.ascontiguousarray(x).tobytes()).hexdigest()
    return ('array', x.dtype.str, x.shape, digest)
  if isinstance(obj, np.dtype):
    return ('dtype', obj.str)
  active[key] = len(active)
  try:
    fp = lambda x: of(x, active)
    if isinstance(obj, (tuple, list)):
      return (type(obj).__name__,) + tuple(fp(x) for x in obj)
    if isinstance(obj, dict):
      return ('dict',) + tuple((fp(k), fp(v)) for k, v in obj.items())
    if isinstance(obj, (set, frozenset)):
      return ('set', frozenset(fp(x) for x in obj))
    if isinstance(obj, base.Layer):
      return ('layer', type(obj)) + tuple(
        (k, fp(v)) for k, v in sorted(vars(obj).items()) if k not in _LAYER_SKIP
      )
    if isinstance(obj, optimizer_base.Optimizer):
      return ('optimizer', type(obj)) + tuple(
        (k, fp(v))
        for k, v in sorted(vars(obj).items())
        if k not in _OPTIMIZER_SKIP
      )
    if isinstance(obj, types.FunctionType):
      cells = tuple(
        fp(c.cell_contents) if _cell_full(c) else ('empty',)
        for c in (obj.__closure__ or ())
      )
      return (
        'function',
        obj.__code__,
        id(obj.__globals__),
        fp(obj.__defaults__),
        fp(obj.__kwdefaults__),
        cells,
      )
    if isinstance(obj, types.MethodType):
      return ('method', fp(obj.__func__), fp(obj.__self__))
    if isinstance(obj, functools.partial):
      return ('partial', fp(obj.func), fp(obj.args), fp(obj.keywords))
    if isinstance(obj, (type, types.ModuleType, types.BuiltinFunctionType)):
      return ('object', obj)
    if (
      hasattr(obj, 'shape')
      and hasattr(obj, 'dtype')
      and not hasattr(obj, '__array__')
    ):  # trax ShapeDtype and the like
      return ('shape', tuple(obj.shape), str(obj.dtype))
    try:
      hash(obj)
      if type(obj).__eq__ is object.__eq__:
        return ('object', obj)  # identity
    except TypeError:
      pass
    return ('unique', _Unique())
  finally:
    del active[key]


def _cell_full(cell):
  try:
    cell.cell_contents  # noqa: B018  # pylint: disable=pointless-statement
    return True
  except ValueError:
    return False
