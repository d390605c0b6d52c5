"""Whether a layer's forward uses its RNG: what a step's random draws are.

A sliced call (`slices`) gives each slice its layer's RNG of the step, so a
draw whose shape follows the rows repeats from slice to slice instead of
drawing the unsliced one, except trax's `Dropout`, which draws its rows of
the unsliced mask (`row_draws`). Traced with the draws slices keep exact
on a fixed key (`row_draws.exact_draws_fixed`), a forward whose results
still depend on its RNG argument holds a draw that slices change; where
none does, batch slices change nothing but float32 summation order, and
the speed model may rank them by speed alone (`candidates`; not where a
layer hashes its activations, which `hashing` reads with the same walk,
`marked_outputs`).

The dependence is read from the forward's jaxpr (`jax.make_jaxpr`): a
value depends on the RNG when an equation that computes it reads the RNG or
a value that depends on it, followed into jit, custom derivatives and
remat; a loop or any other nesting counts as reading all its operands into
all its results, so the answer may say "uses" where a draw is dead, never
the reverse.
"""

from typing import Any, Callable, Sequence

import jax
from jax import numpy as jnp
from jax.extend import core as jax_core
from trax import layers as tl

from trax_revplus.typing import PyTree

# The RNG a layer's forward is traced with: trax's raw uint32[2] key.
RNG_TYPE = jax.ShapeDtypeStruct((2,), jnp.uint32)


def inner(eqn: jax_core.JaxprEqn) -> jax_core.Jaxpr | None:
  """The one nested jaxpr of `eqn` that takes its operands and gives its
  results position by position (jit, custom derivatives, remat), or None
  (a loop, a branch, any other nesting, or none)."""
  found = [
    p
    for p in eqn.params.values()
    if isinstance(p, (jax_core.ClosedJaxpr, jax_core.Jaxpr))
  ]
  if len(found) != 1 or eqn.primitive.name in ('scan', 'while'):
    return None
  nested = (
    found[0].jaxpr if isinstance(found[0], jax_core.ClosedJaxpr) else (found[0])
  )
  if len(nested.invars) != len(eqn.invars) or len(nested.outvars) != len(
    eqn.outvars
  ):
    return None
  return nested


def reads(values: Sequence[Any], marked: set[Any]) -> bool:
  """Whether any of `values` (a jaxpr's variables and literals) is in the
  set `marked`."""
  return any(
    not isinstance(v, jax_core.Literal) and v in marked for v in values
  )


def marked_outputs(
  jaxpr: jax_core.Jaxpr,
  marked_inputs: Sequence[bool],
  visit: Callable[[Any, set[Any]], None] | None = None,
) -> list[bool]:
  """For each output of `jaxpr`, whether it depends on an input marked in
  `marked_inputs` (a list of bools, one per input).

  Args:
    jaxpr: a `jax.extend.core.Jaxpr`.
    marked_inputs: list of bool, one per input of `jaxpr`.
    visit: None, or a function called as `visit(eqn, marked)` on every
      equation that reads a marked value (`marked`: the set of marked
      variables so far), also inside the nestings followed (`inner`).

  Returns:
    list of bool, one per output.
  """
  marked = {v for v, m in zip(jaxpr.invars, marked_inputs) if m}
  for eqn in jaxpr.eqns:
    if not reads(eqn.invars, marked):
      continue
    if visit is not None:
      visit(eqn, marked)
    nested = inner(eqn)
    if nested is None:  # a loop or an unknown nesting: all of it
      marked.update(eqn.outvars)
      continue
    inputs = [reads([v], marked) for v in eqn.invars]
    marked.update(
      v for v, m in zip(eqn.outvars, marked_outputs(nested, inputs, visit)) if m
    )
  return [reads([v], marked) for v in jaxpr.outvars]


def depends_on_last_input(closed_jaxpr: jax_core.ClosedJaxpr) -> bool:
  """Whether any output of `closed_jaxpr` depends on its last input.

  A call with one nested jaxpr of the same operands and results (jit,
  custom derivatives, remat) is followed inside; a loop or any other
  nesting counts as reading all its operands into all its results.

  Args:
    closed_jaxpr: a `jax.extend.core.ClosedJaxpr`, as `jax.make_jaxpr`
      returns it.

  Returns:
    bool: True where an output is the last input, or is computed (through
    any chain of equations) from it.
  """
  jaxpr = closed_jaxpr.jaxpr
  if not jaxpr.invars:
    return False
  marked = [False] * (len(jaxpr.invars) - 1) + [True]
  return any(marked_outputs(jaxpr, marked))


def forward_types(layer: tl.Layer, inputs: PyTree) -> tuple[PyTree, bool]:
  """`layer`'s forward traced on `inputs`: its outputs' types, and whether
  its results (outputs or new state) depend on its RNG.

  The caller keeps the layer as it was found (`layers.preserved`): trax's
  layers keep what their forward sets (e.g. their state) in the layer.

  Args:
    layer: a trax `Layer`, its weights and state initialized.
    inputs: its n_in stack items as `pure_fn` takes them: arrays or
      `jax.ShapeDtypeStruct`s.

  Returns:
    (outputs as `jax.ShapeDtypeStruct`s, bool).
  """
  closed, outputs = forward_jaxpr(layer, inputs)
  return outputs, depends_on_last_input(closed)


def forward_jaxpr(layer: tl.Layer, inputs: PyTree) -> tuple[Any, PyTree]:
  """`layer`'s forward traced on `inputs`: its jaxpr and its outputs' types.

  The jaxpr's inputs are the leaves of (inputs, weights, state, RNG), in
  that order, the RNG (`RNG_TYPE`) last. The caller keeps the layer as it
  was found (`layers.preserved`).

  Args:
    layer: a trax `Layer`, its weights and state initialized.
    inputs: its n_in stack items as `pure_fn` takes them: arrays or
      `jax.ShapeDtypeStruct`s.

  Returns:
    (a `jax.extend.core.ClosedJaxpr`, outputs as `jax.ShapeDtypeStruct`s).
  """

  def forward(x, weights, state, rng):
    return layer.pure_fn(x, weights, state, rng)

  closed, (outputs, _) = jax.make_jaxpr(forward, return_shape=True)(
    inputs, layer.weights, layer.state, RNG_TYPE
  )
  return closed, outputs
