"""ReversibleSerialTrainer: drop-in for `trax.optimizers.ReversibleSerialTrainer`.

The step schedule of trax 1.4.1's memory-efficient trainer, on current JAX:
weights and optimizer slots live on the host as `numpy.ndarray`s, one layer
at a time goes to the device(s); reversible layers recompute their inputs
from their outputs on the way back instead of storing activations; updated
weights come back asynchronously ("lazy unreplication"). Device placement is
in `placement`, memory figures in `memory`; this module is the schedule:

  batch -> shard over devices
  forward:  for each block: standard layer, then its reversible layers
            (keep only block inputs and layer states)
  loss:     loss layer forward + backward + optimizer update
  backward: for each block, last to first: reversible layers reverse +
            backward + update, then the standard layer forward + backward +
            update
  collect:  every layer's new weights, slots and state back on the host

Consecutive reversible layers of a block run as one compiled call per
segment (`segment_max_layers`, bounded by `segment_max_bytes` of weights and
slots), forward and backward, which removes most per-layer dispatch and host
work when layers are small; each layer keeps its own weights, optimizer,
slots and RNG, so the updates are those of one call per layer.
"""

import collections
import concurrent.futures
import gc
import functools
import hashlib
import os
import time
import types
import weakref

from absl import logging
import gin
import jax
import numpy as np

from trax import fastmath
from trax import layers as tl
from trax.optimizers import base as optimizer_base
from trax.fastmath import numpy as jnp
from trax.layers import base
from trax.layers import combinators as cb
from trax.optimizers import trainer as stock_trainer

from trax_revplus import host_memory
from trax_revplus import memory
from trax_revplus import placement as placement_lib
from trax_revplus import validation

# What a layer update's results are checked for when `on_non_finite` is not
# 'ignore': the loss (loss layer) and the optimizer's gradient norm.
_FINITE_CHECKED = ('loss', 'gradients_l2')
_ON_NON_FINITE = ('raise', 'skip', 'ignore')
# Smallest outputs (bytes, all devices) of an activation-bound unit: above
# it activations set the peak RSS and long compiled calls run fastest; below
# it the compiler's memory sets the peak (a long backward segment raises it)
# and dispatch sets the speed. Used by backward_segment_max_layers='auto'.
_ACTIVATION_BOUND_BYTES = 2**20
# backward_segment_max_layers='auto': the length of backward segments of
# units below _ACTIVATION_BOUND_BYTES.
_SMALL_BACKWARD_SEGMENT_LAYERS = 2


def _is_activation_bound(outputs):
  """Whether a unit's outputs (device arrays or `jax.ShapeDtypeStruct`s of
  global shape, all devices) hold at least `_ACTIVATION_BOUND_BYTES`."""
  return memory.array_bytes(outputs) >= _ACTIVATION_BOUND_BYTES

# Per positional argument / result of a compiled layer function: 'r' for
# replicated (weights, slots, opt params, step), 'd' for per-device values.
_FWD_ARGS = ('d', 'r', 'd', 'd')  # inputs, weights, state, rng
_FWD_OUTS = ('d', 'd')  # outputs, new state
# inputs, weights, grads, state, slots, opt_params, rng, step
_FBO_ARGS = ('d', 'r', 'd', 'd', 'r', 'r', 'd', 'r')
_FBO_OUTS = ('r', 'd', 'r', 'd', 'd')  # weights, state, slots, grads, stats
# outputs, weights, grads, old state, new state, slots, opt_params, rng, step
_REV_ARGS = ('d', 'r', 'd', 'd', 'd', 'r', 'r', 'd', 'r')
_REV_OUTS = ('r', 'r', 'd', 'd', 'd')  # weights, slots, inputs, grads, stats


def _is_empty_tuple(x):
  """Whether x is empty or a tuple of (tuples of) empty things (as trax)."""
  if not isinstance(x, (list, tuple)):
    return False
  return all(_is_empty_tuple(y) for y in x)


def _average_gradients(grads, n_devices, adasum):
  """Averages gradients over the 'batch' axis; mirrors trax's
  `_average_multidevice_gradients`, with N the devices of this trainer."""
  if adasum:
    lg = max(i for i in range(20) if 2**i <= n_devices)
    for lg_i in range(lg):
      shift = 2**lg_i
      perm = []
      for i in range(n_devices):
        if i % (2 * shift) < shift:
          perm.append((i, i + shift))
        else:
          perm.append((i, i - shift))
      perm_grads = jax.lax.ppermute(
          grads, perm=perm, axis_name=placement_lib.AXIS_NAME)
      grads = fastmath.nested_map_multiarg(
          stock_trainer._adasum_merge, grads, perm_grads)  # pylint: disable=protected-access
  grads_psum = fastmath.psum(grads, placement_lib.AXIS_NAME)
  n = jnp.array(n_devices, dtype=jnp.float32)
  return fastmath.nested_map(lambda g: g / n, grads_psum)


def _fbo_fn(layer, optimizer, n_devices, adasum, stats_name=None):
  """Forward + backward + optimizer update of a standard layer.

  Mirrors trax's `_fbo_with_layer_and_opt`.
  """
  def fbo(inputs, weights, grads, state, slots, opt_params, rng, step):
    def pure_fn_without_state_and_rng(x, w):
      return layer.pure_fn(x, w, state, rng)
    activations, vjp_fn, new_state = fastmath.vjp(
        pure_fn_without_state_and_rng, inputs, weights, has_aux=True)
    if grads is None and stats_name is not None:
      grads = jnp.ones((), dtype=activations.dtype)
    grads_inputs, grads_weights = vjp_fn(grads)
    if _is_empty_tuple(weights):
      stats = {}
      if stats_name is not None:
        stats[stats_name] = activations
      return weights, new_state, slots, grads_inputs, stats
    if n_devices > 1:
      grads_weights = _average_gradients(grads_weights, n_devices, adasum)
    new_weights, new_slots, stats = optimizer.tree_update(
        step, grads_weights, weights, slots, opt_params, store_slots=False)
    if stats_name is not None:
      stats[stats_name] = activations
    return new_weights, new_state, new_slots, grads_inputs, stats
  return fbo


def _reverse_and_fbo_fn(layer, optimizer, n_devices, adasum):
  """Reverse + backward + optimizer update of a reversible layer.

  Mirrors trax's `_reverse_and_fbo_with_layer_and_opt`.
  """
  def reverse_and_fbo(output, weights, grads, state, new_state, slots,
                      opt_params, rng, step):
    inputs, (grads_inputs, grads_weights) = layer.reverse_and_grad(
        output, grads, weights, state, new_state, rng=rng)
    if _is_empty_tuple(weights):
      return weights, slots, inputs, grads_inputs, {}
    if n_devices > 1:
      grads_weights = _average_gradients(grads_weights, n_devices, adasum)
    new_weights, new_slots, stats = optimizer.tree_update(
        step, grads_weights, weights, slots, opt_params, store_slots=False)
    return new_weights, new_slots, inputs, grads_inputs, stats
  return reverse_and_fbo


def _forward_fn(layer):
  def forward(inputs, weights, state, rng):
    return layer.pure_fn(inputs, weights, state, rng)
  return forward


def _segment_forward_fn(layers):
  """Forward of consecutive reversible layers in one compiled call.

  The layers run in order on the top items of the stack (a reversible layer
  has `n_in == n_out`, so the stack depth does not change), each with its
  own weights, state and RNG, exactly as one call per layer would.

  Args (of the returned function):
    inputs: the top `depth` stack items (an array if depth is 1).
    weights, states, rngs: lists, one entry per layer.

  Returns (of the returned function):
    (outputs, new_states): the top `depth` stack items after the last
    layer; list of each layer's new state.
  """
  def forward(inputs, weights, states, rngs):
    stack = inputs
    new_states = []
    for layer, w, s, rng in zip(layers, weights, states, rngs):
      x = cb.inputs_from_stack(stack, layer.n_in)
      y, new_state = layer.pure_fn(x, w, s, rng)
      stack = cb.outputs_onto_stack(y, stack, layer.n_in)
      new_states.append(new_state)
    return stack, new_states
  return forward


def _segment_reverse_fn(layers, optimizers, n_devices, adasum):
  """Reverse + backward + update of consecutive reversible layers.

  Runs `_reverse_and_fbo_fn` of each layer, last to first, inside one
  compiled call; every layer keeps its own weights, slots, optimizer
  hyperparameters, states and RNG. Arguments are those of
  `_reverse_and_fbo_fn` with a list (one entry per layer) in place of each
  per-layer value, and the top `depth` stack items as outputs and grads.

  Returns (of the returned function):
    (new_weights, new_slots, inputs, grads_inputs, stats): lists of each
    layer's new weights, slots and stats; the reconstructed inputs of the
    first layer and their cotangents (top `depth` stack items).
  """
  fns = [_reverse_and_fbo_fn(layer, opt, n_devices, adasum)
         for layer, opt in zip(layers, optimizers)]

  def reverse(outputs, weights, grads, states, new_states, slots, opt_params,
              rngs, step):
    stack, grad_stack = outputs, grads
    n = len(layers)
    new_weights, new_slots, stats = [None] * n, [None] * n, [None] * n
    for k in range(n - 1, -1, -1):
      n_out = layers[k].n_out
      new_weights[k], new_slots[k], x, x_ct, stats[k] = fns[k](
          cb.inputs_from_stack(stack, n_out), weights[k],
          cb.inputs_from_stack(grad_stack, n_out), states[k], new_states[k],
          slots[k], opt_params[k], rngs[k], step)
      stack = cb.outputs_onto_stack(x, stack, n_out)
      grad_stack = cb.outputs_onto_stack(x_ct, grad_stack, n_out)
    return new_weights, new_slots, stack, grad_stack, stats
  return reverse


class _Unit(collections.namedtuple(
    '_Unit', ['kind', 'layers', 'depth', 'fwd', 'bwd'])):
  """What one compiled call handles: a standard layer or a reversible segment.

  kind: 'std' or 'rev'; layers: list of layer indices (one for 'std');
  depth: stack items a 'rev' segment reads and writes; fwd, bwd: compiled
  functions.
  """


# Fingerprints: what a layer (or optimizer) computes, for sharing compiled
# functions between layers. Attributes that are arguments of the compiled
# functions (weights, state, slots, opt params) or that never enter the
# computation (rng, caller info, caches) are left out; anything this code
# cannot compare by value is compared by identity, so the worst case is a
# missed sharing, never a wrong one.

_LAYER_SKIP = frozenset([
    '_weights', '_state', '_rng', '_rng_seed_int', '_caller', '_init_cached',
    '_jit_cache', '_sublayers_to_print'])
_OPTIMIZER_SKIP = frozenset(['_slots', '_init_opt_params'])
_ATOMS = (type(None), bool, int, float, complex, str, bytes)


class _Unique:
  """A fingerprint part equal only to itself."""
  __slots__ = ()


def _fingerprint(obj, active=None):
  """Returns a hashable value equal for objects that compute the same thing."""
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
    fp = lambda x: _fingerprint(x, active)
    if isinstance(obj, (tuple, list)):
      return (type(obj).__name__,) + tuple(fp(x) for x in obj)
    if isinstance(obj, dict):
      return ('dict',) + tuple((fp(k), fp(v)) for k, v in obj.items())
    if isinstance(obj, (set, frozenset)):
      return ('set', frozenset(fp(x) for x in obj))
    if isinstance(obj, base.Layer):
      return ('layer', type(obj)) + tuple(
          (k, fp(v)) for k, v in sorted(vars(obj).items())
          if k not in _LAYER_SKIP)
    if isinstance(obj, optimizer_base.Optimizer):
      return ('optimizer', type(obj)) + tuple(
          (k, fp(v)) for k, v in sorted(vars(obj).items())
          if k not in _OPTIMIZER_SKIP)
    if isinstance(obj, types.FunctionType):
      cells = tuple(fp(c.cell_contents) if _cell_full(c) else ('empty',)
                    for c in (obj.__closure__ or ()))
      return ('function', obj.__code__, id(obj.__globals__),
              fp(obj.__defaults__), fp(obj.__kwdefaults__), cells)
    if isinstance(obj, types.MethodType):
      return ('method', fp(obj.__func__), fp(obj.__self__))
    if isinstance(obj, functools.partial):
      return ('partial', fp(obj.func), fp(obj.args), fp(obj.keywords))
    if isinstance(obj, (type, types.ModuleType, types.BuiltinFunctionType)):
      return ('object', obj)
    if hasattr(obj, 'shape') and hasattr(obj, 'dtype') and not hasattr(
        obj, '__array__'):  # trax ShapeDtype and the like
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
    cell.cell_contents  # pylint: disable=pointless-statement
    return True
  except ValueError:
    return False


def _host(tree):
  """Device arrays in `tree` become numpy arrays; everything else stays."""
  return jax.tree_util.tree_map(
      lambda x: np.asarray(x) if isinstance(x, jax.Array) else x, tree)


def _has_weights(layer):
  return any(hasattr(x, 'shape')
             for x in jax.tree_util.tree_leaves(layer.weights))


def _holds_arrays(tree):
  """Whether `tree` has an array leaf (numpy or jax): values, not markers."""
  return any(isinstance(x, (np.ndarray, np.generic, jax.Array))
             for x in jax.tree_util.tree_leaves(tree))


def _move_to_host(layer):
  """Device arrays in `layer`'s weights and state become numpy arrays.

  Weights (state) holding no device array are not set again: an
  uninitialized trax layer may report `()` for weights whatever its
  sublayers (e.g. `ReversibleHalfResidual`), which its own setter rejects;
  trax's trainer accepts such layers, so this leaves them as they are.
  """
  if any(isinstance(x, jax.Array)
         for x in jax.tree_util.tree_leaves(layer.weights)):
    layer.weights = _host(layer.weights)
  if any(isinstance(x, jax.Array)
         for x in jax.tree_util.tree_leaves(layer.state)):
    layer.state = _host(layer.state)


@gin.configurable(module='trax_revplus')
class ReversibleSerialTrainer:
  """Runs an optimizer on a series of layers, reversible and not.

  Drop-in replacement for trax 1.4.1's
  `trax.optimizers.ReversibleSerialTrainer`: same constructor arguments,
  same updates as trax's default `Trainer` on `tl.Serial(blocks +
  [loss_layer])`, same public surface (`one_step`, `loss_layer`,
  `all_layers`, `optimizer_fn`, `slots`), so `training.Loop` uses it
  unchanged. Extras (gin: `trax_revplus.ReversibleSerialTrainer.<name>`):

    n_async_layers: a compiled call's updated weights, slots and state are
      committed to the host once calls updating at least this many layers
      were dispatched after it (0: synchronously), so the host work of
      committing overlaps their compute. A call updates one layer, or every
      layer of a reversible segment: with the default of 8 one call of an
      8-layer segment waits, or four of 2-layer segments, whose calls are
      too short to hide the host work of one.
    memory_log_every_n_steps, memory_log_per_layer,
    memory_log_tensorboard, output_dir: the memory log (`memory.MemoryLog`).
    donate: reuse device buffers of inputs consumed by a layer update.
    on_non_finite: what a NaN/Inf loss or gradient norm does (see
      `__init__`).
    segment_max_layers, segment_max_bytes: consecutive reversible layers
      run as one compiled call per segment (see `__init__`).
    backward_segment_max_layers: backward calls of small models run
      shorter segments than forward ones (see `__init__`).
    compile_ahead: the first step's functions compile on helper threads,
      beside each other, before its first call (see `__init__`).
    release_host_memory: free C-allocator memory goes back to the system
      after compilations and twice per step (see `__init__`,
      `host_memory`).
    host_mmap_threshold: None, or glibc maps host blocks of this many bytes
      or more on their own: lower peak RSS, longer steps (see `__init__`,
      `host_memory.set_mmap_threshold`).
    clear_compilation_caches: the constructor drops the programs compiled
      before it, e.g. the initializers (see `__init__`).

  Between steps every layer's weights, state and optimizer slots are host
  `numpy.ndarray`s.
  """

  def __init__(self, blocks, loss_layer, optimizer_fn, n_devices=None,
               memoize_jit=True, free_accelerators_on_step=False,
               adasum=False, n_async_layers=8, memory_log_every_n_steps=100,
               memory_log_per_layer=False, memory_log_tensorboard=True,
               output_dir=None, donate=True, on_non_finite='raise',
               segment_max_layers=8, segment_max_bytes=32 * 2**20,
               compile_ahead=True, release_host_memory=True,
               host_mmap_threshold=None,
               backward_segment_max_layers='auto',
               clear_compilation_caches=True):
    """Creates the trainer and one optimizer per layer.

    Args:
      blocks: list of pairs (standard layers: list of `tl.Layer`, reversible
        layers: list of `tl.ReversibleLayer`), initialized (e.g. by
        `init_reversible_blocks`).
      loss_layer: `tl.Layer` ending in a scalar loss, initialized.
      optimizer_fn: callable returning a new `trax.optimizers.Optimizer`
        (e.g. `trax.optimizers.Adam`); called once per layer.
      n_devices: int or None (all local devices); data-parallel over the
        batch axis, which N must divide.
      memoize_jit: bool, share compiled functions between layers that compute
        the same thing (same classes, hyperparameters, functions and
        constants, compared by value); unlike trax, not keyed by `repr`.
      free_accelerators_on_step: bool, release device buffers before the
        forward pass and after the loss (trax's Loop mode 2); see
        `Placement.free_device_buffers`.
      adasum: bool, combine multi-device gradients with Adasum.
      n_async_layers: int >= 0, see the class docstring.
      memory_log_every_n_steps: int >= 1, record memory every N steps.
      memory_log_per_layer: bool, also record per layer.
      memory_log_tensorboard: bool, write TensorBoard scalars.
      output_dir: str or None, where `memory.jsonl` goes (`set_output_dir`).
      donate: bool, donate consumed device buffers to layer updates.
      on_non_finite: 'raise' (default): a loss or gradient norm that is NaN
        or Inf stops `one_step` with `validation.NonFiniteError` before the
        layer it belongs to (and every layer after it in the backward
        order) is updated; found at the loss, no weight is updated at all.
        'skip': the step is undone instead (all weights, slots and state as
        before it; holds the replaced host arrays until the step ends) and
        `one_step` returns the non-finite loss with a warning. 'ignore': no
        check (as trax). Checked when each layer's update is collected, which
        waits for that update anyway.
      segment_max_layers: int >= 1, most consecutive reversible layers of a
        block run in one compiled call (forward: the layers in order;
        backward: reverse + backward + update of each, last to first), to
        save per-call dispatch and host work when layers are small. 1 runs
        one call per layer, as trax. Every layer keeps its own weights,
        optimizer, slots and RNG, so results match per-layer calls.
        Segments of a block have equal lengths (the last one may be
        shorter), so repeated layer patterns give identical segments that
        share one compilation.
      backward_segment_max_layers: int >= 1 or 'auto': the most layers of
        one backward call; a forward segment longer than that runs backward
        as several equal-length segments. A backward call (reverse +
        backward + update of each layer) compiles into a much larger program
        than a forward one, whose temporaries grow with its length. 'auto':
        the forward segment's length where its outputs (all devices) hold at
        least 1 MiB, where long calls run fastest; 2 below that, where the
        compiler's memory for a long backward segment would set the peak
        RSS (decided in the first step, once the outputs are known). A
        shorter length lowers the peak of activation-bound models and costs
        speed: 4 against 8 peaked 22-49 MiB lower on the 6-layer benchmark
        config and 67-87 MiB lower on the 24-layer one, and stepped 15%
        slower (6 layers, one interleaved run). Results are the same either
        way.
      segment_max_bytes: int, most bytes of weights + slots a segment may
        hold on the device at once; segments are shortened until every one
        fits, down to one layer (which is never split).
      compile_ahead: bool, compile every function of the first step before
        its first call: each is traced with the argument types the step
        will pass it (a forward function's result types give the next
        one's) and compiled on a helper thread, one thread per CPU core
        (XLA compiles without the GIL), so compilations run beside each
        other and beside the tracing instead of one after the other
        between the step's calls; the step's calls wait for all of them,
        since a compilation beside calls that allocate large activations
        fragmented the C allocator's arenas and left the first backward
        pass's peak RSS up to 25% higher in some runs. A function whose
        argument types cannot be known ahead compiles when called. The
        compiled functions and results are the same either way.
      release_host_memory: bool, when host RSS has grown by 32 MiB or more
        since the last release, give the memory the C allocator holds free
        back to the system (`host_memory`, glibc only), so compiler and XLA
        temporaries freed earlier do not stay under later phases' peak:
        at the end of the constructor, once the first step's functions
        are compiled ahead (`compile_ahead`), after the first call of each
        compiled function (which compiles it where it was not compiled
        ahead), and in every step between the forward
        and backward passes and at the end of the step. Values computed are
        unaffected.
      host_mmap_threshold: int bytes in [0, 32 MiB] or None (default:
        glibc's own threshold, left as it is). An int fixes glibc's
        `M_MMAP_THRESHOLD` at that value for the whole process
        (`host_memory.set_mmap_threshold`; not where `GLIBC_TUNABLES` sets
        it, nor without glibc): blocks of that size or more, e.g. XLA's
        temporaries and buffers, get mappings of their own, returned to the
        system when freed, instead of staying resident in the allocator's
        arenas after glibc's own threshold has risen to 32 MiB. A lower,
        more repeatable peak RSS for longer steps (presumably page faults:
        a block mapped afresh is zero-filled on first touch). On the
        benchmark configurations (`tools/bench.py`), 1 MiB against None:
        peak RSS 8-11% lower on the 6- and 24-layer ones (medians of 5
        fresh processes, spread 6 MiB against 30-66 MiB), step time 7-15%
        longer on all four (one run, separate processes); see the README's
        Performance section. Values computed are unaffected.
      clear_compilation_caches: bool, end the constructor with
        `jax.clear_caches()`: the programs compiled so far in the process,
        typically the layers' initializers, which training never runs again,
        held 80-95 MiB of host memory on the benchmark configurations
        (`tools/bench.py`), under every later peak. A function compiled
        before compiles again at its next call. Cleared after the weights
        and slots are on the host: cleared before, the 24-layer config
        peaked about 40 MiB higher (the slots filled the freed memory, later
        temporaries landed above them).

    Raises:
      validation.BlockStructureError: blocks are not (standard, reversible)
        pairs, or a reversible list holds a non-reversible layer.
      validation.DeviceCountError: n_devices is not in [1, local devices].
      validation.OptimizerFactoryError (a TypeError): optimizer_fn is an
        optimizer instance, or does not return an `Optimizer`.
      ValueError: n_async_layers < 0, segment_max_layers < 1, a bad
        backward_segment_max_layers, an unknown on_non_finite or
        compile_ahead, or host_mmap_threshold neither None nor an int in
        [0, 32 MiB] (all checked before any layer is placed or compiled).
    """
    validation.check_blocks(blocks)
    validation.check_optimizer_factory(optimizer_fn)
    validation.check_n_devices(n_devices)
    if on_non_finite not in _ON_NON_FINITE:
      raise ValueError(f'on_non_finite must be one of {_ON_NON_FINITE}, got '
                       f'{on_non_finite!r}.')
    self._on_non_finite = on_non_finite
    self._skipping = None  # (layer, what) once a skipped step went bad.
    self._rollback = []  # (layer, weights, slots, state) replaced this step.
    if n_async_layers < 0:
      raise ValueError(f'n_async_layers must be >= 0, got {n_async_layers}.')
    if int(segment_max_layers) < 1:
      raise ValueError(
          f'segment_max_layers must be >= 1, got {segment_max_layers}.')
    self._segment_max_layers = int(segment_max_layers)
    if backward_segment_max_layers != 'auto' and (
        isinstance(backward_segment_max_layers, bool) or
        not isinstance(backward_segment_max_layers, int) or
        backward_segment_max_layers < 1):
      raise ValueError(f"backward_segment_max_layers must be an int >= 1 or "
                       f"'auto', got {backward_segment_max_layers!r}.")
    self._backward_segment_max_layers = backward_segment_max_layers
    self._segment_max_bytes = int(segment_max_bytes)
    if not isinstance(compile_ahead, bool):
      raise ValueError(f'compile_ahead must be True or False, got '
                       f'{compile_ahead!r}.')
    self._compile_ahead = compile_ahead
    if host_mmap_threshold is not None:
      try:
        host_memory.set_mmap_threshold(host_mmap_threshold)
      except ValueError as e:
        raise ValueError(f'host_mmap_threshold: {e} None leaves the C '
                         f'allocator as it is.') from None
    self._releaser = (host_memory.HostMemoryReleaser()
                      if release_host_memory else None)
    self._stepped = False  # whether one_step has completed once
    self._blocks = [(tl.Serial(std), list(rev)) for (std, rev) in blocks]
    self._loss_layer = loss_layer
    self._optimizer_fn = optimizer_fn
    self._adasum = adasum
    self._n_async_layers = int(n_async_layers)
    self._do_free = free_accelerators_on_step
    self._donate = donate
    self._memoize = memoize_jit
    self._placement = placement_lib.Placement(n_devices)
    self._n_devices = self._placement.n_devices
    self._memory_log = memory.MemoryLog(
        every_n_steps=memory_log_every_n_steps,
        per_layer=memory_log_per_layer, output_dir=output_dir,
        tensorboard=memory_log_tensorboard,
        devices=self._placement.devices)
    # Close the log's files while threads still run: at interpreter exit
    # (weakref.finalize runs from atexit) or when the trainer is collected.
    # Left to garbage collection at exit, TensorBoard's writer waits forever
    # for its already stopped flush thread.
    weakref.finalize(self, self._memory_log.close)

    # Layers in forward order: block 0 standard, its reversible layers, ...,
    # loss layer last; index i is also the index of layer i's RNG (as trax).
    self._layers = []
    self._kinds = []
    for std, revs in self._blocks:
      self._layers.append(std)
      self._kinds.append('std')
      self._layers.extend(revs)
      self._kinds.extend(['rev'] * len(revs))
    self._layers.append(loss_layer)
    self._kinds.append('loss')
    self._n_layers = len(self._layers)

    def make_optimizer(layer):
      opt = validation.make_optimizer(optimizer_fn, len(opts))
      opt.tree_init(layer.weights)
      opt.slots = _host(opt.slots)
      return opt
    init_records = []
    opts = []
    for i, layer in enumerate(self._layers):
      rss = memory.host_rss_bytes()
      _move_to_host(layer)
      opts.append(make_optimizer(layer))
      init_records.append(dict(
          layer=i, layer_name=layer.name,
          weights_bytes=memory.array_bytes(layer.weights),
          slots_bytes=memory.array_bytes(opts[-1].slots),
          host_rss_added_bytes=memory.host_rss_bytes() - rss))
    self._opts = opts
    self._pending_init_records = init_records
    for r in init_records:
      logging.info('init: layer %d %s: weights %.2f MiB, slots %.2f MiB, '
                   'host RSS added %.2f MiB', r['layer'], r['layer_name'],
                   r['weights_bytes'] / 2**20, r['slots_bytes'] / 2**20,
                   r['host_rss_added_bytes'] / 2**20)
    # trax's structure: per block (std optimizer, [rev optimizers]).
    self._optimizers = []
    k = 0
    for _, revs in self._blocks:
      self._optimizers.append((opts[k], opts[k + 1:k + 1 + len(revs)]))
      k += 1 + len(revs)
    self._loss_opt = opts[-1]

    # Optimizer hyperparameters stay on the device between steps; only a
    # changed learning rate is placed again. Equal ones are placed once.
    placed_params = {}
    self._opt_params = []
    for opt in opts:
      key = _fingerprint(opt.opt_params)
      if key not in placed_params:
        placed_params[key] = self._placement.replicate(opt.opt_params)
      self._opt_params.append(placed_params[key])
    self._learning_rate = None

    # Compiled functions, shared between layers with equal fingerprints.
    self._compiled_cache = {}
    self.n_compiled_functions = 0
    self._fingerprints = {}  # layer index -> its fingerprint
    self._distinct_fingerprints = {}  # fingerprint -> its stored copy
    # Units in forward order: each block's standard layer, then its
    # reversible layers in segments; the loss layer is handled apart.
    self._units = []
    # Forward segment's layers -> the units running it backward: itself, or
    # shorter segments (`backward_segment_max_layers`).
    self._backward_split = {}
    k = 0
    for _, revs in self._blocks:
      self._units.append(self._std_unit(k))
      rev_indices = list(range(k + 1, k + 1 + len(revs)))
      for segment in self._segments(rev_indices, self._segment_max_layers):
        self._units.append(self._rev_unit(segment))
        if self._backward_segment_max_layers != 'auto':
          self._backward_units(self._units[-1])
      k += 1 + len(revs)
    self._first_calls_done = set()  # ids of compiled functions called
    loss_i = self._n_layers - 1
    self._loss_fbo = self._compiled(
        'loss', [loss_i],
        _fbo_fn(loss_layer, opts[loss_i], self._n_devices, adasum, 'loss'),
        _FBO_ARGS, _FBO_OUTS,
        (1, 4) if _has_weights(loss_layer) else ())
    if clear_compilation_caches:
      jax.clear_caches()
      gc.collect()  # executables held by reference cycles
    self._release_host_memory()

  def _std_unit(self, i):
    layer, opt = self._layers[i], self._opts[i]
    fwd = self._compiled('fwd', [i], _forward_fn(layer), _FWD_ARGS,
                         _FWD_OUTS, ())
    fn = _fbo_fn(layer, opt, self._n_devices, self._adasum)
    bwd = self._compiled('std', [i], fn, _FBO_ARGS, _FBO_OUTS,
                         (1, 4) if _has_weights(layer) else ())
    return _Unit('std', [i], layer.n_in, fwd, bwd)

  def _backward_units(self, unit, activation_bound=None):
    """The units that run forward unit `unit` backward.

    Args:
      unit: a `_Unit` of the forward pass.
      activation_bound: bool, whether its outputs are activation-bound
        (`_is_activation_bound`), for backward_segment_max_layers='auto'
        (the first time a segment's split is asked for).

    Returns:
      List of `_Unit`s in forward order covering `unit.layers`.
    """
    if unit.kind == 'std':
      return [unit]
    key = tuple(unit.layers)
    if key not in self._backward_split:
      length = self._backward_segment_max_layers
      if length == 'auto':
        length = (len(key) if activation_bound else
                  _SMALL_BACKWARD_SEGMENT_LAYERS)
      if length >= len(key):
        self._backward_split[key] = [unit]
      else:
        self._backward_split[key] = [
            self._rev_unit(segment, forward=False)
            for segment in self._segments(unit.layers, length)]
    return self._backward_split[key]

  def _rev_unit(self, indices, forward=True, backward=True):
    """A reversible segment's unit; without `forward` (`backward`) its fwd
    (bwd) function is None."""
    layers = [self._layers[i] for i in indices]
    opts = [self._opts[i] for i in indices]
    depth = max(layer.n_in for layer in layers)
    fwd = bwd = None
    if forward:
      fwd = self._compiled('rev_fwd', indices, _segment_forward_fn(layers),
                           _FWD_ARGS, _FWD_OUTS, ())
    if backward:
      fn = _segment_reverse_fn(layers, opts, self._n_devices, self._adasum)
      # Weights and slots are replaced by the results and never read again;
      # activations are not donated, XLA rarely reuses them.
      donate = (1, 5) if any(_has_weights(l) for l in layers) else ()
      bwd = self._compiled('rev', indices, fn, _REV_ARGS, _REV_OUTS, donate)
    return _Unit('rev', list(indices), depth, fwd, bwd)

  def _segments(self, indices, max_layers):
    """Splits reversible layer indices into equal-length segments.

    The length is the largest one up to `max_layers` for which every
    segment's weights + slots fit in `segment_max_bytes` (1 always does).
    """
    nbytes = {i: memory.array_bytes(self._layers[i].weights) +
                 memory.array_bytes(self._opts[i].slots) for i in indices}
    length = max(1, min(max_layers, len(indices)))
    while length > 1:
      segments = [indices[k:k + length]
                  for k in range(0, len(indices), length)]
      if all(sum(nbytes[i] for i in s) <= self._segment_max_bytes
             for s in segments):
        return segments
      length -= 1
    return [[i] for i in indices]

  # Public surface of trax's ReversibleSerialTrainer.

  @property
  def loss_layer(self):
    """The loss layer this trainer was created with."""
    return self._loss_layer

  @property
  def all_layers(self):
    """All layers in forward order: [std0, rev0..., std1, ..., loss]."""
    return list(self._layers)

  @property
  def optimizer_fn(self):
    """The optimizer factory this trainer was created with."""
    return self._optimizer_fn

  @property
  def slots(self):
    """Slots of all optimizers: [(std slots, [rev slots...]), ..., loss].

    Leaves are `jax.Array`s in host memory (the CPU device), as trax's
    `tl.on_cpu` gives: `training.Loop.load_checkpoint` compares leaves with
    `in [None, ()]`, which numpy arrays cannot answer.
    """
    optimizers = list(self._optimizers) + [self._loss_opt]
    return self._placement.on_host_device(
        fastmath.nested_map(lambda opt: opt.slots, optimizers))

  @slots.setter
  def slots(self, slots):
    """Sets the slots of all optimizers (structure as the getter's)."""
    for ((s_opt, r_opts), (s_slots, r_slots)) in zip(
        self._optimizers, slots[:-1]):
      for (opt, slot) in zip([s_opt] + list(r_opts), [s_slots] + list(r_slots)):
        opt.slots = _host(slot)
    self._loss_opt.slots = _host(slots[-1])

  @property
  def placement(self):
    """The `placement.Placement` this trainer uses."""
    return self._placement

  @property
  def memory_log(self):
    """The `memory.MemoryLog` this trainer records to."""
    return self._memory_log

  def set_output_dir(self, output_dir):
    """Writes the memory log to `<output_dir>/memory.jsonl` from now on."""
    self._memory_log.set_output_dir(output_dir)
    self._flush_init_records()

  def _flush_init_records(self):
    records, self._pending_init_records = self._pending_init_records, []
    for fields in records:
      self._memory_log.record(0, 'init', **fields)

  # Compilation.

  def _fingerprint_of(self, i):
    """(layer, optimizer) fingerprint of layer i, computed once.

    Equal fingerprints are stored once: a fingerprint holds a tuple per
    attribute of every sublayer (about 40 KiB per ReformerLM layer), and
    repeated layers would otherwise hold memory that grows with depth.
    """
    if i not in self._fingerprints:
      fp = (_fingerprint(self._layers[i]), _fingerprint(self._opts[i]))
      self._fingerprints[i] = self._distinct_fingerprints.setdefault(fp, fp)
    return self._fingerprints[i]

  def _compiled(self, kind, indices, fn, arg_kinds, out_kinds, donate):
    """A jitted (N > 1: jitted shard_map) `fn` of layers `indices`.

    Shared by every call with the same kind and equal layers and optimizers.
    """
    key = None
    if self._memoize:
      key = (kind, tuple(self._fingerprint_of(i) for i in indices),
             self._n_devices, self._adasum, donate if self._donate else ())
      hit = self._compiled_cache.get(key)
      if hit is not None:
        return hit
    donate = donate if self._donate else ()
    if self._n_devices == 1:
      compiled = jax.jit(fn, donate_argnums=donate)
    else:
      compiled = jax.jit(self._shard_map(fn, arg_kinds, out_kinds),
                         donate_argnums=donate)
      if self._placement.sync_collectives and kind not in ('fwd', 'rev_fwd'):
        compiled = _blocking(compiled)
    self.n_compiled_functions += 1
    if key is not None:
      self._compiled_cache[key] = compiled
    return compiled

  def _shard_map(self, fn, arg_kinds, out_kinds):
    """Runs `fn` per device as `jax.pmap` would, on a 'batch' mesh."""
    p = self._placement
    squeeze = lambda t: jax.tree_util.tree_map(lambda x: x[0], t)
    expand = lambda t: jax.tree_util.tree_map(lambda x: x[None], t)

    def per_device(*args):
      args = [squeeze(a) if k == 'd' else a for a, k in zip(args, arg_kinds)]
      outs = fn(*args)
      return tuple(expand(o) if k == 'd' else o
                   for o, k in zip(outs, out_kinds))
    spec = lambda k: p.per_device_spec if k == 'd' else p.replicated_spec
    return jax.shard_map(
        per_device, mesh=p.mesh,
        in_specs=tuple(spec(k) for k in arg_kinds),
        out_specs=tuple(spec(k) for k in out_kinds),
        check_vma=False)

  # One training step.

  def _rngs(self, rng):
    """Per-layer RNGs as trax: split(rng, n_layers); per device first."""
    n = self._n_devices
    if n == 1:
      rows = np.asarray(fastmath.random.split(rng, self._n_layers))
      return self._placement.place_params(list(rows))
    per_device = fastmath.random.split(jnp.asarray(np.asarray(rng)), n)
    table = np.stack([np.asarray(fastmath.random.split(r, self._n_layers))
                      for r in per_device], axis=1)  # (layers, devices, 2)
    return self._placement.per_device_rows(list(table))

  def _set_learning_rate(self, learning_rate):
    """Places a new learning rate once; the same value costs nothing."""
    if learning_rate is None:
      return
    if isinstance(learning_rate, jax.Array):
      learning_rate = np.asarray(learning_rate)
    previous = self._learning_rate
    if (previous is not None and type(previous[0]) is type(learning_rate) and
        np.shape(learning_rate) == np.shape(previous[0]) and
        np.all(previous[0] == learning_rate)):
      return
    # jnp.asarray keeps trax's typing: a Python float stays weakly typed.
    placed = self._placement.replicate(jnp.asarray(learning_rate))
    self._learning_rate = (learning_rate, placed)
    for params in self._opt_params:
      params['learning_rate'] = placed

  def _place_params(self, indices, with_slots, as_list):
    """H2D of the weights (and optimizer slots) of layers `indices`.

    One placement call per unit, so a segment's small arrays move together.
    Returns (weights, slots or None), lists over `indices` if `as_list`.
    """
    weights = [self._layers[i].weights for i in indices]
    slots = [self._opts[i].slots for i in indices] if with_slots else None
    if not as_list:
      weights = weights[0]
      slots = slots[0] if with_slots else None
    if with_slots:
      return self._placement.place_params((weights, slots))
    return self._placement.place_params(weights), None

  def _place_unit(self, unit, with_slots):
    return self._place_params(unit.layers, with_slots, unit.kind == 'rev')

  def _collect(self, entry):
    """Commits one compiled call's updates: each layer's weights, slots, state.

    Layers are checked and committed in the order of `entry` (backward order
    within a segment), so a non-finite value stops at the first bad layer.
    """
    indices, weights, slots, state, checks = entry
    weights, slots, state = weights.collect(), slots.collect(), state.collect()
    for k, i in enumerate(indices):
      if (self._skipping is not None or
          not self._update_is_finite(i, checks[k])):
        return  # A skipped step commits nothing more.
      if self._on_non_finite == 'skip':
        layer = self._layers[i]
        self._rollback.append(
            (i, layer.weights, self._opts[i].slots, layer.state))
      self._layers[i].weights = weights[k]
      self._opts[i].slots = slots[k]
      self._layers[i].state = state[k]

  def one_step(self, batch, rng, step=0, learning_rate=None):
    """Updates weights, state and slots of all layers by one training step.

    Same contract as trax's `ReversibleSerialTrainer.one_step`.

    Args:
      batch: tuple of host arrays of shape (B, ...), e.g. (inputs, targets,
        weights); N devices must divide B.
      rng: JAX PRNG key (uint32[2]), single use.
      step: int, training step number (the optimizers' schedule input).
      learning_rate: float or None; overrides the optimizers' learning rate
        from this step on.

    Returns:
      (loss, stats): loss a float32 device array, shape () on one device and
      (N,) on N devices; stats a dict 'layer{i}/{name}' -> such arrays, i
      counting layers in forward order, as trax.

    Raises:
      validation.BatchSizeError: N does not divide B.
      validation.NonFiniteError: with on_non_finite='raise', the loss or a
        gradient norm is NaN/Inf (see `__init__`).
    """
    validation.check_batch(batch, self._n_devices)
    p = self._placement
    log = self._memory_log
    if self._pending_init_records and log.output_dir is not None:
      # Without an output directory the init records already went to the
      # absl log when the layers were placed; `set_output_dir` writes them.
      self._flush_init_records()
    recording = log.should_record(step)
    per_layer = recording and log.per_layer
    self._set_learning_rate(learning_rate)
    step_placed = p.replicate(np.asarray(step, dtype=np.int32))
    rngs = self._rngs(rng)

    phase_start = [time.time(), p.transfers.snapshot(), self._released()]

    def end_phase(phase, outputs=None, **fields):
      if not recording:
        return
      if outputs is not None:
        p.block(outputs)
      h2d, d2h = p.transfers.since(phase_start[1])
      if self._releaser is not None:
        fields['host_released_bytes'] = self._released() - phase_start[2]
      log.record(step, phase, seconds=time.time() - phase_start[0],
                 h2d_bytes=h2d, d2h_bytes=d2h, **fields)
      phase_start[:] = [time.time(), p.transfers.snapshot(), self._released()]

    if self._do_free:
      freed = p.free_device_buffers(self._keep())
      end_phase('free', freed_arrays=freed[0], freed_bytes=freed[1])

    # Forward: standard layer, then the block's reversible segments.
    stack = p.shard_batch(batch)
    # layer index -> (inputs, new state) of a standard layer,
    # (old state, new state) of a reversible one.
    saved = {}
    units = self._units
    # Free host memory is released after each compiled function's first
    # call (its compilation), and in every step between the forward and
    # backward passes and after the step: each release makes the next phase
    # fault its pages in again, so not after every call.
    if self._compile_ahead and not self._stepped:
      self._compile_first_step_ahead(stack, rngs, step_placed)
    placed = self._place_unit(units[0], False) if units else None
    for pos, unit in enumerate(units):
      weights, _ = placed
      if pos + 1 < len(units):  # start the next unit's H2D first
        placed = self._place_unit(units[pos + 1], False)
      t0 = time.time()
      if unit.kind == 'std':
        i = unit.layers[0]
        state = p.per_device(self._layers[i].state)
        inputs = cb.inputs_from_stack(stack, unit.depth)
        outputs, new_state = unit.fwd(inputs, weights, state, rngs[i])
        saved[i] = (inputs, new_state)
      else:
        state = p.per_device([self._layers[i].state for i in unit.layers])
        inputs = cb.inputs_from_stack(stack, unit.depth)
        outputs, new_state = unit.fwd(
            inputs, weights, state, [rngs[i] for i in unit.layers])
        for i, s, ns in zip(unit.layers, state, new_state):
          saved[i] = (s, ns)
      stack = cb.outputs_onto_stack(outputs, stack, unit.depth)
      if unit.kind == 'rev':
        outputs = cb.inputs_from_stack(stack, unit.depth)
      if not self._stepped:  # the first step decides the backward split
        self._backward_units(unit, _is_activation_bound(outputs))
      del weights, inputs, outputs, state, new_state
      self._release_after_compiling(unit.fwd)
      if per_layer:
        p.block(stack)
        self._record_unit(step, 'forward', unit, time.time() - t0)
    end_phase('forward', stack)

    # Loss layer: forward, backward and optimizer update.
    pending = collections.deque()
    loss_i = self._n_layers - 1
    bwd_units = [b for u in units for b in self._backward_units(u)][::-1]
    weights, slots = self._place_params([loss_i], True, False)
    placed = self._place_unit(bwd_units[0], True) if bwd_units else None
    loss_layer = self._loss_layer
    loss_inputs = cb.inputs_from_stack(stack, loss_layer.n_in)
    new_weights, new_state, new_slots, grad_stack, loss_stats = (
        self._loss_fbo(
            loss_inputs, weights, None, p.per_device(loss_layer.state), slots,
            self._opt_params[loss_i], rngs[loss_i], step_placed))
    del weights, slots, loss_inputs
    self._start_collect(pending, [loss_i], [new_weights], [new_slots],
                        [new_state], [loss_stats], step)
    del new_weights, new_slots, new_state
    stats = [loss_stats]
    if self._releaser is not None:
      # The forward pass's temporaries are freed once it has run.
      p.block(grad_stack)
      self._release_host_memory()
    end_phase('loss', grad_stack)

    if self._do_free:
      # As trax: activations wait on the host while device memory is freed.
      stack, grad_stack = p.gather_to_host((stack, grad_stack))
      freed = p.free_device_buffers(
          [self._keep(), stack, grad_stack, saved, rngs, step_placed, placed,
           stats] + [c.device_arrays() for e in pending for c in e[1:4]])
      end_phase('free', freed_arrays=freed[0], freed_bytes=freed[1])

    # Backward, last unit first; a segment's layers last to first.
    for pos, unit in enumerate(bwd_units):
      weights, slots = placed
      if pos + 1 < len(bwd_units):
        placed = self._place_unit(bwd_units[pos + 1], True)
      t0 = time.time()
      depth = unit.depth  # stack items the unit's backward consumes
      if unit.kind == 'rev':
        old_state = [saved[i][0] for i in unit.layers]
        new_state = [saved.pop(i)[1] for i in unit.layers]
        outputs = cb.inputs_from_stack(stack, unit.depth)
        grads = cb.inputs_from_stack(grad_stack, unit.depth)
        new_weights, new_slots, inputs, grads_in, unit_stats = unit.bwd(
            outputs, weights, grads, old_state, new_state, slots,
            [self._opt_params[i] for i in unit.layers],
            [rngs[i] for i in unit.layers], step_placed)
        del outputs, grads, old_state
      else:
        i = unit.layers[0]
        depth = self._layers[i].n_out
        inputs, state = saved.pop(i)
        grads = cb.inputs_from_stack(grad_stack, depth)
        new_weights, new_state, new_slots, grads_in, unit_stats = unit.bwd(
            inputs, weights, grads, state, slots, self._opt_params[i],
            rngs[i], step_placed)
        new_weights, new_state, new_slots, unit_stats = (
            [new_weights], [new_state], [new_slots], [unit_stats])
        del state, grads
      stack = cb.outputs_onto_stack(inputs, stack, depth)
      grad_stack = cb.outputs_onto_stack(grads_in, grad_stack, depth)
      del weights, slots, inputs, grads_in
      order = range(len(unit.layers) - 1, -1, -1)  # backward order
      stats.extend(unit_stats[k] for k in order)
      self._start_collect(
          pending, [unit.layers[k] for k in order],
          [new_weights[k] for k in order], [new_slots[k] for k in order],
          [new_state[k] for k in order], [unit_stats[k] for k in order], step)
      del new_weights, new_slots, new_state, unit_stats
      self._release_after_compiling(unit.bwd)
      if per_layer:
        p.block(grad_stack)
        self._record_unit(step, 'backward', unit, time.time() - t0)
    while pending:
      self._collect(pending.popleft())
    self._end_step_updates(step)
    del stack, grad_stack
    self._release_host_memory()
    self._stepped = True
    end_phase('backward')

    joint_stats = {}
    for i, stat in enumerate(reversed(stats)):
      for k, v in stat.items():
        joint_stats[f'layer{i}/' + k] = v
    return stats[0]['loss'], joint_stats

  def _release_after_compiling(self, fn):
    """Releases free host memory after the first call of compiled function
    `fn`, which compiled it (or was compiled ahead of the step): the
    compiler's temporaries are free by then, and kept by the allocator they
    would stay under every later peak."""
    if id(fn) not in self._first_calls_done:
      self._first_calls_done.add(id(fn))
      self._release_host_memory()

  def _release_host_memory(self):
    if self._releaser is not None:
      self._releaser.release()

  def _released(self):
    return 0 if self._releaser is None else self._releaser.released_bytes

  def _compile_first_step_ahead(self, stack, rngs, step_placed):
    """Compiles the first step's functions before any of them runs.

    Each forward function is traced on this thread with the argument types
    the step will pass it (`jax.jit(...).trace`); its result types are the
    next unit's argument types, and from them the unit's backward
    functions and then the loss layer's are traced. Each traced function
    is lowered and compiled on a helper thread as soon as it is traced,
    one thread per CPU core (XLA compiles without the GIL), so the
    compilations run beside each other and beside the tracing, not one
    after the other between the step's calls. The step's calls wait for
    all of them: a compilation beside calls that allocate large
    activations fragmented the C allocator's arenas, and the first
    backward pass then peaked up to 25% higher in some runs (6-layer
    benchmark config).

    A function whose argument types cannot be known without placing its
    arguments, or which cannot be traced apart from its call (a
    `_blocking` wrapper), compiles when called, and so do the functions
    after it whose types depend on its results; so does one whose guessed
    types differ from the call's. A miss costs time, never correctness.

    Also fixes each forward segment's backward split
    (`backward_segment_max_layers='auto'`) from its outputs' sizes.

    Args:
      stack: the sharded batch, as the first unit receives it.
      rngs: list of the step's per-layer RNGs, placed (`_rngs`).
      step_placed: the step number, placed.
    """
    p = self._placement
    results = {}  # (id(function), argument types) -> its result types
    jobs = []
    pool = concurrent.futures.ThreadPoolExecutor(
        max_workers=os.cpu_count() or 1,
        thread_name_prefix='trax_revplus_compile')

    def trace(fn, args):
      """Queues fn's compilation for `args`; returns its result types."""
      key = (id(fn), _types_key(args))
      if key not in results:
        if not hasattr(fn, 'trace'):  # `_blocking` wrappers
          return None
        # Tracing stays on this thread: trax layers hold their weights
        # while traced (`Layer.pure_fn`), so layers must not be traced
        # concurrently; lowering and compiling need no layer.
        try:
          traced = fn.trace(*args)
        except Exception as e:  # pylint: disable=broad-except
          logging.info('tracing a function ahead of the first step failed '
                       '(%s); it compiles when called.', e)
          return None
        results[key] = p.per_device_types(traced.out_info)
        jobs.append(pool.submit(_compile_traced, traced))
      return results[key]

    def weights_and_slots(layers, with_slots=True):
      weights = [p.abstract_params(self._layers[i].weights) for i in layers]
      slots = [p.abstract_params(self._opts[i].slots) if with_slots else ()
               for i in layers]
      if any(x is None for x in weights + slots):
        return None, None
      return weights, slots

    try:
      for unit in self._units:
        weights, _ = weights_and_slots(unit.layers, with_slots=False)
        state = [p.abstract_per_device(self._layers[i].state)
                 for i in unit.layers]
        if weights is None or any(x is None for x in state):
          return
        inputs = cb.inputs_from_stack(stack, unit.depth)
        unit_rngs = [rngs[i] for i in unit.layers]
        if unit.kind == 'std':
          traced = trace(unit.fwd, (inputs, weights[0], state[0],
                                    unit_rngs[0]))
        else:
          traced = trace(unit.fwd, (inputs, weights, state, unit_rngs))
        if traced is None:
          return
        outputs, new_state = traced
        stack = cb.outputs_onto_stack(outputs, stack, unit.depth)
        if unit.kind == 'std':
          new_state = [new_state]
        else:
          outputs = cb.inputs_from_stack(stack, unit.depth)
        where = {i: k for k, i in enumerate(unit.layers)}
        # Reversible layers keep the stack's shapes, so this unit's outputs
        # stand in for those of each shorter backward unit it splits into,
        # and for the cotangents.
        for bwd in self._backward_units(unit, _is_activation_bound(outputs)):
          weights, slots = weights_and_slots(bwd.layers)
          if weights is None:
            continue
          ks = [where[i] for i in bwd.layers]
          if bwd.kind == 'std':
            i = bwd.layers[0]
            args = (inputs, weights[0], outputs, new_state[0], slots[0],
                    self._opt_params[i], rngs[i], step_placed)
          else:
            args = (outputs, weights, outputs, [state[k] for k in ks],
                    [new_state[k] for k in ks], slots,
                    [self._opt_params[i] for i in bwd.layers],
                    [unit_rngs[k] for k in ks], step_placed)
          trace(bwd.bwd, args)
      loss_i = self._n_layers - 1
      weights, slots = weights_and_slots([loss_i])
      state = p.abstract_per_device(self._loss_layer.state)
      if weights is not None and state is not None:
        trace(self._loss_fbo, (
            cb.inputs_from_stack(stack, self._loss_layer.n_in), weights[0],
            None, state, slots[0], self._opt_params[loss_i], rngs[loss_i],
            step_placed))
    finally:
      concurrent.futures.wait(jobs)
      pool.shutdown()
      # The compilers' temporaries are free now; kept by the allocator,
      # they would stay under every later peak.
      self._release_host_memory()

  def _start_collect(self, pending, indices, weights, slots, state, stats,
                     step):
    """Starts the D2H copies of one compiled call's updates (lists over
    `indices`) and commits the oldest calls that at least `n_async_layers`
    layers were dispatched after."""
    p = self._placement
    checks = [None] * len(indices)
    if self._on_non_finite != 'ignore':
      checks = [(step, {k: s[k] for k in _FINITE_CHECKED if k in s})
                for s in stats]
    pending.append((indices, p.start_to_host(weights), p.start_to_host(slots),
                    p.start_to_host(state, per_device=True), checks))
    pending_layers = sum(len(entry[0]) for entry in pending)
    while pending and (pending_layers - len(pending[0][0]) >=
                       self._n_async_layers):
      pending_layers -= len(pending[0][0])
      self._collect(pending.popleft())

  def _update_is_finite(self, i, checks):
    """Checks layer i's loss / gradient norm before its update is committed.

    Returns:
      True to commit; False (on_non_finite='skip') to drop the rest of the
      step.

    Raises:
      validation.NonFiniteError: on_non_finite='raise' and a value is not
        finite.
    """
    if checks is None:
      return True
    step, values = checks
    what = validation.first_non_finite(values)
    if what is None:
      return True
    if self._on_non_finite == 'skip':
      self._skipping = (i, what)
      return False
    phase = 'loss' if i == self._n_layers - 1 else 'backward'
    value = np.asarray(values[what]).ravel()
    value = value[~np.isfinite(value)][0]
    if phase == 'loss':
      kept = 'no weight was updated in this step'
    else:
      kept = (f'layers {i + 1}..{self._n_layers - 1} were already updated '
              f'in memory, layers 0..{i} were not')
    from trax_revplus import checkpoints  # pylint: disable=g-import-not-at-top
    last = checkpoints.describe_last_good(self._memory_log.output_dir)
    raise validation.NonFiniteError(
        f'{what} is {value} at step {step} (phase {phase}, layer {i} '
        f'{self._layers[i].name}); {kept}; {last}; lower the learning rate, '
        f'clip gradients (e.g. Adam.clip_grad_norm), check the data, or set '
        f"trax_revplus.ReversibleSerialTrainer.on_non_finite = 'skip'.",
        step=step, phase=phase, layer=i, what=what)

  def _end_step_updates(self, step):
    """Undoes a skipped step's committed updates; forgets the rollback."""
    rollback, self._rollback = self._rollback, []
    if self._skipping is None:
      return
    i, what = self._skipping
    self._skipping = None
    for j, weights, slots, state in reversed(rollback):
      self._layers[j].weights = weights
      self._opts[j].slots = slots
      self._layers[j].state = state
    logging.warning('step %d skipped: %s is not finite (layer %d %s); '
                    'weights, slots and state are as before the step.',
                    step, what, i, self._layers[i].name)

  def _record_unit(self, step, phase, unit, seconds):
    """Per-layer memory record of a unit (a segment counts as one)."""
    names = [self._layers[i].name for i in unit.layers]
    name = names[0] if len(names) == 1 else f'{names[0]}..{names[-1]}'
    self._memory_log.record(step, phase, layer=unit.layers[0],
                            layer_name=name, n_layers=len(unit.layers),
                            seconds=seconds)

  def _keep(self):
    """Everything the trainer holds between phases (for safe freeing)."""
    return [[(l.weights, l.state) for l in self._layers],
            [o.slots for o in self._opts], self._opt_params,
            self._learning_rate]


def _types_key(tree):
  """A hashable key of the argument types a jitted call is compiled for."""
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  return treedef, tuple(
      (x.shape, str(x.dtype), getattr(x, 'weak_type', False),
       getattr(x, 'sharding', None)) if hasattr(x, 'dtype') else
      (type(x), x) for x in leaves)


def _compile_traced(traced):
  """Lowers and compiles a `jax.stages.Traced`, which fills the caches its
  jitted function's calls use."""
  try:
    traced.lower().compile()
  except Exception as e:  # pylint: disable=broad-except
    logging.info('compiling a function ahead of the first step failed '
                 '(%s); it compiles when called.', e)


def _blocking(fn):
  """Waits for each call's results (see `Placement.sync_collectives`)."""
  @functools.wraps(fn)
  def call(*args):
    return jax.block_until_ready(fn(*args))
  return call


def _leaf_layers(layer):
  """The distinct layers without sublayers in `layer` (itself if it has none).

  trax keeps every weight and state value in such layers: a combinator's
  weights are only its sublayers'. A layer shared by several parents is
  listed once.
  """
  found, seen = [], set()

  def walk(l):
    if id(l) in seen:
      return
    seen.add(id(l))
    if l.sublayers:
      for sub in l.sublayers:
        walk(sub)
    else:
      found.append(l)
  walk(layer)
  return found


def _initializes_itself(leaf):
  """Whether `init` can give this sublayer-less layer weights or state.

  A layer that does not override `Layer.init_weights_and_state` (Dropout,
  Select, Fn, ...) keeps `()` whatever its inputs, and so does an empty
  `tl.Serial` or `tl.Parallel` (e.g. the `[]` of `tl.Parallel(layer, [])`).
  A wrong True costs an initialization whose values are then discarded,
  never a wrong value.
  """
  if isinstance(leaf, (cb.Serial, cb.Parallel)):
    return False
  return (type(leaf).init_weights_and_state is not
          base.Layer.init_weights_and_state)


def _standard_layer_list(std_layers):
  """A block's standard part as a flat list of layers.

  As `ReversibleSerialTrainer` (and trax's) runs it, `tl.Serial(std_layers)`:
  a single layer (e.g. a `tl.Serial`) or a list of layers, nested lists
  flattened.
  """
  if isinstance(std_layers, base.Layer):
    return [std_layers]
  flat = []
  for x in std_layers:
    if isinstance(x, (list, tuple)):
      flat.extend(_standard_layer_list(x))
    else:
      flat.append(x)
  return flat


def init_reversible_blocks(blocks, loss_layer, input_signature, rng):
  """Initializes the blocks and loss layer as trax does; keeps loaded values.

  Replaces trax's `init_reversible_blocks`, which `training.Loop` calls with
  `model.rng`: it initializes each standard and reversible layer and the
  loss layer in turn, each with its own RNG, silently replacing weights a
  user loaded before the Loop (fine-tuning, `train.init_checkpoint`). Here
  every layer is initialized exactly as trax would (same order, same RNGs;
  a layer shared by two places is initialized at each, the last one
  counting, as in trax), except the values a user loaded: a layer without
  sublayers (where trax keeps weights and state) whose weights or state
  held arrays when this function was called keeps both. A layer is not
  initialized at all when all its sublayers that can hold values hold
  loaded ones; otherwise it is initialized and its loaded sublayers get
  their values back. So a partly loaded layer (e.g. a `tl.Parallel` around
  an embedding shared with an earlier block and a positional encoding of
  its own) has its empty sublayers initialized. Afterwards all weights and
  state are host `numpy.ndarray`s.

  Args:
    blocks: list of pairs (standard layers, reversible layers): the
      standard part a list of layers (nested lists are flattened, as
      `tl.Serial` does) or a single layer, the reversible part a list of
      `tl.ReversibleLayer`.
    loss_layer: the final loss layer.
    input_signature: `ShapeDtype` or tuple of them, of the batch.
    rng: JAX PRNG key (uint32[2]).

  Raises:
    validation.BlockStructureError: blocks are not (standard, reversible)
      pairs, or a reversible list holds a non-reversible layer.
    validation.SequenceLengthError: the batch's sequence axis does not fit a
      positional encoding of the blocks (checked before any layer is
      initialized).
    validation.LossLayerError: the loss layer does not output a scalar
      (checked abstractly once the layers before it are initialized).
  """
  validation.check_blocks(blocks)
  blocks = [(_standard_layer_list(std), list(rev)) for std, rev in blocks]
  validation.check_sequence_length(blocks, input_signature)
  # The values the user loaded, noted before anything is initialized: a
  # layer shared with an earlier block holds values once that block is
  # initialized, which are not the user's.
  loaded = {}
  for top in [l for std, rev in blocks for l in std + rev] + [loss_layer]:
    for leaf in _leaf_layers(top):
      if id(leaf) not in loaded and _holds_arrays((leaf.weights, leaf.state)):
        loaded[id(leaf)] = (leaf, leaf.weights, leaf.state)
  sig_stack = input_signature
  rss = memory.host_rss_bytes()

  def init_one(layer, sig, layer_rng):
    nonlocal rss
    leaves = _leaf_layers(layer)
    kept = [leaf for leaf in leaves if id(leaf) in loaded]
    if kept and all(id(leaf) in loaded
                    for leaf in leaves if _initializes_itself(leaf)):
      logging.info('init: layer %s keeps its loaded weights', layer.name)
    else:
      layer.init(sig, rng=layer_rng)
      for leaf in kept:
        _, leaf.weights, leaf.state = loaded[id(leaf)]
      if kept:
        logging.info('init: layer %s: %d of its sublayers keep their loaded '
                     'weights, the others are initialized', layer.name,
                     len(kept))
    _move_to_host(layer)
    now = memory.host_rss_bytes()
    logging.info('init: layer %s: weights %.2f MiB, host RSS added %.2f MiB, '
                 'host RSS %.2f MiB', layer.name,
                 memory.array_bytes(layer.weights) / 2**20,
                 (now - rss) / 2**20, now / 2**20)
    rss = now

  for (std_layers, rev_layers) in blocks:
    rngs = fastmath.random.split(rng, len(std_layers) + len(rev_layers) + 1)
    rng = rngs[0]
    for layer, layer_rng in zip(std_layers + rev_layers, rngs[1:]):
      sig = cb.inputs_from_stack(sig_stack, layer.n_in)
      init_one(layer, sig, layer_rng)
      out_sig = layer.output_signature(sig)
      sig_stack = cb.outputs_onto_stack(out_sig, sig_stack, layer.n_in)
  loss_sig = cb.inputs_from_stack(sig_stack, loss_layer.n_in)
  init_one(loss_layer, loss_sig, rng)
  validation.check_loss_output(loss_layer, loss_sig)


# trax's block extraction is backend-neutral and reused as is.
extract_reversible_blocks = stock_trainer.extract_reversible_blocks
