"""Attention computed n (example, head) pairs at a time, as the plan sets n.

trax's efficient attention layers (`tl.SelfAttention`,
`tl.LSHSelfAttention`, `EncDecAttention`, `PureLSHSelfAttention`) compute
each (example, head) pair with the same per-pair function, with the same
RNG for every pair, and run `n_parallel_heads` pairs at a time (their
constructor argument; None: all the call's pairs at once; trax clamps a
larger number to the call's pairs), in a loop whose backward
(`forward_and_or_backward`, which `ReversibleHalfResidual` calls)
differentiates one group of pairs at a time. So how many pairs run at once
changes a call's temporaries (one row's attention weights over a long
sequence: heads x length x length floats at once) and its speed (one pair
at a time is a loop of small matrix products, which keeps an
accelerator's matrix units idle), and never its results, up to float32
summation order.

The plan's dimension of pairs computed at once (the `plan.StepPlan` field
`parallel_heads`) sets that number for the trainer's calls, below or above
the layers' own, for every such layer or per kind of layer
(`plan.PairsByKind`, by class name: kinds differ in which number runs
fastest): while a call's function is traced, each such layer of the call
computes its number of pairs at once (`at_once`; all of a call's pairs
where it has fewer); the layer is restored as found as soon as the trace
ends (the compiled program keeps the loop; the layer object does not).
`all_pairs` is the number that runs every pair of any call at once.
"""

import contextlib
import math
from typing import Any, Callable, Iterator, Sequence

from trax_revplus import validation
from trax_revplus.trainer._plan import plan as plan_lib

# The attribute trax's efficient attention layers read `n_parallel_heads`
# from, and the one holding their number of heads.
_PARALLEL = '_n_parallel_heads'
_HEADS = '_n_heads'


def _sublayers(layer) -> Iterator[Any]:
  yield layer
  for sub in getattr(layer, 'sublayers', None) or ():
    yield from _sublayers(sub)


def sublayers(layers: Sequence[Any]) -> list[Any]:
  """`layers` and all their sublayers, each once."""
  found = {}
  for layer in layers:
    for sub in _sublayers(layer):
      found[id(sub)] = sub
  return list(found.values())


def attention_layers(layers: Sequence[Any]) -> list[Any]:
  """The efficient attention layers among `layers` and their sublayers,
  each once (those with trax's `n_parallel_heads`)."""
  return [
    sub
    for sub in sublayers(layers)
    if hasattr(sub, _PARALLEL) and hasattr(sub, _HEADS)
  ]


def kind(layer: Any) -> str:
  """The kind of an attention layer a `plan.PairsByKind` names it by: its
  class name (e.g. 'SelfAttention')."""
  return type(layer).__name__


def for_kind(n: plan_lib.PairsAtOnce, name: str) -> int | None:
  """The pairs at once a plan's setting n (`plan.PairsAtOnce`) sets for
  the layers of kind `name`: n itself, or that kind's number in a
  `plan.PairsByKind` (None: as configured)."""
  if isinstance(n, tuple):
    return dict(n).get(name)
  return n


def for_layer(n: plan_lib.PairsAtOnce, layer: Any) -> int | None:
  """`for_kind` of `layer`'s kind."""
  return for_kind(n, kind(layer))


def by_kind(numbers: dict[str, int]) -> plan_lib.PairsByKind:
  """A `plan.PairsByKind` of {kind: pairs at once}."""
  return tuple(sorted(numbers.items()))


def layer_kinds(layers: Sequence[Any]) -> list[tuple[str, int, int | None]]:
  """(kind, heads, configured `n_parallel_heads` or None) of each of
  trax's efficient attention layers among `layers`, each layer once."""
  return [
    (kind(a), getattr(a, _HEADS), getattr(a, _PARALLEL))
    for a in attention_layers(layers)
  ]


def _settings(
  kinds: Sequence[tuple[str, int, int | None]], n: plan_lib.PairsAtOnce
) -> list[tuple[int, int | None, int]]:
  """(heads, configured, set) of each layer of `kinds` that n sets to a
  number (`for_layer`)."""
  found = []
  for name, heads, own in kinds:
    setting = for_kind(n, name)
    if setting is not None:
      found.append((heads, own, setting))
  return found


def changes_kinds(
  kinds: Sequence[tuple[str, int, int | None]],
  n: plan_lib.PairsAtOnce,
  rows: int,
) -> bool:
  """Whether setting n (`plan.PairsAtOnce`) changes how many pairs some
  attention layer of `kinds` (`layer_kinds`) computes at once in a call of
  `rows` rows."""
  return any(
    changes([(heads, own)], setting, rows)
    for heads, own, setting in _settings(kinds, n)
  )


def runs_kinds_at(
  kinds: Sequence[tuple[str, int, int | None]],
  n: plan_lib.PairsAtOnce,
  rows: int,
) -> bool:
  """Whether every attention layer of `kinds` (`layer_kinds`) runs at the
  pairs at once n sets for it in a call of `rows` rows (`runs_at`)."""
  return all(
    runs_at([(heads, own)], setting, rows)
    for heads, own, setting in _settings(kinds, n)
  )


def layer_heads(layers: Sequence[Any]) -> list[tuple[int, int | None]]:
  """(heads, configured `n_parallel_heads` or None) of each of trax's
  efficient attention layers among `layers`, each layer once."""
  return [
    (getattr(a, _HEADS), getattr(a, _PARALLEL))
    for a in attention_layers(layers)
  ]


def _at_once(n: int | None, heads: int, rows: int) -> int:
  """Pairs a layer of `heads` heads computes at once in a call of `rows`
  rows when set to n (None: all), as trax clamps it."""
  pairs = rows * heads
  return pairs if n is None else min(n, pairs)


def changes(heads: Sequence[tuple[int, int | None]], n: int, rows: int) -> bool:
  """Whether n pairs at a time changes how many some attention layer
  (`layer_heads`) computes at once in a call of `rows` rows."""
  return any(_at_once(n, h, rows) != _at_once(own, h, rows) for h, own in heads)


def all_pairs(heads: Sequence[tuple[int, int | None]], rows: int) -> int:
  """The number of pairs at a time that runs every (example, head) pair
  of a call of at most `rows` rows at once, in every attention layer
  (`layer_heads`): rows times the least common multiple of their heads
  (a multiple of each layer's heads, as trax requires)."""
  return rows * math.lcm(*(h for h, _ in heads)) if heads else rows


def runs_at(heads: Sequence[tuple[int, int | None]], n: int, rows: int) -> bool:
  """Whether every attention layer (`layer_heads`) can compute n pairs at
  a time in a call of `rows` rows: n divides its heads or is a multiple of
  them, and n divides the call's pairs or is at least all of them (trax
  asserts both)."""
  return all(
    (h % n == 0 or n % h == 0) and (n >= rows * h or (rows * h) % n == 0)
    for h, _ in heads
  )


def check(
  layers: Sequence[Any], n: plan_lib.PairsAtOnce, setting: str, rows: int
) -> None:
  """Checks that trax's attention layers among `layers` can run the pairs
  at a time n sets for them (`for_layer`) in a call of `rows` rows
  (`runs_at`).

  Args:
    layers: trax layers.
    n: int >= 1 or a `plan.PairsByKind` (by the layer's kind), pairs at a
      time; None checks nothing.
    setting: str, the trainer setting that asks for `n` (its name, as the
      error line names it).
    rows: int >= 1, rows of the batch each device gets.

  Raises:
    validation.TrainerOptionError: one cannot, named with its heads (or
      its pairs in a call).
  """
  for a in attention_layers(layers):
    heads = getattr(a, _HEADS)
    n_layer = for_layer(n, a)
    if n_layer is None:
      continue
    if n_layer % heads and heads % n_layer:
      raise validation.TrainerOptionError(
        setting,
        n_layer,
        None,
        message=(
          f'trax_revplus.ReversibleSerialTrainer.{setting} = {n_layer} '
          f'does not divide the {heads} heads of {a.name} (nor do they '
          f'divide it); use 1, a divisor of {heads} or a multiple of '
          f"it, or 'auto'."
        ),
      )
    if not runs_at([(heads, None)], n_layer, rows):
      raise validation.TrainerOptionError(
        setting,
        n_layer,
        None,
        message=(
          f'trax_revplus.ReversibleSerialTrainer.{setting} = {n_layer} '
          f'does not divide the {rows * heads} (example, head) pairs of '
          f'{a.name} over the {rows} rows each device gets; use a divisor '
          f"of {rows * heads}, at least {rows * heads}, or 'auto'."
        ),
      )


@contextlib.contextmanager
def at_once(layers: Sequence[Any], n: plan_lib.PairsAtOnce) -> Iterator[None]:
  """Within the block, every attention layer among `layers` computes the
  (example, head) pairs at once n sets for it (`for_layer`; all of a
  call's pairs where it has fewer; None: as configured); restored as found
  after it, also on an error."""
  changed = []
  try:
    for a in attention_layers(layers):
      n_layer = for_layer(n, a)
      own = getattr(a, _PARALLEL)
      if n_layer is not None and own != n_layer:
        changed.append((a, own))
        setattr(a, _PARALLEL, n_layer)
    yield
  finally:
    for a, own in changed:
      setattr(a, _PARALLEL, own)


def traced_at_once(
  fn: Callable[..., Any], layers: Sequence[Any], n: plan_lib.PairsAtOnce
) -> Callable[..., Any]:
  """`fn`, whose trace (under `jit`) runs with `at_once(layers, n)`; `fn`
  itself where n sets no attention layer among `layers` to another
  number."""
  if all(
    for_layer(n, a) in (None, getattr(a, _PARALLEL))
    for a in attention_layers(layers)
  ):
    return fn

  def set_heads(*args):
    with at_once(layers, n):
      return fn(*args)

  return set_heads
