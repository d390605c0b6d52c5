"""The compile cache: one compiled function per distinct computation.

`Compiler` compiles one function for all layers that compute the same
thing (equal `fingerprints.of`, same kind and batch slices) and counts the
distinct functions it made. Compiling ahead of a step's calls is
`on_types.AheadOfTime`'s.
"""

import gc
from typing import Any, Callable, Hashable

import jax

from trax import layers as tl
from trax.optimizers import base as optimizer_base

from trax_revplus import placement as placement_lib
from trax_revplus.trainer._step import fingerprints
from trax_revplus.trainer._step import fn_kinds


class Compiler:
  """Compiles step functions for a placement, once per distinct computation.

  Attributes:
    n_compiled_functions: int, distinct compiled functions made so far.
  """

  def __init__(
    self,
    placement: placement_lib.Placement,
    layers: list[tl.Layer],
    optimizers: list[optimizer_base.Optimizer],
    memoize: bool,
    donate: bool,
    adasum: bool,
  ):
    """Args:
    placement: the trainer's `placement.Placement`.
    layers, optimizers: lists by layer index, fingerprinted on demand.
    memoize: bool, share compiled functions between layers with equal
      fingerprints (`memoize_jit`).
    donate: bool, pass the donations asked for on to the compiler.
    adasum: bool, part of what an update computes.
    """
    self._placement = placement
    self._layers = layers
    self._optimizers = optimizers
    self._memoize = memoize
    self._donate = donate
    self._adasum = adasum
    # What tells equal computations apart -> their compiled function.
    self._cache: dict[Hashable, Callable[..., Any]] = {}
    # Layer index -> its fingerprint.
    self._fingerprints: dict[int, tuple[Hashable, Hashable]] = {}
    # Fingerprint -> its stored copy.
    self._distinct_fingerprints: dict[
      tuple[Hashable, Hashable], tuple[Hashable, Hashable]
    ] = {}
    self.n_compiled_functions = 0

  def fingerprint_of(self, i: int) -> tuple[Hashable, Hashable]:
    """(layer, optimizer) fingerprint of layer i, computed once.

    Equal fingerprints are stored once: a fingerprint holds a tuple per
    attribute of every sublayer, and repeated layers would otherwise hold
    memory that grows with depth.
    """
    if i not in self._fingerprints:
      fp = (
        fingerprints.of(self._layers[i]),
        fingerprints.of(self._optimizers[i]),
      )
      self._fingerprints[i] = self._distinct_fingerprints.setdefault(fp, fp)
    return self._fingerprints[i]

  def compile(
    self,
    kind: fn_kinds.Kind,
    indices: list[int],
    fn: Callable[..., Any],
    donate_argnums: tuple[int, ...],
    variant: Hashable = (),
  ) -> Callable[..., Any]:
    """`fn` of `kind` for layers `indices`, compiled for the placement.

    Shared by every call with the same kind, variant and equal layers and
    optimizers (with `memoize`; without, by every call for the same
    layers). Compilation itself happens at the first
    call (or ahead of it, `on_types.AheadOfTime`).

    Args:
      kind: `fn_kinds.Kind`.
      indices: list of int, the layers `fn` computes.
      fn: the function (`step_fns`, `slices`).
      donate_argnums: tuple of int, arguments the call may reuse.
      variant: hashable, what else tells functions of one kind and equal
        layers apart (e.g. their batch slices).

    Returns:
      The compiled function.
    """
    donate_argnums = donate_argnums if self._donate else ()
    # Without `memoize`, layers are told apart by index: each layer's
    # function still compiles once, however often the plan's units are
    # built (the planning walk and the step build them apart).
    layers = (
      tuple(self.fingerprint_of(i) for i in indices)
      if self._memoize
      else tuple(indices)
    )
    key = (
      kind,
      layers,
      self._placement.n_devices,
      self._adasum,
      donate_argnums,
      variant,
    )
    hit = self._cache.get(key)
    if hit is not None:
      return hit
    compiled = self._placement.jit(
      fn,
      kind.in_layouts,
      kind.out_layouts,
      donate_argnums,
      collectives=kind.updates,
    )
    self.n_compiled_functions += 1
    self._cache[key] = compiled
    return compiled


def clear_caches() -> None:
  """Drops every program JAX compiled so far in this process.

  A function compiled before compiles again at its next call.
  """
  jax.clear_caches()
  gc.collect()  # executables held by reference cycles
