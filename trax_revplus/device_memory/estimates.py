"""A program's device bytes before XLA compiles it: a lower bound and a
prediction, from its traced types and jaxpr.

Tracing a function for a call's argument types is cheap; compiling it is
what costs (seconds to minutes per program at the sizes users run). A
planner that must not compile every candidate reads two figures of a
program it has traced but not compiled (`uncompiled`), both as
`program.ProgramMemory`:

  lower: what any compilation of it occupies at least: its arguments (every
    one kept), its results, less the most its donated arguments can alias
    (results matched to donated arguments of the same shape and dtype), and
    no temporaries;
  predicted: the same, with the temporaries `temp_bytes` estimates and
    the aliasing the donations allow.

`temp_bytes` walks the jaxpr in program order, each value alive from the
equation that makes it to its last use, and returns the most bytes alive at
once (nested jaxprs, loop bodies once, counted inside the equation that runs
them). XLA fuses elementwise chains (fewer buffers) and schedules and
copies as it sees fit (more, or fewer): the figure orders programs and
predicts, and is never a bound. On the CPU backend it was 0.1 to 1.3 times
XLA's temporaries for trax's Reformer layers' programs (docs/device-memory.md).
"""

import math
from typing import Any, NamedTuple

import jax
from jax.extend import core as jax_core
import numpy as np

from trax_revplus.device_memory import program as program_lib
from trax_revplus.typing import PyTree


def _aval_bytes(aval: Any) -> int:
  shape, dtype = getattr(aval, 'shape', None), getattr(aval, 'dtype', None)
  if shape is None or dtype is None:
    return 0
  try:
    itemsize = np.dtype(dtype).itemsize
  except TypeError:  # extended dtypes (typed PRNG keys): a few bytes
    return 0
  return int(math.prod(shape)) * itemsize


def _var_bytes(var: Any) -> int:
  return _aval_bytes(getattr(var, 'aval', None))


def _nested(eqn: Any) -> list[Any]:
  """The jaxprs an equation runs (a call's, a loop's body, a branch's)."""
  out = []
  for value in eqn.params.values():
    items = value if isinstance(value, (tuple, list)) else (value,)
    for item in items:
      if isinstance(item, jax_core.Jaxpr):
        out.append(item)
      elif isinstance(item, jax_core.ClosedJaxpr):
        out.append(item.jaxpr)
  return out


def temp_bytes(jaxpr: Any) -> int:
  """Most bytes of values made inside `jaxpr` alive at once, in program
  order (its inputs left out, its results counted until its end).

  Args:
    jaxpr: a `jax.extend.core.Jaxpr` or `ClosedJaxpr` (e.g. a
      `jax.stages.Traced`'s `jaxpr`).

  Returns:
    int bytes (global shapes outside a `shard_map`, per-device inside).
  """
  if isinstance(jaxpr, jax_core.ClosedJaxpr):
    jaxpr = jaxpr.jaxpr
  last_use: dict[Any, int] = {}
  for i, eqn in enumerate(jaxpr.eqns):
    for v in eqn.invars:
      if isinstance(v, jax_core.Var):
        last_use[v] = i
  results = {v for v in jaxpr.outvars if isinstance(v, jax_core.Var)}
  inputs = set(jaxpr.invars) | set(jaxpr.constvars)
  alive = peak = 0
  for i, eqn in enumerate(jaxpr.eqns):
    inner = max((temp_bytes(j) for j in _nested(eqn)), default=0)
    made = sum(_var_bytes(v) for v in eqn.outvars)
    peak = max(peak, alive + max(inner, made))
    alive += sum(
      _var_bytes(v) for v in eqn.outvars if v in last_use or v in results
    )
    for v in {v for v in eqn.invars if isinstance(v, jax_core.Var)}:
      if v not in inputs and v not in results and last_use.get(v) == i:
        alive -= _var_bytes(v)
  return peak


def _donated_alias_bytes(args: PyTree, donated: list[bool], outputs: PyTree):
  """The most result bytes that can reuse donated argument buffers: each
  result matched to an unused donated argument of its shape and dtype."""
  free: dict[tuple, int] = {}
  for x, d in zip(jax.tree_util.tree_leaves(args), donated):
    if d and hasattr(x, 'shape') and hasattr(x, 'dtype'):
      key = (tuple(x.shape), str(x.dtype))
      free[key] = free.get(key, 0) + 1
  aliased = 0
  for y in jax.tree_util.tree_leaves(outputs):
    if not (hasattr(y, 'shape') and hasattr(y, 'dtype')):
      continue
    key = (tuple(y.shape), str(y.dtype))
    if free.get(key):
      free[key] -= 1
      aliased += program_lib.leaf_bytes(y)
  return aliased


class Uncompiled(NamedTuple):
  """A traced program's figures before it compiles (`uncompiled`).

  Attributes:
    lower: `program.ProgramMemory` every compilation occupies at least.
    predicted: `program.ProgramMemory` with the estimated temporaries.
  """

  lower: program_lib.ProgramMemory
  predicted: program_lib.ProgramMemory


def donated_leaves(traced: jax.stages.Traced, n_leaves: int) -> list[bool]:
  """Per argument leaf, whether the traced call donates it (all False where
  the trace does not say)."""
  try:
    infos = jax.tree_util.tree_leaves(
      traced.args_info, is_leaf=lambda x: hasattr(x, 'donated')
    )
    flags = [bool(getattr(i, 'donated', False)) for i in infos]
  except (AttributeError, TypeError):
    flags = []
  return flags if len(flags) == n_leaves else [False] * n_leaves


def uncompiled(
  traced: jax.stages.Traced, args: PyTree, outputs: PyTree
) -> Uncompiled:
  """`Uncompiled` figures of `traced`, called with `args` (the call's
  abstract arguments, per-device shardings included) returning `outputs`
  (its result types as the call sees them)."""
  arg_leaves = jax.tree_util.tree_leaves(args)
  donated = donated_leaves(traced, len(arg_leaves))
  argument_bytes = sum(program_lib.leaf_bytes(x) for x in arg_leaves)
  output_bytes = program_lib.tree_bytes(outputs)
  alias_bytes = _donated_alias_bytes(args, donated, outputs)
  lower = program_lib.ProgramMemory(
    argument_bytes=argument_bytes,
    output_bytes=output_bytes,
    alias_bytes=alias_bytes,
    temp_bytes=0,
  )
  temps = temp_bytes(traced.jaxpr)
  # The jaxpr's results are its outputs: XLA keeps them in the output
  # buffers, not among its temporaries.
  temps = max(0, temps - output_bytes)
  predicted = program_lib.ProgramMemory(
    argument_bytes=argument_bytes,
    output_bytes=output_bytes,
    alias_bytes=alias_bytes,
    temp_bytes=temps,
  )
  return Uncompiled(lower, predicted)
