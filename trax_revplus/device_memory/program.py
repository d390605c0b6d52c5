"""What one compiled program needs on the device, from XLA's own figures.

`analyze(fn, *args)` traces a jitted function with the argument types of a
call (`jax.ShapeDtypeStruct`s or the arrays themselves: nothing is placed or
run), lowers and compiles it, and returns XLA's memory analysis of the
executable (`jax.stages.Compiled.memory_analysis()`) as a `ProgramMemory`,
with the result types (for the next call's arguments) and which argument
leaves the program keeps (JAX drops unused arguments from the executable,
so they are not in its argument bytes).

What XLA reports, per executable (all bytes, per device):

  argument_bytes: the buffers of the arguments the program keeps.
  output_bytes: the result buffers, plus the result tuple's index table
    (8 bytes per result on CPU).
  alias_bytes: result bytes that reuse a donated argument's buffer.
  temp_bytes: the temporary block XLA's buffer assignment packs every
    intermediate into; the runtime allocates it whole for each call.
  generated_code_bytes: compiled code kept on the device (0 on CPU).

`ProgramMemory.call_bytes` = argument + output + temp - alias bytes: what a
call of the program occupies on the device at once. XLA's own
`peak_memory_in_bytes` is kept as `xla_peak_bytes` where reported; on the
CPU backend (JAX 0.10.2) it is argument + output - alias bytes, without the
temporaries, so it is not used as the call's peak.
"""

import dataclasses
import math

import jax
import numpy as np

from trax_revplus.typing import PyTree


@dataclasses.dataclass(frozen=True)
class ProgramMemory:
  """XLA's memory analysis of one compiled program, in bytes per device.

  Attributes:
    argument_bytes: arguments the program keeps (unused ones are dropped).
    output_bytes: results, with the result tuple's index table.
    alias_bytes: result bytes held in donated argument buffers.
    temp_bytes: XLA's temporary block, allocated whole for each call.
    generated_code_bytes: compiled code on the device (0 on CPU).
    xla_peak_bytes: XLA's `peak_memory_in_bytes`, or None where not
      reported (on CPU it leaves out `temp_bytes`).
  """

  argument_bytes: int
  output_bytes: int
  alias_bytes: int
  temp_bytes: int
  generated_code_bytes: int = 0
  xla_peak_bytes: int | None = None

  @property
  def call_bytes(self) -> int:
    """Bytes a call occupies: argument + output + temp - alias."""
    return (
      self.argument_bytes
      + self.output_bytes
      + self.temp_bytes
      - self.alias_bytes
    )

  @classmethod
  def from_compiled(cls, compiled: jax.stages.Compiled) -> 'ProgramMemory':
    """Reads `compiled.memory_analysis()`.

    Raises:
      ValueError: the backend gives no memory analysis.
    """
    stats = compiled.memory_analysis()
    if stats is None:
      raise ValueError(
        'this backend gives no memory analysis of compiled '
        'programs (jax.stages.Compiled.memory_analysis).'
      )
    peak = getattr(stats, 'peak_memory_in_bytes', None)
    return cls(
      argument_bytes=int(stats.argument_size_in_bytes),
      output_bytes=int(stats.output_size_in_bytes),
      alias_bytes=int(stats.alias_size_in_bytes),
      temp_bytes=int(stats.temp_size_in_bytes),
      generated_code_bytes=int(stats.generated_code_size_in_bytes),
      xla_peak_bytes=None if peak is None else int(peak),
    )


@dataclasses.dataclass(frozen=True)
class Analysis:
  """A program's memory, result types and kept arguments.

  Attributes:
    memory: `ProgramMemory` of the compiled program.
    outputs: the results as `jax.ShapeDtypeStruct`s (`Traced.out_info`).
    kept: pytree of bool shaped as the arguments (one per array leaf):
      whether the program keeps that argument; None where that could not be
      told (then treat every argument as kept).
  """

  memory: ProgramMemory
  outputs: PyTree
  kept: PyTree | None


def abstract(tree: PyTree) -> PyTree:
  """Array leaves become `jax.ShapeDtypeStruct`s; other leaves stay.

  Keeps shape, dtype, weak type and the sharding of committed `jax.Array`s,
  so the program compiles as for the arrays themselves, without touching
  their data.
  """

  def leaf(x):
    if isinstance(x, jax.ShapeDtypeStruct):
      return x
    if isinstance(x, jax.Array):
      sharding = x.sharding if getattr(x, 'committed', False) else None
      return jax.ShapeDtypeStruct(
        x.shape,
        x.dtype,
        sharding=sharding,
        weak_type=getattr(x, 'weak_type', False),
      )
    if isinstance(x, (np.ndarray, np.generic)):
      return jax.ShapeDtypeStruct(
        x.shape, jax.dtypes.canonicalize_dtype(x.dtype)
      )
    return x

  return jax.tree_util.tree_map(leaf, tree)


def host_types(tree: PyTree) -> PyTree:
  """Array leaves (and `jax.ShapeDtypeStruct`s) become unsharded
  `jax.ShapeDtypeStruct`s of their shape and own dtype (a numpy int64
  batch stays int64, as the host holds it); other leaves stay."""

  def leaf(x):
    if hasattr(x, 'shape') and hasattr(x, 'dtype'):
      return jax.ShapeDtypeStruct(tuple(x.shape), x.dtype)
    return x

  return jax.tree_util.tree_map(leaf, tree)


def leaf_bytes(x: object, whole: bool = False) -> int:
  """Bytes one leaf occupies on each device holding it: an array or
  `jax.ShapeDtypeStruct` (its shard's bytes where it has a sharding; with
  `whole`, every device's data, as a host copy holds it), a Python scalar
  (as the 0-d array a jitted call makes of it); 0 for anything else."""
  if isinstance(x, (bool, int, float, complex)):  # traced as 0-d arrays
    return np.dtype(jax.dtypes.canonicalize_dtype(np.result_type(x))).itemsize
  shape, dtype = getattr(x, 'shape', None), getattr(x, 'dtype', None)
  if shape is None or dtype is None:
    return 0
  sharding = None if whole else getattr(x, 'sharding', None)
  if sharding is not None and hasattr(sharding, 'shard_shape'):
    shape = sharding.shard_shape(tuple(shape))
  try:
    itemsize = np.dtype(dtype).itemsize
  except TypeError:  # extended dtypes (typed PRNG keys)
    return 0
  return int(math.prod(shape)) * itemsize


def tree_bytes(tree: PyTree, kept: PyTree | None = None) -> int:
  """Bytes of the array leaves of `tree`; with `kept` (a pytree of bool of
  the same structure, from `Analysis.kept`), only of the kept leaves."""
  leaves = jax.tree_util.tree_leaves(tree)
  if kept is None:
    return sum(leaf_bytes(x) for x in leaves)
  flags = jax.tree_util.tree_leaves(kept)
  if len(flags) != len(leaves):
    raise ValueError(f'kept has {len(flags)} leaves, the tree {len(leaves)}.')
  return sum(leaf_bytes(x) for x, k in zip(leaves, flags) if k)


def types_key(
  args: PyTree,
) -> tuple[jax.tree_util.PyTreeDef, tuple[tuple, ...]]:
  """A hashable key of the argument types a call compiles for: the tree
  structure, and per leaf its shape, dtype, weak type and sharding (arrays,
  `jax.ShapeDtypeStruct`s) or its type and value (anything else)."""
  leaves, treedef = jax.tree_util.tree_flatten(args)

  def leaf(x):
    if hasattr(x, 'shape') and hasattr(x, 'dtype'):
      return (
        tuple(x.shape),
        str(x.dtype),
        bool(getattr(x, 'weak_type', False)),
        getattr(x, 'sharding', None),
      )
    return (type(x), x)

  return treedef, tuple(leaf(x) for x in leaves)


def kept_arguments(
  compiled: jax.stages.Compiled, args: PyTree, memory: ProgramMemory
) -> PyTree | None:
  """Per argument leaf, whether the compiled program keeps it.

  JAX drops the arguments a program does not read, inside `scan`s and
  nested calls too, before XLA sees it; the executable's `input_formats`
  has no layout for those.

  Returns:
    A pytree of bool of `args`'s structure; None when the formats do not
    match the arguments or the kept leaves' bytes differ from XLA's
    argument bytes.
  """
  leaves, treedef = jax.tree_util.tree_flatten(args)
  try:
    formats = jax.tree_util.tree_leaves(
      compiled.input_formats[0], is_leaf=lambda x: hasattr(x, 'layout')
    )
  except (AttributeError, TypeError, ValueError):
    return None
  if len(formats) != len(leaves):
    return None
  flags = [f.layout is not None for f in formats]
  if (
    sum(_argument_bytes(x) for x, k in zip(leaves, flags) if k)
    != memory.argument_bytes
  ):
    return None
  return jax.tree_util.tree_unflatten(treedef, flags)


def _argument_bytes(x) -> int:
  """`leaf_bytes` of an argument as a jitted call passes it: a float0
  leaf (the cotangent of an integer input) goes as bool zeros."""
  if getattr(x, 'dtype', None) == jax.dtypes.float0:
    return int(math.prod(x.shape))
  return leaf_bytes(x)


def analyze(fn: jax.stages.Wrapped, *args: PyTree) -> Analysis:
  """Compiles `fn` for a call with `args` and reads XLA's memory analysis.

  Nothing is placed or run: `fn.trace(*args).lower().compile()`, where
  `args` may be `jax.ShapeDtypeStruct`s (`abstract`), arrays or Python
  scalars, exactly as the call would pass them.

  Args:
    fn: a jitted function (`jax.jit`), or anything with `.lower` (then the
      kept arguments are not told apart).
    *args: the call's positional arguments.

  Returns:
    `Analysis` of the compiled program.

  Raises:
    Whatever tracing, lowering or compiling `fn` raises for these
    arguments; ValueError where the backend gives no memory analysis.
  """
  if hasattr(fn, 'trace'):
    traced = fn.trace(*args)
    compiled = traced.lower().compile()
    memory = ProgramMemory.from_compiled(compiled)
    return Analysis(
      memory, traced.out_info, kept_arguments(compiled, args, memory)
    )
  lowered = fn.lower(*args)
  compiled = lowered.compile()
  return Analysis(ProgramMemory.from_compiled(compiled), lowered.out_info, None)
