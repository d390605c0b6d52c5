"""Building a plan's units: their functions, compiled once per computation.

`UnitFactory` makes the units `units.Units` walks, from the step functions
(`step_fns`, over batch slices: `slices`, `loss_slices`), compiled by the
trainer's `compilation.Compiler`.
"""

from typing import Any, Callable, NamedTuple, Sequence

from trax import layers as tl
from trax.optimizers import base as optimizer_base

from trax_revplus.trainer._plan import plan as plan_lib
from trax_revplus.trainer._step import attention_heads
from trax_revplus.trainer._step import chains
from trax_revplus.trainer._step import loss_slices
from trax_revplus.trainer._step import slices
from trax_revplus.trainer._step import step_fns
from trax_revplus.trainer._step import ties as ties_lib
from trax_revplus.trainer._step.fn_kinds import Kind
from trax_revplus.trainer._step.unit_kinds import LossUnit
from trax_revplus.trainer._step.unit_kinds import ReversibleSegment
from trax_revplus.trainer._step.unit_kinds import SelectSegment
from trax_revplus.trainer._step.unit_kinds import StandardUnit
from trax_revplus.trax_door import layers as layer_door


def is_permutation(layer: tl.Layer) -> bool:
  """Whether `layer` is a reversible layer that only permutes its inputs
  (trax's `ReversibleSelect` with each input once: `ReversibleSwap`)."""
  indices = layer_door.select_indices(layer)
  return (
    type(layer).__name__ == 'ReversibleSelect'
    and indices is not None
    and sorted(indices) == list(range(layer.n_in))
  )


def _variant(n_slices, in_call, mode=step_fns.Update.NOW):
  """What tells compiled functions of equal layers apart: their batch
  slices, the shared weights they pass between their layers, and what
  they do with their gradients (`step_fns.Update`)."""
  variant = (n_slices, in_call) if in_call else n_slices
  return variant if mode is step_fns.Update.NOW else (variant, mode.value)


class _Choices(NamedTuple):
  """What a plan's dimensions choose for each unit's compiled functions.

  Attributes:
    n_slices: int, batch slices each call runs over (`slices`).
    micro: bool, the step runs in micro-batches: backward functions apply
      accumulated gradients, and accumulate functions accumulate them.
    heads: int, None or a `plan.PairsByKind`, attention heads computed
      at once (`attention_heads`; None: as the layers are configured).
    chunks: int, sequence chunks of the loss layer's tail (`loss_slices`).
  """

  n_slices: int
  micro: bool
  heads: plan_lib.PairsAtOnce
  chunks: int


def _choices(plan: plan_lib.StepPlan) -> _Choices:
  """The `_Choices` of `plan`: the one place a plan's dimensions reach the
  compiled functions."""
  return _Choices(
    plan.batch_slices,
    plan.micro_batches > 1,
    plan.parallel_heads,
    plan.sequence_chunks,
  )


def _modes(micro: bool) -> tuple[step_fns.Update, step_fns.Update | None]:
  """(mode of a unit's backward_fn, mode of its accumulate_fn or None)."""
  if micro:
    return step_fns.Update.APPLY, step_fns.Update.ACCUMULATE
  return step_fns.Update.NOW, None


class UnitFactory:
  """Builds units: their functions (`step_fns`, `slices`), compiled by
  `compile`."""

  def __init__(
    self,
    layers: list[tl.Layer],
    optimizers: list[optimizer_base.Optimizer],
    compile_fn: Callable[..., Callable[..., Any]],
    n_devices: int,
    adasum: bool,
    ties: ties_lib.Ties | None = None,
    scan: bool = False,
  ):
    """Args:
    layers, optimizers: lists by layer index (forward order).
    compile_fn: `compilation.Compiler.compile`.
    n_devices: int, devices the gradients are averaged over.
    adasum: bool, average them with Adasum.
    ties: `ties.Ties` of the layers (default: none shared).
    scan: bool, the fused program loops over equal blocks of layers
      (`chains.scanned_forward_fn`) instead of tracing each.
    """
    self._scan = scan
    self._ties = ties if ties is not None else ties_lib.Ties()
    self._layers = layers
    self._optimizers = optimizers
    self._compile = compile_fn
    self._n_devices = n_devices
    self._adasum = adasum
    self.adasum = adasum

  def _donated(self, kind, indices, mode=step_fns.Update.NOW):
    """The arguments `kind` replaces: weights and slots where any of its
    layers has weights (else they are empty), the others always. A call
    that accumulates gradients (`step_fns.Update.ACCUMULATE`) replaces the
    gradients in the slots' place, not the weights."""
    if not any(step_fns.has_weights(self._layers[i]) for i in indices):
      return tuple(i for i in kind.donated if i not in kind.parameters)
    if mode is step_fns.Update.ACCUMULATE:
      return tuple(i for i in kind.donated if i != kind.parameters[0])
    return kind.donated

  def _compiled(self, kind, indices, fn, donated, variant, heads):
    """`compile_fn(kind, indices, fn, donated, variant)`; with `heads`
    (the plan's attention heads at once) where it sets another number of
    pairs at once for an attention layer of `indices`, `fn` traced so
    (`attention_heads`), a variant of its own."""
    layers = [self._layers[i] for i in indices]
    traced = attention_heads.traced_at_once(fn, layers, heads)
    if traced is not fn:
      fn = traced
      # Keyed by what each of these layers runs: settings alike for them
      # (n for all, or by kind) share one program.
      variant = (
        variant,
        'heads at once',
        tuple(
          attention_heads.for_layer(heads, a)
          for a in attention_heads.attention_layers(layers)
        ),
      )
    return self._compile(kind, indices, fn, donated, variant)

  def _rows(self, indices):
    """`slices.Rows` of layers `indices` (how their state splits)."""
    return [slices.state_rows(self._layers[i]) for i in indices]

  def standard(self, i: int, plan: plan_lib.StepPlan) -> StandardUnit:
    """The `StandardUnit` of layer i, as `plan` runs it (`_Choices`): in
    micro-batches its backward_fn applies accumulated gradients and its
    accumulate_fn accumulates them (`step_fns.Update`)."""
    n_slices, micro, heads, _ = _choices(plan)
    layer, opt = self._layers[i], self._optimizers[i]
    rows = self._rows([i])[0]
    forward_fn = self._compiled(
      Kind.FORWARD,
      [i],
      slices.forward(step_fns.forward_fn(layer), n_slices, rows),
      (),
      n_slices,
      heads,
    )
    kind = Kind.FORWARD_BACKWARD_UPDATE

    def backward(mode):
      return mode and self._compiled(
        kind,
        [i],
        slices.fbo(
          layer, opt, self._n_devices, self._adasum, n_slices, rows, mode
        ),
        self._donated(kind, [i], mode),
        _variant(n_slices, (), mode),
        heads,
      )

    update, accumulate = _modes(micro)
    return StandardUnit(
      i, layer, forward_fn, backward(update), backward(accumulate)
    )

  def segment(
    self, indices: Sequence[int], plan: plan_lib.StepPlan, forward: bool = True
  ) -> ReversibleSegment | SelectSegment:
    """A `ReversibleSegment` as `plan` runs it (see `standard`), or a
    `SelectSegment` where every layer only permutes the stack; without
    `forward` its forward_fn is None."""
    n_slices, micro, heads, _ = _choices(plan)
    layers = [self._layers[i] for i in indices]
    if all(is_permutation(layer) for layer in layers):
      return SelectSegment(indices, layers)
    rows = self._rows(indices)
    forward_fn = None
    if forward:
      forward_fn = self._compiled(
        Kind.SEGMENT_FORWARD,
        indices,
        slices.forward(chains.segment_forward_fn(layers), n_slices, rows),
        (),
        n_slices,
        heads,
      )
    in_call = self._ties.in_call(indices)
    # Weights, slots, the outputs and their cotangents are replaced by the
    # results and never read again: the stacks hold the outputs and
    # cotangents alone (a standard layer's saved inputs are popped before
    # this backward runs), and the reconstructed inputs and input
    # cotangents can take their buffers.
    kind = Kind.SEGMENT_REVERSE_UPDATE

    def backward(mode):
      return mode and self._compiled(
        kind,
        indices,
        slices.segment_reverse(
          layers,
          [self._optimizers[i] for i in indices],
          self._n_devices,
          self._adasum,
          n_slices,
          rows,
          in_call,
          mode,
        ),
        self._donated(kind, indices, mode),
        _variant(n_slices, in_call, mode),
        heads,
      )

    update, accumulate = _modes(micro)
    return ReversibleSegment(
      indices, layers, forward_fn, backward(update), backward(accumulate)
    )

  def loss(self, indices: list[int], plan: plan_lib.StepPlan) -> LossUnit:
    """The `LossUnit` of layers `indices` (the loss layer last), as `plan`
    runs it (`_Choices`); the reversible layers before the loss recompute
    their activations in its backward pass (`chains.chain_forward_fn`).
    Over sequence chunks, the loss layer's tail runs over that many chunks
    of the sequence (`loss_slices.loss_fbo`; the loss layer alone only, as
    `plan.StepPlan` holds). In micro-batches (the loss layer alone, as
    `plan.StepPlan` holds) its fn applies accumulated gradients and its
    accumulate_fn accumulates them (`step_fns.Update`).

    Raises:
      ValueError: sequence chunks and the loss layer has no tail to chunk;
        in micro-batches, a loss micro-batches cannot combine.
    """
    n_slices, micro, heads, chunks = _choices(plan)
    layers = [self._layers[i] for i in indices]
    optimizers = [self._optimizers[i] for i in indices]
    depth = chains.chain_depth(layers)
    if len(indices) > 1:
      in_call = self._ties.in_call(indices)
      fn = loss_slices.fused_loss(
        layers,
        optimizers,
        self._n_devices,
        self._adasum,
        n_slices,
        self._rows(indices),
        in_call,
        self._scan,
      )
      kind = Kind.FUSED_LOSS
      return LossUnit(
        indices,
        depth,
        self._compiled(
          kind,
          indices,
          fn,
          self._donated(kind, indices),
          _variant(n_slices, in_call),
          heads,
        ),
      )
    kind = Kind.LOSS
    variant = (n_slices, 'chunks', chunks) if chunks > 1 else (n_slices)

    def program(mode):
      return mode and self._compiled(
        kind,
        indices,
        loss_slices.loss_fbo(
          layers[0],
          optimizers[0],
          self._n_devices,
          self._adasum,
          n_slices,
          chunks,
          mode,
        ),
        self._donated(kind, indices, mode),
        _variant(variant, (), mode),
        heads,
      )

    update, accumulate = _modes(micro)
    return LossUnit(indices, depth, program(update), program(accumulate))
