"""Whether a layer's forward hashes its activations: a discrete choice
made on float values it computes.

trax's LSH attention layers (`LSHSelfAttention`, `PureLSHSelfAttention`)
hash each position's vectors to a bucket, the argmax over random rotations
of the vectors, and sort the positions by bucket. A value that differs
only by rounding (the same sum added in another order: batch slices,
micro-batches, sequence chunks, attention pairs at a time) can land in
another bucket, and the step's results then differ from the unsliced
step's by far more than rounding, growing from step to step. Where no
layer hashes, a plan dimension that changes the summation order changes
the results by rounding only; where one does, the speed model ranks the
plans that keep stock trax's order first (`candidates`).

Read from the forward's jaxpr (`rng_use.forward_jaxpr`): an `argmax`,
`argmin`, `top_k` or `sort` (by a float key) equation whose float operand
is computed from the layer's inputs, weights or state. Dependence is
followed into jit, custom derivatives and remat (`rng_use.marked_outputs`);
inside a loop, a branch or any other nesting that reads such a value,
every value counts as computed from it, so the answer may say "hashes"
where a choice reads none of it, never the reverse.
"""

from jax import numpy as jnp
from jax.extend import core as jax_core

from trax_revplus.trainer._search import rng_use

# Primitives that choose among float values: the first `num_keys` operands
# of `sort` are its keys; the others' only operand is the one chosen from.
_CHOICES = ('argmax', 'argmin', 'top_k', 'sort')


def _chosen_from(eqn) -> list:
  """The operands `eqn` makes a discrete choice on (none where it is no
  choice)."""
  name = eqn.primitive.name
  if name not in _CHOICES:
    return []
  if name == 'sort':
    return list(eqn.invars[: eqn.params.get('num_keys', 1)])
  return list(eqn.invars[:1])


def _is_float(value) -> bool:
  dtype = getattr(getattr(value, 'aval', None), 'dtype', None)
  return dtype is not None and jnp.issubdtype(dtype, jnp.floating)


def _nested(eqn) -> list:
  """Every jaxpr nested in `eqn`'s parameters (a loop's body and
  condition, a branch of a cond, a call's jaxpr)."""
  found = []
  for param in eqn.params.values():
    for p in param if isinstance(param, (tuple, list)) else (param,):
      if isinstance(p, jax_core.ClosedJaxpr):
        found.append(p.jaxpr)
      elif isinstance(p, jax_core.Jaxpr):
        found.append(p)
  return found


def _chooses(jaxpr, marked_inputs) -> bool:
  """Whether some equation of `jaxpr` (at any depth) makes a discrete
  choice on a float value computed from an input marked in
  `marked_inputs`."""
  found = False

  def visit(eqn, marked):
    nonlocal found
    if found:
      return
    if any(
      _is_float(v) and rng_use.reads([v], marked) for v in _chosen_from(eqn)
    ):
      found = True
    elif rng_use.inner(eqn) is None:
      # Not followed position by position: all of it counts as marked.
      found = any(
        _chooses(sub, [True] * len(sub.invars)) for sub in _nested(eqn)
      )

  rng_use.marked_outputs(jaxpr, marked_inputs, visit)
  return found


def hashes_activations(closed_jaxpr: jax_core.ClosedJaxpr) -> bool:
  """Whether a forward hashes what it computes: an argmax, argmin, top_k or
  float-keyed sort reads a float value computed from any input but the
  last (the RNG).

  Args:
    closed_jaxpr: a `jax.extend.core.ClosedJaxpr` of a layer's forward, as
      `rng_use.forward_jaxpr` returns it (its last input the RNG).

  Returns:
    bool: True where such a choice reads such a value (through any chain
    of equations; a loop or branch that reads one counts whole).
  """
  jaxpr = closed_jaxpr.jaxpr
  marked = [True] * max(len(jaxpr.invars) - 1, 0) + [False] * min(
    len(jaxpr.invars), 1
  )
  return _chooses(jaxpr, marked)
