"""The compile cache, and compiling the first step ahead.

`Compiler` compiles one function for all layers that compute the same
thing (equal `fingerprints.of`); `Compiler.programs` lists every distinct
compiled function.
`AheadOfTime` runs the step's walk (`units.Units.walk`) on argument types
instead of arrays: each function is traced with the types its call will
get and compiled on a helper thread, before the first step's first call.
"""

import concurrent.futures
import gc
import os
from typing import Any, Callable, NamedTuple, Tuple

from absl import logging
import jax

from trax_revplus.trainer import fingerprints
from trax_revplus.trainer import step_fns
from trax_revplus.trainer import units as units_lib

class Program(NamedTuple):
  """One distinct compiled function of the step.

  Attributes:
    kind: `step_fns.Kind`, what it computes.
    layers: tuple of the layer indices it was first compiled for.
    fn: the compiled function (`placement.Placement.jit`).
  """
  kind: step_fns.Kind
  layers: Tuple[int, ...]
  fn: Callable[..., Any]


class Compiler:
  """Compiles step functions for a placement, once per distinct computation.

  Attributes:
    n_compiled_functions: int, distinct compiled functions made so far.
    programs: list of `Program`, each of them, in the order made.
  """

  def __init__(self, placement, layers, optimizers, memoize, donate, adasum):
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
    self._cache = {}
    self._fingerprints = {}  # layer index -> its fingerprint
    self._distinct_fingerprints = {}  # fingerprint -> its stored copy
    self.programs = []

  @property
  def n_compiled_functions(self):
    return len(self.programs)

  def fingerprint_of(self, i):
    """(layer, optimizer) fingerprint of layer i, computed once.

    Equal fingerprints are stored once: a fingerprint holds a tuple per
    attribute of every sublayer, and repeated layers would otherwise hold
    memory that grows with depth.
    """
    if i not in self._fingerprints:
      fp = (fingerprints.of(self._layers[i]),
            fingerprints.of(self._optimizers[i]))
      self._fingerprints[i] = self._distinct_fingerprints.setdefault(fp, fp)
    return self._fingerprints[i]

  def compile(self, kind, indices, fn, donate_argnums):
    """`fn` of `kind` for layers `indices`, compiled for the placement.

    Shared by every call with the same kind and equal layers and optimizers
    (with `memoize`). Compilation itself happens at the first call (or
    ahead of it, `AheadOfTime`).

    Args:
      kind: `step_fns.Kind`.
      indices: list of int, the layers `fn` computes.
      fn: the function (`step_fns`).
      donate_argnums: tuple of int, arguments the call may reuse.

    Returns:
      The compiled function.
    """
    donate_argnums = donate_argnums if self._donate else ()
    key = None
    if self._memoize:
      key = (kind, tuple(self.fingerprint_of(i) for i in indices),
             self._placement.n_devices, self._adasum, donate_argnums)
      hit = self._cache.get(key)
      if hit is not None:
        return hit
    compiled = self._placement.jit(fn, kind.in_layouts, kind.out_layouts,
                                   donate_argnums, collectives=kind.updates)
    self.programs.append(Program(kind, tuple(indices), compiled))
    if key is not None:
      self._cache[key] = compiled
    return compiled


def clear_caches():
  """Drops every program JAX compiled so far in this process.

  A function compiled before compiles again at its next call.
  """
  jax.clear_caches()
  gc.collect()  # executables held by reference cycles


class Programs:
  """The programs walks on types traced and compiled, by call key
  (`AheadOfTime.call_key`).

  Attributes:
    results: key -> result types.
    traced: key -> `jax.stages.Traced`.
    jobs: key -> future of its `jax.stages.Compiled` (None where compiling
      failed).
    functions: key -> the compiled function, kept alive so that its id in
      the key is not reused.
  """

  def __init__(self):
    self.results = {}
    self.traced = {}
    self.jobs = {}
    self.functions = {}


class TypesUnknown(Exception):
  """A call's argument types are not known without running the step."""


class AheadOfTime(units_lib.Run):
  """Compiles the first step's functions before any of them runs.

  `compile(walk)` runs the step's walk on types: each unit's parameters
  and state become `jax.ShapeDtypeStruct`s of the placed arrays (or host
  arrays where the call takes those), and each compiled function is traced
  on this thread with the argument types the step will pass it
  (`jax.jit(...).trace`); its result types are the next call's argument
  types. Each traced function is lowered and compiled on a helper thread
  as soon as it is traced, one thread per CPU core (XLA compiles without
  the GIL), so the compilations run beside each other and beside the
  tracing, not one after the other between the step's calls; `compile`
  returns once all are done. `compiled` gives each call's executable
  (`device_memory.revplus_trainer` reads their memory analyses, so the
  figures are those of the programs the step runs).

  The walk stops at the first call whose argument types cannot be known
  without placing its arguments, or which cannot be traced apart from its
  call (a function whose calls wait, `Placement.jit`); it and the calls
  after it compile when called, and so does one whose guessed types differ
  from the call's. A miss costs time, never correctness.
  """

  def __init__(self, placement, layers, optimizers, step_context,
               decide_backward, programs=None):
    """Args:
      placement: the trainer's `placement.Placement`.
      layers, optimizers: lists by layer index (host weights, state, slots).
      step_context: the first step's `units.Run`, whose stack (the sharded
        batch), RNGs, optimizer hyperparameters and step are used.
      decide_backward: `units.Units.decide_backward`, called with each
        forward unit's output types.
      programs: `Programs` shared with other walks (e.g. of other plans of
        the same trainer), or None: a program traced and compiled by one
        is not compiled again.
    """
    super().__init__(step_context.rngs, step_context.opt_params,
                     step_context.step_placed)
    self.stack = step_context.stack
    self._placement = placement
    self._layers = layers
    self._optimizers = optimizers
    self._decide_backward = decide_backward
    programs = programs if programs is not None else Programs()
    self._results = programs.results
    self._traced = programs.traced
    self._jobs = programs.jobs
    self._functions = programs.functions
    self._pool = None
    self.complete = False  # whether the walk reached its end

  def compile(self, walk):
    """Runs `walk(self)`, compiling as it goes; waits for the compilations."""
    self._pool = concurrent.futures.ThreadPoolExecutor(
        max_workers=os.cpu_count() or 1,
        thread_name_prefix='trax_revplus_compile')
    try:
      walk(self)
      self.complete = True
    except TypesUnknown:
      pass
    finally:
      concurrent.futures.wait(list(self._jobs.values()))
      self._pool.shutdown()

  def compiled(self, key):
    """(traced, compiled) of the call with `key` (`call_key`); compiled is
    None where compiling failed."""
    return self._traced[key], self._jobs[key].result()

  @staticmethod
  def call_key(fn, args):
    """The key of a call of `fn` with `args`: equal for calls that run one
    program."""
    return (id(fn), _types_key(args))

  def place(self, layers, with_slots):
    p = self._placement
    weights = _known(p.abstract_params([self._layers[i].weights
                                        for i in layers]))
    slots = None
    if with_slots:
      slots = _known(p.abstract_params([self._optimizers[i].slots
                                        for i in layers]))
    return weights, slots

  def prefetch(self, unit, with_slots):
    # Types are taken when the unit is called, so that an unknown one stops
    # the walk after the calls before it, as the step would meet them.
    self._next = (unit, lambda: self.place(unit.layers, with_slots))

  def advance(self, unit, following, with_slots):
    return super().advance(unit, following, with_slots)()

  def state(self, layers):
    return [_known(self._placement.abstract_per_device(self._layers[i].state))
            for i in layers]

  def call(self, fn, args):
    """Queues `fn`'s compilation for `args`; returns its result types."""
    key = self.call_key(fn, args)
    if key not in self._results:
      if not hasattr(fn, 'trace'):  # its calls wait: `Placement.jit`
        raise TypesUnknown()
      # Tracing stays on this thread: trax layers hold their weights
      # while traced (`Layer.pure_fn`), so layers must not be traced
      # concurrently; lowering and compiling need no layer.
      try:
        traced = fn.trace(*args)
      except Exception as e:  # pylint: disable=broad-except
        logging.info('tracing a function ahead of the first step failed '
                     '(%s); it compiles when called.', e)
        raise TypesUnknown() from e
      self._results[key] = self._placement.per_device_types(traced.out_info)
      self._traced[key] = traced
      self._functions[key] = fn
      self._jobs[key] = self._pool.submit(_compile_traced, traced)
    return self._results[key]

  def forward_done(self, unit, outputs):
    self._decide_backward(unit, outputs)


def _known(tree):
  if tree is None:
    raise TypesUnknown()
  return tree


def _types_key(tree):
  """A hashable key of the argument types a jitted call is compiled for."""
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  return treedef, tuple(
      (x.shape, str(x.dtype), getattr(x, 'weak_type', False),
       getattr(x, 'sharding', None)) if hasattr(x, 'dtype') else
      (type(x), x) for x in leaves)


def _compile_traced(traced):
  """Lowers and compiles a `jax.stages.Traced`, which fills the caches its
  jitted function's calls use; returns the `jax.stages.Compiled`, or None
  where compiling failed."""
  try:
    return traced.lower().compile()
  except Exception as e:  # pylint: disable=broad-except
    logging.info('compiling a function ahead of the first step failed '
                 '(%s); it compiles when called.', e)
    return None
