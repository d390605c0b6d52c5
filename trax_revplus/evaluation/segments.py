"""The eval model one layer at a time, where its whole forward does not fit.

Where not even one row of the whole model's forward fits the budget (its
weights alone may be larger than the device), the eval runs the model's
layers one compiled program each. trax's `tl.Serial` runs its sublayers
one after another on a stack of arrays, each on the top `n_in` items, each
with its own RNG of the `Serial`'s split over them
(`tl.Serial.forward`); a `Serial` inside a `Serial` does the same on the
items it is given. `steps` opens every layer that runs as a `tl.Serial`
(trax's `Serial`, `Branch`, `Residual`, the reversible `ReversibleSerial`;
not a layer wrapped in shape asserts) down to the layers that do not, in
the order the model's forward runs them, with where their weights, state
and RNG sit in the model's: run one after another on the stack they
compute what the model computes.

Each step is one program over the fewest parts of the rows that fit
(`slices.forward`, as the whole model's), with its weights and state
placed just before it and deleted after it; the stack (the whole batch's
activations between steps) waits on the device, and counts beside each
step's program. Layers computing the same thing (`fingerprints`) share
one program. The metrics layer runs last, on the whole batch.
"""

import dataclasses
from typing import Any, NamedTuple

import jax
from trax import fastmath
from trax import layers as tl
from trax.layers.assert_shape import AssertShape
from trax.layers import combinators

from trax_revplus import byte_sizes
from trax_revplus import device_memory
from trax_revplus import errors
from trax_revplus import placement as placement_lib
from trax_revplus.device_memory import program as program_lib
from trax_revplus.evaluation import planning
from trax_revplus.trainer._plan import options as options_lib
from trax_revplus.trainer._step import fingerprints
from trax_revplus.trainer._step import slices
from trax_revplus.typing import PyTree


class Step(NamedTuple):
  """A layer of the model as its forward runs it.

  Attributes:
    layer: the `tl.Layer`.
    path: its sublayer index in each `Serial` from the model down.
    widths: the sublayers of each of those `Serial`s (its RNG splits).
  """

  layer: tl.Layer
  path: tuple[int, ...]
  widths: tuple[int, ...]


def steps(model: tl.Layer) -> list[Step]:
  """The layers `model`'s forward runs, in order, `tl.Serial`s opened.

  Returns:
    List of `Step`, or [] where a layer object appears twice (trax's
    shared layers take their weights from their first call's cache, which
    separate programs do not share).
  """
  found = []

  def walk(layer, path, widths):
    if _opens(layer):
      n = len(layer.sublayers)
      for i, sub in enumerate(layer.sublayers):
        walk(sub, path + (i,), widths + (n,))
    else:
      found.append(Step(layer, path, widths))

  walk(model, (), ())
  if len({id(s.layer) for s in found}) < len(found):
    return []
  return found


def _opens(layer) -> bool:
  """Whether `layer` runs as a `tl.Serial` of its sublayers, to be opened:
  not where it wraps a layer in trax's shape asserts
  (`assert_shape.AssertFunction`), whose input and output checks compare
  shapes through a dictionary they share while traced, which the rows of
  two programs' parts would set apart."""
  return (
    bool(layer.sublayers)
    and type(layer).forward is tl.Serial.forward
    and not any(isinstance(sub, AssertShape) for sub in layer.sublayers)
  )


def at(tree: Any, path: tuple[int, ...]) -> Any:
  """The item of nested weights or state at `path`."""
  for i in path:
    tree = tree[i]
  return tree


def rngs_function(steps_: list[Step]) -> jax.stages.Wrapped:
  """`fn(rng) -> (each step's RNG, the metrics layer's RNG)`: the keys
  `tl.Serial(model, metrics)` gives them from the eval's `rng`."""

  def rngs(rng):
    split = {(): fastmath.random.split(rng, 2)[0]}

    def of(path, widths):
      if path not in split:
        split[path] = fastmath.random.split(
          of(path[:-1], widths[:-1]), widths[-1]
        )[path[-1]]
      return split[path]

    return (
      [of(s.path, s.widths) for s in steps_],
      fastmath.random.split(rng, 2)[1],
    )

  return jax.jit(rngs)


def layer_function(layer: tl.Layer, parts: int) -> jax.stages.Wrapped:
  """`jit` of `fn(inputs, weights, state, rng) -> outputs`: `layer`'s
  forward over `parts` parts of the rows."""
  forward = slices.forward(
    lambda x, w, s, r: layer.pure_fn(x, w, s, r),
    parts,
    slices.state_rows(layer),
  )
  return jax.jit(lambda x, w, s, r: forward(x, w, s, r)[0])


@dataclasses.dataclass(frozen=True)
class StepPlan:
  """One step's program: its layer's name, `planning.EvalPlan` and what
  the eval holds on the device across it (the stack's other items, the
  RNGs), in bytes."""

  name: str
  plan: planning.EvalPlan
  held_bytes: int

  @property
  def peak_device_bytes(self) -> int:
    program_bytes = self.plan.peak_device_bytes
    assert program_bytes is not None, f'{self.name}: refused, no figure'
    return self.held_bytes + program_bytes


@dataclasses.dataclass(frozen=True)
class SegmentedPlan:
  """The eval one layer at a time: a `StepPlan` per step, the metrics
  layer's last."""

  rows: int
  steps: tuple[StepPlan, ...]

  @property
  def parts(self) -> int:
    """The most parts any step runs over."""
    return max(s.plan.parts for s in self.steps)

  @property
  def peak_device_bytes(self) -> int:
    return max(s.peak_device_bytes for s in self.steps)

  def describe(self, budget_bytes: int | None) -> str:
    """One line: the steps, the parts, the peak and where, the budget."""
    peak = max(self.steps, key=lambda s: s.peak_device_bytes)
    size = lambda n: byte_sizes.format_bytes(n, unit=None)
    limit = (
      'no budget' if budget_bytes is None else f'budget {size(budget_bytes)}'
    )
    rows = (
      f'up to {self.parts} parts of the {self.rows} rows'
      if self.parts > 1
      else f'each on all {self.rows} rows'
    )
    return (
      f'the model one layer at a time ({len(self.steps) - 1} '
      f'programs, {rows}), then the metrics; peak '
      f'{size(self.peak_device_bytes)} in {peak.name}: held '
      f'{size(peak.held_bytes)}, its program '
      f'{size(peak.plan.peak_device_bytes)} ({limit})'
    )


class SegmentsError(planning.EvalMemoryBudgetError):
  """Not even one layer of the eval model fits, one row at a time."""


def _items(stack) -> tuple:
  return tuple(stack) if isinstance(stack, (list, tuple)) else (stack,)


class Segmented:
  """An eval on one batch's shapes, one layer at a time: planned (every
  program compiled and accounted) when made, then called per batch."""

  def __init__(
    self,
    model_with_metrics: tl.Layer,
    device: placement_lib.OneDevice,
    types: tuple[PyTree, PyTree, PyTree, PyTree],
    budget_bytes: int,
  ) -> None:
    """Args:
      model_with_metrics: trax's `tl.Serial(model, metrics_layer)`.
      device: the `placement.OneDevice` it runs on.
      types: (batch, weights, state, rng) as `device.types` gives them.
      budget_bytes: int bytes.

    Raises:
      SegmentsError: a step does not fit even one row at a time.
    """
    model, metrics = model_with_metrics.sublayers
    self._device = device
    batch, weights, state, rng = types
    model_steps = steps(model)
    traced = rngs_function(model_steps).trace(rng)
    self._rngs = traced.lower().compile()
    rngs = device.types(traced.out_info)
    rows = jax.tree_util.tree_leaves(batch)[0].shape[0]
    # (layer, path in the model's weights and state or None: the metrics
    # layer's, its RNG's type, the parts it may run over).
    calls: list[tuple[tl.Layer, tuple[int, ...] | None, PyTree, list[int]]]
    calls = [
      (s.layer, s.path, r, planning.divisors(rows) if s.layer.n_in else [1])
      for s, r in zip(model_steps, rngs[0])
    ]
    calls.append((metrics, None, rngs[1], [1]))
    self._calls, plans, shared, misses = [], [], {}, []
    stack = batch
    for layer, path, rng_type, candidates in calls:
      args = (
        combinators.inputs_from_stack(stack, layer.n_in),
        *device.types(_params(path, weights, state)),
        rng_type,
      )
      held = program_lib.tree_bytes((_items(stack)[layer.n_in :], rngs))
      fns: dict[Any, Any] = {}
      kind = (fingerprints.of(layer), program_lib.types_key(args))

      def weigh(parts, layer=layer, args=args, fns=fns, kind=kind):
        key = (kind, parts)
        if key not in shared:
          traced = layer_function(layer, parts).trace(*args)
          # Kept before compiling, so that a program refused for memory
          # still gives the next step's argument types.
          fns[parts] = (None, traced.out_info)
          shared[key] = (traced.lower().compile(), traced.out_info)
        fns[parts] = shared[key]
        return device_memory.ProgramMemory.from_compiled(shared[key][0])

      plan, least, refusal = planning.search_parts(
        rows, weigh, budget_bytes - held, candidates
      )
      if plan is None:
        assert least is not None  # `search_parts`: where none fits
        # Planned on at its least, for the least of the whole eval.
        misses.append((StepPlan(layer.name, least, held), refusal))
        plan = least
      plans.append(StepPlan(layer.name, plan, held))
      fn, outputs = fns[plan.parts]
      self._calls.append((layer.n_in, path, fn))
      stack = combinators.outputs_onto_stack(
        device.types(outputs), stack, layer.n_in
      )
    if misses:
      raise _nothing_fits(rows, misses, budget_bytes)
    self.plan = SegmentedPlan(rows, tuple(plans))

  def __call__(self, batch, weights, state, rng) -> Any:
    """The metrics of the model with metrics on `batch`, as host arrays;
    arguments as trax's `metrics_fn` takes them."""
    device = self._device
    (stack, rng), copies = device.put((batch, rng))
    try:
      rngs, metrics_rng = self._rngs(rng)
      for (n_in, path, fn), step_rng in zip(
        self._calls, list(rngs) + [metrics_rng]
      ):
        params = _params(path, weights, state)
        placed, params_copies = device.put(params)
        try:
          outputs = fn(
            combinators.inputs_from_stack(stack, n_in), *placed, step_rng
          )
        finally:
          del placed
          device.release(params_copies, params)
        stack = combinators.outputs_onto_stack(outputs, stack, n_in)
      return jax.device_get(stack)
    finally:
      device.release(copies, (batch, rng))


def _params(path, weights, state):
  """(weights, state) of the model's layer at `path`, or of the metrics
  layer (`path` None), from `tl.Serial(model, metrics)`'s."""
  if path is None:
    return weights[1], state[1]
  return at(weights[0], path), at(state[0], path)


def _nothing_fits(rows, misses, budget_bytes):
  """The error where the steps of `misses` ((`StepPlan` at its least,
  the backend's refusal or None)) do not fit `budget_bytes`."""
  size = lambda n: f'{n} bytes ({byte_sizes.format_bytes(n)})'
  refused = [(step, e) for step, e in misses if step.plan.memory is None]
  if refused:
    step, e = refused[0]
    need = (
      f'the backend refused the program of layer {step.name} for '
      f'memory ({errors.one_line(e, max_chars=200)})'
    )
    least, at_least = None, ''
  else:
    step = max((step for step, _ in misses), key=lambda s: s.peak_device_bytes)
    least = step.peak_device_bytes
    need = (
      f'the least needs {size(least)}, at layer {step.name} with the '
      f"rest of the batch's activations ({size(step.held_bytes)}) "
      f'held'
    )
    at_least = f' >= {least}'
  return SegmentsError(
    f'the eval of a batch of {rows} rows does not fit '
    f'device_memory_budget_bytes={size(budget_bytes)} even one layer and '
    f'one row at a time: {need}; set {options_lib.GIN_CONFIGURABLE}.'
    f'device_memory_budget_bytes{at_least}, or use a smaller eval batch '
    f'or shorter sequences.',
    least,
  )
