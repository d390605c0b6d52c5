"""A step's floor: the model's own forward and gradient, layer by layer, on
the device, and the floating-point operations they take.

Every trainer of a trax model (trax's default `Trainer`, stock's
`ReversibleSerialTrainer`, trax_revplus's) computes the same forward and
gradient; what differs is the work around it (calls, H2D and D2H copies,
recomputation, optimizer updates). The floor of a step is that arithmetic
alone, timed on the device the run trains on: each distinct layer of the
model (trax's `extract_reversible_blocks` of the model and its loss, as
the memory-efficient trainers cut it) is compiled alone as its forward and
the gradient of its outputs in its weights and inputs (trax's own
gradient: a layer with a custom backward, such as a reversible layer or
LSH attention, recomputes as trax defines it), at the rows of the batch a
call of the step gets (`rows_per_call`: the plan's batch slices and
micro-batches divide the batch); its median time over a few calls, times
the layers of its kind and the calls per step, summed over the kinds with
the loss layer's, is the floor. It needs only one layer's programs on the
device at a time, so it exists for a model that does not fit the device
whole.

XLA's cost analysis of the same programs gives the model's floating-point
operations per step (`flops_per_step`), and with a step's time its
achieved rate (`tflops_per_second`). XLA counts the body of a loop once,
whatever its trip count, so a layer whose attention computes its
(example, head) pairs a group at a time (trax's `n_parallel_heads`: a
`fori_loop` over the groups) is counted as its program with all of a
call's pairs at once, which has no loop (`_flops_of`; lowered, not
compiled: its temporaries need not fit). The floor's layers run at the
pairs at once the step's plan sets (`parallel_heads`).

So that the plan's setting does not hide an idle chip, each attention kind
(a layer whose pairs at once `attention_heads` can change) is also timed at
a few other settings (`parallel_heads_settings`: the config's, all of a
call's pairs at once, halvings of that down to the config's; at most
`MAX_SETTINGS` with the plan's), with fewer calls (`SETTING_WARMUP_CALLS`,
`SETTING_TIMED_CALLS`); a setting the backend refuses for memory
(RESOURCE_EXHAUSTED, at compile or run time) is skipped. Only the loop's
grouping of pairs changes, never a layer's results. The floor has three
figures: at the plan's setting (`StepFloor.seconds`), as configured
(`configured_seconds`) and with each attention kind at its fastest setting
timed (`best_seconds`).
`trax-revplus train --step_floor` reports them in its summary and in
run_stats.json, with each kind's share of the floor and its rate.
"""

import dataclasses
import statistics
import time
from typing import Any, Callable, Sequence

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np
from trax import layers as tl
from trax import shapes as trax_shapes
from trax.layers import combinators as cb
from trax.optimizers import trainer as stock_trainer

from trax_revplus.device_memory import out_of_memory
from trax_revplus.trainer._plan import plan as plan_lib
from trax_revplus.trainer._step import attention_heads
from trax_revplus.trax_door import loop as loop_door
from trax_revplus.typing import PyTree

# Calls of each program before the timed ones (the first runs the compiled
# program's one-time set-up) and timed calls, whose median counts.
WARMUP_CALLS = 2
TIMED_CALLS = 5
# The same for an attention kind's other settings of pairs at once (fewer:
# on a TPU one call of a long sequence's attention takes seconds).
SETTING_WARMUP_CALLS = 1
SETTING_TIMED_CALLS = 3
# Settings of pairs at once timed per attention kind, the plan's and the
# config's among them.
MAX_SETTINGS = 4


@dataclasses.dataclass(frozen=True)
class LayerKind:
  """Equal layers of a model: one program serves them all.

  Attributes:
    name: str, the first such layer's trax name and position, e.g.
      'ReversibleHalfResidual (layer 3)'; 'loss' for the loss layer.
    count: int, layers of this kind in the model.
    flops: float, XLA's count of floating-point operations of one call of
      the kind's forward and gradient at `rows_per_call` rows (of its
      program without loops where its attention computes pairs a group at
      a time: the module's docstring).
    seconds: float or None, the median seconds of one such call on the
      device; None where not timed.
    temp_bytes: int, XLA's temporary device bytes of one such call.
    configured_seconds: float or None, the median seconds of one call with
      its attention pairs at once as the model configures them (`seconds`
      for a kind without attention); None where not timed or refused.
    best_seconds: float or None, the least seconds of one call over the
      settings timed (`parallel_heads_seconds`; `seconds` for a kind
      without attention); None where not timed.
    best_parallel_heads: int or None, the pairs at once of `best_seconds`
      (None: not an attention kind, or as configured where its attention
      layers are configured unlike).
    configured_parallel_heads: int or None, the pairs at once its attention
      layers compute as configured, in a call of `rows_per_call` rows
      (None: not an attention kind, or configured unlike).
    parallel_heads_seconds: tuple of (pairs at once or None: as configured,
      seconds or None: refused for memory), each setting timed of an
      attention kind, the plan's first; () for other kinds.
  """

  name: str
  count: int
  flops: float
  seconds: float | None
  temp_bytes: int = 0
  configured_seconds: float | None = None
  best_seconds: float | None = None
  best_parallel_heads: int | None = None
  configured_parallel_heads: int | None = None
  parallel_heads_seconds: tuple[tuple[int | None, float | None], ...] = ()

  @property
  def is_attention(self) -> bool:
    """Whether the plan's pairs at once can change this kind (it was timed
    at settings of them)."""
    return bool(self.parallel_heads_seconds)


@dataclasses.dataclass(frozen=True)
class StepFloor:
  """The arithmetic of one step, by layer kind.

  Attributes:
    kinds: tuple of `LayerKind`, in the model's order (the loss last).
    calls_per_step: int, calls of each layer per step on one device
      (rows per device / `rows_per_call`).
    rows_per_call: int, batch rows of one call.
    whole_seconds: float or None, the median seconds of the model's forward
      and gradient compiled as one program over the whole batch, where it
      was measured (`measure_whole`); None where not.
    whole_note: str or None, why the whole program was not timed.
    parallel_heads: int, None or a `plan.PairsByKind`, the (example,
      head) pairs at once its attention layers ran (the plan's
      `parallel_heads`); None: as the model configures them.
    plan_is_configured: bool, whether `parallel_heads` computes every
      attention layer's pairs as the config does (then the whole program,
      run at the plan's setting, is a floor as configured too).
  """

  kinds: tuple[LayerKind, ...]
  calls_per_step: int
  rows_per_call: int
  whole_seconds: float | None = None
  whole_note: str | None = None
  parallel_heads: plan_lib.PairsAtOnce = None
  plan_is_configured: bool = True

  @property
  def flops_per_step(self) -> float:
    """Floating-point operations of a step's forward and gradient, on one
    device."""
    return sum(k.flops * k.count for k in self.kinds) * self.calls_per_step

  def _layer_sum(self, setting: str) -> float | None:
    """Every kind's call time at `setting` (a `LayerKind` field: 'seconds',
    'configured_seconds', 'best_seconds'), times its layers and the calls
    per step; None where a kind has none. A kind without arithmetic (XLA
    counts no operation: a swap, a shape check) adds nothing: its time is
    a call's launch alone, which a step that fuses it into a neighbour's
    program does not pay."""
    timed = [
      (getattr(k, setting) if k.flops > 0 else 0.0, k.count) for k in self.kinds
    ]
    if any(seconds is None for seconds, _ in timed):
      return None
    return (
      sum(float(seconds or 0.0) * count for seconds, count in timed)
      * self.calls_per_step
    )

  @property
  def layer_seconds(self) -> float | None:
    """Every kind's call time at the plan's setting, times its layers and
    the calls per step (`_layer_sum`); None where a kind was not timed."""
    return self._layer_sum('seconds')

  @property
  def configured_layer_seconds(self) -> float | None:
    """`layer_seconds` with every kind as the model configures it; None
    where a kind was not timed so (not timed, or refused for memory)."""
    return self._layer_sum('configured_seconds')

  @property
  def best_layer_seconds(self) -> float | None:
    """`layer_seconds` with each kind at its fastest setting timed."""
    return self._layer_sum('best_seconds')

  @property
  def seconds(self) -> float | None:
    """The floor in seconds at the plan's setting: the least of the layer
    by layer sum and the whole program's time (None where neither was
    timed)."""
    return _least(self.layer_seconds, self.whole_seconds)

  @property
  def configured_seconds(self) -> float | None:
    """The floor in seconds with the attention pairs at once as the model
    configures them: the layer by layer sum so, or the whole program's
    time where the plan's setting is the config's (None where neither was
    timed)."""
    whole = self.whole_seconds if self.plan_is_configured else None
    return _least(self.configured_layer_seconds, whole)

  @property
  def best_seconds(self) -> float | None:
    """The floor in seconds with each attention kind at its fastest
    setting timed: at most `seconds` and `configured_seconds`, which are
    among the settings timed."""
    return _least(self.best_layer_seconds, self.whole_seconds)

  def shares(self) -> list[tuple[LayerKind, float, float | None]]:
    """(kind, its share of the layer by layer floor, its TFLOP/s) of each
    timed kind with arithmetic, largest share first: which layers hold the
    step back. Empty where a kind was not timed."""
    total = self.layer_seconds
    if not total:
      return []
    found = []
    for kind in self.kinds:
      if kind.flops <= 0 or not kind.seconds:
        continue
      seconds = kind.seconds * kind.count * self.calls_per_step
      found.append((kind, seconds / total, kind.flops / kind.seconds / 1e12))
    return sorted(found, key=lambda f: -f[1])

  def tflops_per_second(self, step_seconds: float | None) -> float | None:
    """The step's achieved rate, TFLOP/s, at `step_seconds` a step."""
    if not step_seconds:
      return None
    return self.flops_per_step / step_seconds / 1e12

  def _share(
    self, kind: LayerKind, share: float, rate: float | None
  ) -> dict[str, Any]:
    """One entry of run_stats.json's `shares`."""
    per_step = kind.count * self.calls_per_step
    entry = {
      'name': kind.name,
      'count': kind.count,
      'share_of_floor': share,
      'tflops_per_second': rate,
      'seconds_per_step': (kind.seconds or 0.0) * per_step,
      'attention': kind.is_attention,
    }
    if kind.is_attention:
      entry.update(
        configured_tflops_per_second=_rate(kind.flops, kind.configured_seconds),
        best_tflops_per_second=_rate(kind.flops, kind.best_seconds),
        best_parallel_heads=kind.best_parallel_heads,
        configured_parallel_heads=kind.configured_parallel_heads,
      )
    return entry

  def as_json(self) -> dict[str, Any]:
    """The floor as run_stats.json keeps it."""
    return {
      'rows_per_call': self.rows_per_call,
      'calls_per_step': self.calls_per_step,
      'flops_per_step': self.flops_per_step,
      'step_floor_seconds': self.seconds,
      'configured_step_floor_seconds': self.configured_seconds,
      'best_step_floor_seconds': self.best_seconds,
      'layer_floor_seconds': self.layer_seconds,
      'configured_layer_floor_seconds': self.configured_layer_seconds,
      'best_layer_floor_seconds': self.best_layer_seconds,
      'whole_program_seconds': self.whole_seconds,
      'whole_program_note': self.whole_note,
      'kinds': [
        {**dataclasses.asdict(k), 'attention': k.is_attention}
        for k in self.kinds
      ],
      'shares': [
        self._share(kind, share, rate) for kind, share, rate in self.shares()
      ],
      'parallel_heads': self.parallel_heads,
      'plan_is_configured': self.plan_is_configured,
    }


def _least(*seconds: float | None) -> float | None:
  """The least of the figures measured (not None, not 0), or None."""
  found = [t for t in seconds if t]
  return min(found) if found else None


def _rate(flops: float, seconds: float | None) -> float | None:
  """TFLOP/s of `flops` in `seconds`, None where not timed."""
  return flops / seconds / 1e12 if seconds else None


def _abstract(tree: PyTree) -> PyTree:
  return jax.tree_util.tree_map(
    lambda x: jax.ShapeDtypeStruct(np.shape(x), np.dtype(x.dtype)), tree
  )


def _with_rows(signature: PyTree, rows: int) -> PyTree:
  """`signature` (ShapeDtypeStructs with the batch first) at `rows` rows."""
  return jax.tree_util.tree_map(
    lambda s: jax.ShapeDtypeStruct((rows,) + tuple(s.shape[1:]), s.dtype),
    signature,
  )


def _layer_key(layer: tl.Layer, inputs: PyTree) -> tuple[Any, ...]:
  """Layers with equal keys compile to the same program."""
  return (
    type(layer),
    str(layer),
    jax.tree_util.tree_structure(inputs),
    tuple((s.shape, s.dtype) for s in jax.tree_util.tree_leaves(inputs)),
    tuple(
      (np.shape(w), np.dtype(w.dtype))
      for w in jax.tree_util.tree_leaves(layer.weights)
    ),
  )


def _forward_and_gradient(
  layer: tl.Layer, is_loss: bool, parallel_heads: plan_lib.PairsAtOnce = None
):
  """(inputs, weights, state, rng, cotangents) -> (gradients in the inputs
  and weights, outputs), as trax differentiates `layer.pure_fn`, its
  attention layers traced with `parallel_heads` (example, head) pairs at
  once (`attention_heads.at_once`; None: as configured)."""

  def outputs(x, w, state, rng):
    return layer.pure_fn(x, w, state, rng, use_cache=False)[0]

  def scalar(x, w, state, rng, ct):
    y = outputs(x, w, state, rng)
    if is_loss:
      return jnp.sum(y), y
    # The gradient of <y, ct>: the vjp of the outputs' cotangents `ct`.
    value = sum(
      (
        jnp.vdot(a, c)
        for a, c in zip(jax.tree_util.tree_leaves(y), ct)
        if jnp.issubdtype(a.dtype, jnp.inexact)
      ),
      jnp.float32(0),
    )
    return value, y

  # The outputs are returned too: a step hands them on, and without them
  # XLA would drop the forward of a layer whose gradient does not need it
  # (a Dense layer's). The whole gradient is traced with the pairs at once
  # set: trax's attention traces its own backward (a loop of its own) after
  # the forward returns.
  return jax.jit(
    attention_heads.traced_at_once(
      jax.grad(scalar, argnums=(0, 1), has_aux=True, allow_int=True),
      [layer],
      parallel_heads,
    )
  )


def _cotangents(layer: tl.Layer, inputs: PyTree) -> list[jax.ShapeDtypeStruct]:
  out = layer.output_signature(trax_shapes.signature(inputs))
  out = out if isinstance(out, (list, tuple)) else (out,)
  return [jax.ShapeDtypeStruct(s.shape, s.dtype) for s in out]


def _example(signature: PyTree, key: Any, device: Any) -> PyTree:
  """Arrays of `signature` on `device`: normal floats, zero ints."""
  leaves, tree = jax.tree_util.tree_flatten(signature)
  keys = jax.random.split(key, max(len(leaves), 1))
  arrays = [
    jax.random.normal(k, s.shape, s.dtype)
    if jnp.issubdtype(s.dtype, jnp.inexact)
    else jnp.zeros(s.shape, s.dtype)
    for k, s in zip(keys, leaves)
  ]
  return jax.device_put(jax.tree_util.tree_unflatten(tree, arrays), device)


def _median_seconds(
  fn: Any,
  args: Sequence[Any],
  warmup: int = WARMUP_CALLS,
  timed: int = TIMED_CALLS,
) -> float:
  times = []
  for i in range(warmup + timed):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    if i >= warmup:
      times.append(time.perf_counter() - t0)
  return statistics.median(times)


def _temp_bytes(compiled: Any) -> int:
  analysis = compiled.memory_analysis()
  return int(getattr(analysis, 'temp_size_in_bytes', 0) or 0)


def _flops(compiled: Any) -> float:
  """XLA's count of floating-point operations of a compiled or lowered
  program (`jax.stages.Compiled` or `Lowered`)."""
  analysis = compiled.cost_analysis()
  if analysis is None:
    raise ValueError(
      f'the {jax.default_backend()} backend gives no cost analysis of a '
      'program: its floating-point operations cannot be counted'
    )
  if isinstance(analysis, (list, tuple)):  # One entry per program.
    analysis = analysis[0] if analysis else {}
  # The TPU's analysis gives a program of data movement alone -2.
  return max(0.0, float((analysis or {}).get('flops', 0.0)))


def _program(
  layer: tl.Layer,
  is_loss: bool,
  parallel_heads: plan_lib.PairsAtOnce,
  signature: Sequence[Any],
) -> Any:
  """`layer`'s forward and gradient (`_forward_and_gradient`) at
  `parallel_heads` pairs at once, compiled for `signature` (inputs,
  weights, state, rng, cotangents); as XLA's compiler raises."""
  fn = _forward_and_gradient(layer, is_loss, parallel_heads)
  return fn.lower(*signature).compile()


def _pairs_run(
  heads: Sequence[tuple[int, int | None]], n: int | None, rows: int
) -> tuple[int, ...]:
  """The pairs each attention layer (`attention_heads.layer_heads`)
  computes at once in a call of `rows` rows set to n (None: as each is
  configured, its own None: all), as trax clamps them."""
  found = []
  for h, own in heads:
    setting = own if n is None else n
    found.append(rows * h if setting is None else min(setting, rows * h))
  return tuple(found)


def _label(
  heads: Sequence[tuple[int, int | None]], n: int | None, rows: int
) -> int | None:
  """Setting n as a number of pairs at once: the pairs every attention
  layer computes at once where they agree; n where they do not (None: as
  configured)."""
  run = set(_pairs_run(heads, n, rows))
  return run.pop() if len(run) == 1 else n


def parallel_heads_settings(
  heads: Sequence[tuple[int, int | None]],
  rows: int,
  planned: int | None = None,
  limit: int = MAX_SETTINGS,
) -> list[int | None]:
  """The settings of pairs at once a floor times for an attention kind.

  In order, each that runs its pairs otherwise than those before it: the
  plan's (`planned`; first, always), the config's (None), all of a call's
  pairs at once (`attention_heads.all_pairs`), then halvings of that, down
  to the config's least; each a number trax accepts
  (`attention_heads.runs_at`); at most `limit`.

  Args:
    heads: (heads, configured `n_parallel_heads` or None) of the kind's
      attention layers (`attention_heads.layer_heads`).
    rows: int, rows of one call.
    planned: int or None, the plan's `parallel_heads` (None: as
      configured).
    limit: int, the most settings.

  Returns:
    list of int or None (None: as configured); [] without attention.
  """
  if not heads:
    return []
  every = attention_heads.all_pairs(heads, rows)
  candidates: list[int | None] = [None, every]
  least = min(_pairs_run(heads, None, rows))
  half = every // 2
  while half > least:
    candidates.append(half)
    half //= 2
  found = [planned]
  seen = {_pairs_run(heads, planned, rows)}
  for n in candidates:
    if len(found) >= limit:
      break
    if n is not None and not attention_heads.runs_at(heads, n, rows):
      continue
    run = _pairs_run(heads, n, rows)
    if run not in seen:
      seen.add(run)
      found.append(n)
  return found


def _setting_seconds(
  layer: tl.Layer,
  is_loss: bool,
  n: int | None,
  signature: Sequence[Any],
  args: Sequence[Any],
) -> float | None:
  """The median seconds of `layer`'s forward and gradient at n pairs at
  once (fewer calls than the plan's setting), or None where the backend
  refuses its program for memory, compiling or running it."""
  try:
    compiled = _program(layer, is_loss, n, signature)
    return _median_seconds(
      compiled, args, SETTING_WARMUP_CALLS, SETTING_TIMED_CALLS
    )
  except RuntimeError as e:
    if not out_of_memory.is_out_of_memory(e):
      raise
    logging.info(
      'step floor: %s at %s pairs at once refused for memory: %s',
      layer.name,
      'the configured' if n is None else n,
      out_of_memory.first_line(e),
    )
    return None


def _settings_timed(
  layer: tl.Layer,
  is_loss: bool,
  settings: Sequence[int | None],
  plan_seconds: float,
  rows: int,
  signature: Sequence[Any],
  args: Sequence[Any],
) -> dict[str, Any]:
  """An attention kind's `LayerKind` fields of its settings: `settings`
  (`parallel_heads_settings`, the plan's first, timed already in
  `plan_seconds`), the others timed here."""
  heads = attention_heads.layer_heads([layer])
  timed = [(settings[0], plan_seconds)] + [
    (n, _setting_seconds(layer, is_loss, n, signature, args))
    for n in settings[1:]
  ]
  configured = _pairs_run(heads, None, rows)
  configured_seconds = next(
    (t for n, t in timed if _pairs_run(heads, n, rows) == configured), None
  )
  best_n, best = min(
    ((n, t) for n, t in timed if t is not None), key=lambda f: f[1]
  )
  return {
    'configured_seconds': configured_seconds,
    'best_seconds': best,
    'best_parallel_heads': _label(heads, best_n, rows),
    'configured_parallel_heads': _label(heads, None, rows),
    'parallel_heads_seconds': tuple(
      (_label(heads, n, rows), t) for n, t in timed
    ),
  }


def layer_inputs(
  blocks: Sequence[tuple[Sequence[tl.Layer], Sequence[tl.Layer]]],
  loss_layer: tl.Layer,
  batch: PyTree,
) -> list[tuple[tl.Layer, PyTree]]:
  """Each layer of a step with the signature of its inputs, in order.

  Args:
    blocks: the (standard layers, reversible layers) blocks of
      `trax.optimizers.trainer.extract_reversible_blocks`, initialized.
    loss_layer: its loss layer.
    batch: the batch or its `jax.ShapeDtypeStruct`s, e.g. (inputs, targets,
      weights) each (B, ...).

  Returns:
    list of (layer, inputs as `jax.ShapeDtypeStruct`s), the loss layer
    last.
  """
  stack = _abstract(tuple(jax.tree_util.tree_leaves(batch)))
  found = []
  for std_layers, rev_layers in blocks:
    for layer in list(std_layers) + list(rev_layers):
      inputs = cb.inputs_from_stack(stack, layer.n_in)
      found.append((layer, inputs))
      out = layer.output_signature(trax_shapes.signature(inputs))
      out = _abstract(out)
      stack = cb.outputs_onto_stack(out, stack, layer.n_in)
  found.append((loss_layer, cb.inputs_from_stack(stack, loss_layer.n_in)))
  return found


def _planned_for(n: plan_lib.PairsAtOnce, layer: tl.Layer) -> int | None:
  """The pairs at once a plan's setting n sets for `layer`'s attention
  (`attention_heads.for_layer`; by kind, its kind's number; None: as
  configured)."""
  found = attention_heads.attention_layers([layer])
  return attention_heads.for_layer(n, found[0]) if found else None


def measure(
  model: tl.Layer,
  loss_layer: tl.Layer,
  batch: PyTree,
  rows_per_call: int,
  device: Any = None,
  timed: bool = True,
  parallel_heads: plan_lib.PairsAtOnce = None,
  only: Callable[[tl.Layer], bool] | None = None,
  settings: bool = True,
) -> StepFloor:
  """The floor of a step of `model` and `loss_layer` on `batch`'s shapes.

  Compiles each distinct layer's forward and gradient at `rows_per_call`
  rows and, if `timed`, times it on `device`, one kind after another (one
  kind's arrays on the device at a time); with `settings`, each attention
  kind at its other settings of pairs at once too
  (`parallel_heads_settings`).

  Args:
    model: the trax model, initialized (e.g. a Loop's training model).
    loss_layer: the loss layer the step trains it with (e.g. a
      `TrainTask`'s `loss_layer`), initialized or not.
    batch: arrays or `jax.ShapeDtypeStruct`s of one device's batch, each
      (B, ...), B the rows of one device's step.
    rows_per_call: int, rows of one call, dividing B.
    device: the `jax.Device` to time on; None: the default device.
    timed: False: count the operations only (nothing runs).
    parallel_heads: int, None or a `plan.PairsByKind`: trax's efficient
      attention layers compute that many (example, head) pairs at once
      (as the plan's `parallel_heads` sets them: `attention_heads.at_once`;
      by kind, each kind its own); None: as the model configures them.
    only: a predicate on layers, or None: only the layers it accepts are
      compiled and timed (e.g. `attention_heads.attention_layers`' holders).
    settings: bool, also time each attention kind (when `timed`) as
      configured, all pairs at once and halvings of that, at most
      `MAX_SETTINGS` settings with the plan's, with fewer calls; a setting
      the backend refuses for memory is skipped. False: the plan's only
      (`configured_seconds` and `best_seconds` of an attention kind None).

  Returns:
    `StepFloor`.

  Raises:
    ValueError: rows_per_call does not divide B.
    As XLA's compiler: a program at the plan's setting the backend
      refuses (on a TPU, for memory: `jax.errors.JaxRuntimeError`
      RESOURCE_EXHAUSTED).
  """
  leaves = jax.tree_util.tree_leaves(batch)
  batch_rows = int(np.shape(leaves[0])[0])
  if rows_per_call < 1 or batch_rows % rows_per_call:
    raise ValueError(
      f'rows_per_call = {rows_per_call} does not divide the batch of '
      f'{batch_rows} rows.'
    )
  device = device or jax.devices()[0]
  blocks, loss = stock_trainer.extract_reversible_blocks([model, loss_layer])
  per_call = _with_rows(_abstract(tuple(leaves)), rows_per_call)
  pending: dict[Any, list[Any]] = {}
  order = []
  placed = layer_inputs(blocks, loss, per_call)
  for position, (layer, inputs) in enumerate(placed):
    is_loss = position == len(placed) - 1
    if only is not None and not only(layer):
      continue
    key = ('loss',) if is_loss else _layer_key(layer, inputs)
    if key not in pending:
      label = layer.name or type(layer).__name__
      name = 'loss' if is_loss else f'{label} (layer {position})'
      pending[key] = [name, 0, layer, inputs, is_loss]
      order.append(key)
    pending[key][1] += 1
  rng = jax.random.PRNGKey(0)
  kinds = []
  every_kind: list[tuple[str, int, int | None]] = []
  for key in order:
    name, count, layer, inputs, is_loss = pending[key]
    ct = [] if is_loss else _cotangents(layer, inputs)
    weights = _abstract(layer.weights)
    state = _abstract(layer.state)
    rng_sig = jax.ShapeDtypeStruct(rng.shape, rng.dtype)
    signature = (inputs, weights, state, rng_sig, ct)
    compiled = _program(layer, is_loss, parallel_heads, signature)
    flops = _flops(compiled)
    attention = attention_heads.layer_heads([layer])
    every_kind += attention_heads.layer_kinds([layer])
    if attention:
      # All of a call's pairs at once: no loop for XLA to count once.
      # Lowered even where the program ran them so: one count (the
      # unoptimized program's) at any number of pairs at once.
      every_pair = _forward_and_gradient(
        layer, is_loss, attention_heads.all_pairs(attention, rows_per_call)
      )
      # Lowered for the CPU backend: a TPU (a PJRT plugin) analyses no
      # program it has not compiled (`Lowered.cost_analysis` is None there),
      # and this one need not fit it; the CPU counts the same program's
      # operations before optimization.
      with jax.default_device(jax.local_devices(backend='cpu')[0]):
        flops = _flops(every_pair.lower(inputs, weights, state, rng_sig, ct))
    seconds = None
    fields: dict[str, Any] = {}
    if timed:
      args = (
        _example(inputs, jax.random.PRNGKey(1), device),
        jax.device_put(layer.weights, device),
        jax.device_put(layer.state, device),
        jax.device_put(rng, device),
        _example(ct, jax.random.PRNGKey(2), device),
      )
      seconds = _median_seconds(compiled, args)
      if not attention:
        fields = {'configured_seconds': seconds, 'best_seconds': seconds}
      elif settings:
        fields = _settings_timed(
          layer,
          is_loss,
          parallel_heads_settings(
            attention, rows_per_call, _planned_for(parallel_heads, layer)
          ),
          seconds,
          rows_per_call,
          signature,
          args,
        )
      del args
    kinds.append(
      LayerKind(name, count, flops, seconds, _temp_bytes(compiled), **fields)
    )
  return StepFloor(
    tuple(kinds),
    batch_rows // rows_per_call,
    rows_per_call,
    parallel_heads=parallel_heads,
    # The whole program runs over one device's batch (`measure_whole`).
    plan_is_configured=not attention_heads.changes_kinds(
      every_kind, parallel_heads, batch_rows
    ),
  )


def measure_whole(
  floor: StepFloor,
  model: tl.Layer,
  loss_layer: tl.Layer,
  batch: PyTree,
  device: Any = None,
) -> StepFloor:
  """`floor` with the model's forward and gradient timed as one program.

  The program is the gradient of `tl.Serial(model, loss_layer)` in its
  weights over the whole batch (trax's default `Trainer`'s arithmetic,
  tools/step_floor.py's `grad`), its attention at the floor's pairs at
  once (`StepFloor.parallel_heads`, the plan's). It keeps every layer's
  residuals at once, so it is tried only where they fit: where the device
  reports its size (`memory_stats()['bytes_limit']`) and the layers'
  temporaries, each kind's times its layers and calls, exceed it, the
  floor is returned with a note instead.

  Args:
    floor: the layer by layer floor (`measure`) of the same step.
    model, loss_layer, batch, device: as `measure`'s.

  Returns:
    `StepFloor`: `floor` with `whole_seconds` or `whole_note`.
  """
  device = device or jax.devices()[0]
  needed = sum(k.temp_bytes * k.count for k in floor.kinds) * (
    floor.calls_per_step
  )
  limit = (device.memory_stats() or {}).get('bytes_limit')
  if limit and needed > limit:
    return dataclasses.replace(
      floor,
      whole_note=f'its layers alone keep {needed} bytes, over the '
      f"device's {limit}",
    )
  whole = tl.Serial(model, loss_layer)
  leaves = tuple(jax.tree_util.tree_leaves(batch))
  fn = _forward_and_gradient(whole, True, floor.parallel_heads)
  rng = jax.random.PRNGKey(0)
  try:
    args: tuple[Any, ...] = (
      _example(_abstract(leaves), jax.random.PRNGKey(1), device),
      jax.device_put(whole.weights, device),
      jax.device_put(whole.state, device),
      jax.device_put(rng, device),
      [],
    )
    seconds = _median_seconds(fn, args)
  except Exception as e:  # pylint: disable=broad-except
    # Out of device memory, or a model trax cannot run whole this way.
    return dataclasses.replace(
      floor, whole_note=f'{type(e).__name__}: {str(e).splitlines()[0]}'
    )
  return dataclasses.replace(floor, whole_seconds=seconds)


def rows_per_call(trainer: Any, batch: PyTree, n_devices: int) -> int:
  """The rows of one call of `trainer`'s step on `batch`'s shapes: one
  device's rows, divided by trax_revplus's plan's batch slices and
  micro-batches (the whole of one device's rows for trax's trainers)."""
  rows = int(np.shape(jax.tree_util.tree_leaves(batch)[0])[0]) // n_devices
  planned = getattr(trainer, 'planned', None)
  if planned is None:
    return rows
  plan = planned(batch).plan
  return max(1, rows // (plan.batch_slices * plan.micro_batches))


def parallel_heads(trainer: Any, batch: PyTree) -> plan_lib.PairsAtOnce:
  """The (example, head) pairs at once `trainer`'s step on `batch`'s
  shapes sets for trax's attention layers: trax_revplus's plan's
  `parallel_heads` (None for trax's trainers: as configured)."""
  planned = getattr(trainer, 'planned', None)
  return None if planned is None else planned(batch).plan.parallel_heads


def per_device(batch: PyTree, n_devices: int) -> PyTree:
  """`batch`'s `jax.ShapeDtypeStruct`s for one of `n_devices` devices."""
  rows = int(np.shape(jax.tree_util.tree_leaves(batch)[0])[0])
  return _with_rows(_abstract(batch), rows // n_devices)


def of_loop(loop: Any, batch: PyTree, timed: bool = True) -> StepFloor:
  """The floor of a step of a trax `Loop`'s first task on `batch`'s shapes,
  on this process's first device: layer by layer at the rows of one call of
  its trainer (`rows_per_call`) and the attention pairs at once of its plan
  (`parallel_heads`), each attention kind also as configured and at a few
  other settings (`measure`'s `settings`), and as one program where it fits
  (`measure_whole`).

  Args:
    loop: a `trax.supervised.training.Loop` whose trainers are built.
    batch: the arrays or `jax.ShapeDtypeStruct`s of a training batch of
      this process (B, ...).
    timed: False: count the operations only.

  Returns:
    `StepFloor`.
  """
  model = loop_door.model(loop)
  loss_layer = loop_door.tasks(loop)[0].loss_layer
  trainer = loop_door.trainers(loop)[0]
  n_devices = jax.local_device_count()
  rows = rows_per_call(trainer, batch, n_devices)
  one_device = per_device(batch, n_devices)
  device = jax.local_devices()[0]
  floor = measure(
    model,
    loss_layer,
    one_device,
    rows,
    device,
    timed,
    parallel_heads=parallel_heads(trainer, batch),
  )
  if not timed:
    return floor
  return measure_whole(floor, model, loss_layer, one_device, device)
