"""Attention heads computed one group at a time: below the one-row floor.

trax's efficient attention layers (`tl.SelfAttention`,
`tl.LSHSelfAttention`, `EncDecAttention`, `PureLSHSelfAttention`) compute
each (example, head) pair with the same per-pair function, with the same
RNG for every pair, and run `n_parallel_heads` pairs at a time (their
constructor argument; None: all the batch's pairs at once), in a loop whose
backward (`forward_and_or_backward`, which `ReversibleHalfResidual` calls)
differentiates one group of pairs at a time. So how many pairs run at once
changes a call's temporaries (one row's attention weights over a long
sequence: heads x length x length floats at once) and never its results,
up to float32 summation order.

The plan's dimension of pairs computed at once (the `plan.StepPlan` field
`parallel_heads`) sets that number for the trainer's
calls: while a call's function is traced, every such layer of the call
computes at most that many pairs at once; the layer is restored as found as
soon as the trace ends (the compiled program keeps the loop; the layer
object does not).
"""

import contextlib
from typing import Any, Callable, Iterator, Sequence

from trax_revplus import validation

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


def lowers(layers: Sequence[Any], n: int) -> bool:
  """Whether `n` pairs at a time is fewer than some attention layer among
  `layers` computes at once (its `n_parallel_heads` unset or larger)."""
  return any(
    getattr(a, _PARALLEL) is None or getattr(a, _PARALLEL) > n
    for a in attention_layers(layers)
  )


def check(layers: Sequence[Any], n: int, setting: str) -> None:
  """Checks that trax's attention layers among `layers` can run `n` pairs
  at a time: n divides their number of heads, or their heads divide n.

  Args:
    layers: trax layers.
    n: int >= 1, pairs at a time.
    setting: str, the trainer setting that asks for `n` (its name, as the
      error line names it).

  Raises:
    validation.TrainerOptionError: one cannot, named with its heads.
  """
  for a in attention_layers(layers):
    heads = getattr(a, _HEADS)
    if n % heads and heads % n:
      raise validation.TrainerOptionError(
        setting,
        n,
        None,
        message=(
          f'trax_revplus.ReversibleSerialTrainer.{setting} = {n} '
          f'does not divide the {heads} heads of {a.name} (nor do they '
          f'divide it); use 1, a divisor of {heads} or a multiple of '
          f"it, or 'auto'."
        ),
      )


@contextlib.contextmanager
def at_most(layers: Sequence[Any], n: int | None) -> Iterator[None]:
  """Within the block, every attention layer among `layers` computes at
  most `n` (example, head) pairs at once (None: as configured); restored
  as found after it, also on an error."""
  changed = []
  try:
    if n is not None:
      for a in attention_layers(layers):
        own = getattr(a, _PARALLEL)
        if own is None or own > n:
          changed.append((a, own))
          setattr(a, _PARALLEL, n)
    yield
  finally:
    for a, own in changed:
      setattr(a, _PARALLEL, own)


def traced_at_most(
  fn: Callable[..., Any], layers: Sequence[Any], n: int | None
) -> Callable[..., Any]:
  """`fn`, whose trace (under `jit`) runs with `at_most(layers, n)`; `fn`
  itself where n is None."""
  if n is None:
    return fn

  def limited(*args):
    with at_most(layers, n):
      return fn(*args)

  return limited
