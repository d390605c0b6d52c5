"""Device memory of the trainer's step: its figure, and a plan that fits.

`DevicePlan` accounts the step's device memory while compiling it ahead
(`device_memory.revplus_trainer.StepAccount`: the figures are those of the
executables the step then calls), once per batch shapes, for the memory log
(`peak_device_bytes`). With `device_memory_budget_bytes` set it first
chooses the segment plan: the fastest one whose step peak fits the budget.

The speed model ranks plans without timing them: a step's time grows with
its number of compiled calls (each costs a dispatch and host work for its
weights, slots and updates, which longer segments share), and, between
plans with as many calls, with fewer backward calls first (a backward call
also reverses and updates, the larger host work). Candidate segment
lengths are 1, 2, 4 and 8 layers, forward and backward (a backward length
at most the forward one): longer segments compile into programs whose
temporaries grow with their length, and save little dispatch.

With store_activations='auto', once the lengths are chosen, segments keep
their activations (no reversal or recompute in their backward call), last
forward segment first, while the peak stays within the budget: a kept
segment's residuals are held from its forward call to its backward call,
the fewest calls for the last segment.
"""

import dataclasses
from typing import Optional

from absl import logging
import jax
import numpy as np

from trax_revplus import validation
from trax_revplus.device_memory import composition
from trax_revplus.device_memory import revplus_trainer
from trax_revplus.trainer import compilation
from trax_revplus.trainer import options as options_lib
from trax_revplus.trainer import plan as plan_lib
from trax_revplus.trainer import units as units_lib

CANDIDATE_LENGTHS = (1, 2, 4, 8)


class DeviceMemoryBudgetError(validation.ConfigurationError):
  """No segment plan's step fits `device_memory_budget_bytes` (a
  ValueError)."""


@dataclasses.dataclass(frozen=True)
class PlanChoice:
  """A candidate plan and its step's device memory.

  Attributes:
    segment_max_layers, backward_segment_max_layers: the lengths.
    n_calls: compiled calls per step (the speed model's cost).
    n_backward_calls: of them, backward calls.
    peak_device_bytes: the step's composed peak.
    kept_segments: segments that keep their activations
      (store_activations='auto').
  """
  segment_max_layers: int
  backward_segment_max_layers: int
  n_calls: int
  n_backward_calls: int
  peak_device_bytes: Optional[int] = None
  kept_segments: int = 0


def candidates(block_sizes, lengths=None):
  """(forward length, backward length) pairs, fastest first.

  Args:
    block_sizes: list over blocks of their numbers of reversible layers.
    lengths: the segment lengths to try (default `CANDIDATE_LENGTHS`).

  Returns:
    List of `PlanChoice` without peaks, sorted by the speed model (fewest
    calls, then fewest backward calls, then longest forward segments).
  """
  lengths = CANDIDATE_LENGTHS if lengths is None else lengths
  longest = max(block_sizes, default=0)
  usable = sorted({min(n, max(longest, 1)) for n in lengths})
  out = []
  for f in usable:
    for b in usable:
      if b > f:
        continue
      fwd = sum(-(-n // f) for n in block_sizes)
      bwd = sum(sum(-(-len(s) // b) for s in _runs(n, f)) for n in block_sizes)
      n_calls = 2 * len(block_sizes) + fwd + bwd + 1
      out.append(PlanChoice(f, b, n_calls, bwd))
  out.sort(key=lambda c: (c.n_calls, c.n_backward_calls,
                          -c.segment_max_layers))
  return out


def _runs(n, length):
  return [list(range(k, min(n, k + length))) for k in range(0, n, length)]


def batch_key(stack):
  """Hashable shapes, dtypes and shardings of a placed batch."""
  leaves, treedef = jax.tree_util.tree_flatten(stack)
  return treedef, tuple((tuple(x.shape), str(x.dtype),
                         getattr(x, 'sharding', None)) for x in leaves)


class DevicePlan:
  """The trainer's step device memory and, under a budget, its plan."""

  def __init__(self, placement, store, units, options):
    """Args:
      placement: the trainer's `placement.Placement`.
      store: its `store.LayerStore`.
      units: its `units.Units` (re-planned in place under a budget).
      options: its `options.TrainerOptions`.
    """
    self._placement = placement
    self._store = store
    self._units = units
    self._options = options
    self._memory = {}  # batch_key -> composition.StepMemory
    self._programs = compilation.Programs()
    self.choice = None  # PlanChoice the budget chose, or None
    # (PlanChoice, StepMemory) of the smallest candidate when none fits.
    self.smallest = None

  @property
  def has_run(self):
    """Whether a step was accounted (or tried) already."""
    return bool(self._memory)

  @property
  def budget_bytes(self):
    return self._options.device_memory_budget_bytes

  def known(self, ctx):
    """The StepMemory of `ctx`'s batch shapes, if accounted; else None."""
    return self._memory.get(batch_key(ctx.stack))

  def prepare(self, ctx):
    """Before the step's first call: chooses the plan under the budget
    (the first time), compiles the step ahead and accounts it.

    Args:
      ctx: the step's `units.Run`, with its placed batch.

    Returns:
      `composition.StepMemory` of the step, or None where it cannot be
      accounted (then the step compiles its calls as it runs them).

    Raises:
      DeviceMemoryBudgetError: under a budget, no plan fits it, or the step
        cannot be accounted here (it cannot be compiled ahead).
    """
    key = batch_key(ctx.stack)
    if key in self._memory:
      return self._memory[key]
    if self.budget_bytes is not None and self.choice is None:
      try:
        self.choice, memory = self._choose(ctx)
      except (composition.UnsupportedTrainerError,
              composition.AccountingError) as e:
        raise DeviceMemoryBudgetError(
            f'device_memory_budget_bytes cannot be honoured here: {e} Unset '
            f'{options_lib.GIN_CONFIGURABLE}.device_memory_budget_bytes and '
            f'set segment_max_layers instead.') from None
    else:
      try:
        memory = self._account(self._units, ctx)
      except composition.UnsupportedTrainerError:
        memory = None
      except composition.AccountingError as e:
        # The figure is an observation: a step it cannot account for still
        # trains, and its records go without peak_device_bytes.
        logging.warning('device memory: the step could not be accounted, its '
                        'memory records go without peak_device_bytes: %s', e)
        memory = None
    self._memory[key] = memory
    return memory

  def _account(self, units, ctx):
    return revplus_trainer.step_memory(
        self._placement, self._store, units, self._options.n_async_layers,
        ctx, programs=self._programs)

  def _units_for(self, choice):
    options = dataclasses.replace(
        self._options, segment_max_layers=choice.segment_max_layers,
        backward_segment_max_layers=choice.backward_segment_max_layers)
    segment_plan = plan_lib.plan_segments(
        self._store.block_sizes(), self._store.params_bytes(), options)
    return self._units.with_plan(segment_plan)

  def _keep_within(self, units, memory, ctx):
    """Lets segments keep their activations, last forward segment first
    (its residuals are held across the fewest calls), while the step's
    peak stays within the budget."""
    for segment in reversed(units.plan.forward_segments()):
      segment_plan = dataclasses.replace(
          units.plan, keep=units.plan.keep | {segment},
          backward=dict(units.plan.backward))
      segment_plan.backward.pop(segment, None)
      trial = units.with_plan(segment_plan)
      trial_memory = self._account(trial, ctx)
      if trial_memory.peak_device_bytes > self.budget_bytes:
        break
      units, memory = trial, trial_memory
    return units, memory

  def _choose(self, ctx):
    """The fastest candidate whose peak fits; replans `units` to it."""
    budget = self.budget_bytes
    tried = []
    for choice in candidates(self._store.block_sizes()):
      units = self._units_for(choice)
      memory = self._account(units, ctx)
      choice = dataclasses.replace(choice,
                                   peak_device_bytes=memory.peak_device_bytes)
      tried.append((choice, memory))
      if memory.peak_device_bytes <= budget:
        if self._options.store_activations == options_lib.AUTO:
          units, memory = self._keep_within(units, memory, ctx)
          choice = dataclasses.replace(
              choice, peak_device_bytes=memory.peak_device_bytes,
              kept_segments=len(units.plan.keep))
        self._units.replan(units.plan)
        return choice, memory
    self.smallest = min(tried, key=lambda t: t[0].peak_device_bytes)
    need = self.smallest[0].peak_device_bytes
    raise DeviceMemoryBudgetError(
        f'no segment plan fits device_memory_budget_bytes={budget} '
        f'({budget / 2**20:.1f} MiB) on this batch: the smallest step needs '
        f'{need} bytes ({need / 2**20:.1f} MiB); set '
        f'{options_lib.GIN_CONFIGURABLE}.device_memory_budget_bytes >= '
        f'{need}, or use a shorter sequence or a smaller batch.')


def zeros_batch(batch):
  """Host zeros shaped as `batch` (arrays or `jax.ShapeDtypeStruct`s)."""
  return jax.tree_util.tree_map(
      lambda x: np.zeros(x.shape, jax.dtypes.canonicalize_dtype(x.dtype)),
      batch)
