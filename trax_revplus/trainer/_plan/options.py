"""The trainer's settings beyond trax's, as one frozen, validated object.

Each is a constructor argument of `ReversibleSerialTrainer` and a gin
binding `trax_revplus.ReversibleSerialTrainer.<name>`. `TrainerOptions`
checks them all when it is made, before any layer is placed or compiled
(with `option_checks`); `gin_bindings.validate_gin_bindings` checks the
bound ones without making a trainer.
"""

import dataclasses
import os
from typing import Any, Mapping

import numpy as np

from trax_revplus import validation
from trax_revplus.memory import host_release
from trax_revplus.memory.log import FIRST_STEPS_RECORDED
from trax_revplus.trainer._plan import option_checks as checks

GIN_CONFIGURABLE = 'trax_revplus.ReversibleSerialTrainer'
ON_NON_FINITE = ('raise', 'skip', 'ignore')
AUTO = 'auto'
DEVICE = 'device'
# What segment_max_layers = 'auto' means without a budget (the plan's
# dimensions': `DimensionSetting.unplanned`).
UNPLANNED_SEGMENT_MAX_LAYERS = 8
_DIMENSION = 'plan dimension setting'  # its key in a field's metadata


@dataclasses.dataclass(frozen=True)
class DimensionSetting:
  """The setting of a plan dimension (`trainer._plan.dimensions`): an int
  pins it, 'auto' leaves it to the device memory budget.

  Attributes:
    allowed: str, its range in an error line (before "or 'auto'").
    unplanned: the value a step without a budget runs for 'auto'.
  """

  allowed: str
  unplanned: Any


def dimension_setting(allowed: str, unplanned: Any) -> Any:
  """A `TrainerOptions` field that sets the plan dimension of its name,
  'auto' by default (`DimensionSetting`)."""
  return dataclasses.field(
    default=AUTO, metadata={_DIMENSION: DimensionSetting(allowed, unplanned)}
  )


@dataclasses.dataclass(frozen=True)
class TrainerOptions:
  """Settings of `ReversibleSerialTrainer` beyond trax's arguments.

  Attributes:
    n_async_layers: int >= 0, the copy-back depth: how many layers' calls
      a call's updates wait behind on the device before their commit to
      the host (the rule: `trainer._step.commit`; 0: synchronously). A call
      updates one layer, or every layer of a reversible segment: with the
      default of 8 one call of an 8-layer segment waits, or four of 2-layer
      segments, whose calls are too short to hide the host work of one.
    memory_log_every_n_steps: int >= 1, record memory every N steps
      (`memory.MemoryLog`).
    memory_log_per_layer: bool, also record each compiled call.
    memory_log_tensorboard: bool, write TensorBoard scalars.
    output_dir: str, `os.PathLike` or None, where `memory.jsonl` goes (also
      `ReversibleSerialTrainer.set_output_dir`).
    donate: bool, donate the device buffers of weights and slots to the
      call that replaces them.
    on_non_finite: 'raise' (default): a loss or gradient norm that is NaN
      or Inf stops `one_step` with `validation.NonFiniteError` before the
      layer it belongs to (and every layer after it in the backward order)
      is updated; found at the loss, no weight is updated at all. 'skip':
      the step is undone instead (all weights, slots and state as before
      it; holds the replaced host arrays until the step ends) and
      `one_step` returns the non-finite loss with a warning. 'ignore': no
      check (as trax). Checked when each layer's update is committed, which
      waits for that update anyway.
    segment_max_layers: 'auto' (default) or int >= 1, most consecutive
      reversible layers of a block run in one compiled call (forward: the
      layers in order; backward: reverse + backward + update of each, last
      to first), to save per-call dispatch and host work when layers are
      small. 1 runs one call per layer, as trax. Every layer keeps its own
      weights, optimizer, slots and RNG, so results match per-layer calls.
      Segments of a block have equal lengths (the last one may be
      shorter), so repeated layer patterns give identical segments that
      share one compilation. 'auto': the planner's choice under a device
      memory budget (the fused program, or segments of 1 to 8 layers),
      `UNPLANNED_SEGMENT_MAX_LAYERS` without one. An int pins it: the
      planner then runs segments of that length, never the fused program.
    segment_max_bytes: int >= 0, most bytes of weights + slots a segment
      may hold on the device at once; segments are shortened until every
      one fits, down to one layer (which is never split).
    compile_ahead: bool, compile every function of the first step before
      its first call: the step's walk over its layers runs once on
      argument types (`jax.jit(...).trace`), and each function is compiled
      on a helper thread, one per CPU core (XLA compiles without the GIL),
      beside the others and beside the tracing, instead of one after the
      other between the step's calls. The step's calls wait for all of
      them: compilations beside calls that allocate large activations
      fragment the C allocator's arenas and raise the first backward
      pass's peak host memory. A function whose argument types cannot be
      known ahead compiles when called. The compiled functions and results
      are the same either way.
    release_host_memory: bool, when host RSS has grown by 32 MiB or more
      since the last release, give the memory the C allocator holds free
      back to the system (`memory.host_release`, glibc only), so compiler and
      XLA temporaries freed earlier do not stay under later phases' peak: at
      the end of the constructor, once the first step's functions are
      compiled ahead (`compile_ahead`), after the first call of each
      compiled function (which compiles it where it was not compiled
      ahead), and in every step between the forward and backward passes
      and at the end of the step. Values computed are unaffected.
    host_mmap_threshold: int bytes in [0, 32 MiB] or None (default:
      glibc's own threshold, left as it is). An int fixes glibc's
      `M_MMAP_THRESHOLD` at that value for the whole process
      (`host_release.set_mmap_threshold`; not where `GLIBC_TUNABLES` sets
      it, nor without glibc): blocks of that size or more, e.g. XLA's
      temporaries and buffers, get mappings of their own, returned to the
      system when freed, instead of staying resident in the allocator's
      arenas after glibc's own threshold has risen to 32 MiB: a lower,
      more repeatable peak RSS, for longer steps (a block mapped afresh is
      zero-filled on first touch). Values computed are unaffected.
    backward_segment_max_layers: int >= 1 or 'auto': the most layers of
      one backward call; a forward segment longer than that runs backward
      as several equal-length segments. A backward call (reverse +
      backward + update of each layer) compiles into a much larger program
      than a forward one, whose temporaries grow with its length. 'auto':
      the forward segment's length where its outputs (all devices) hold at
      least 1 MiB, where long calls run fastest; 2 below that, where the
      compiler's memory for a long backward segment would set the peak
      host memory (decided in the first step, once the outputs are known).
      A shorter length lowers the peak of activation-bound models and
      costs speed. Results are the same either way.
    clear_compilation_caches: bool, end the constructor with
      `jax.clear_caches()`: the programs compiled so far in the process,
      typically the layers' initializers, which training never runs again,
      would stay in host memory under every later peak. A function compiled
      before compiles again at its next call. Cleared after the weights and
      slots are on the host, so later temporaries do not land above slots
      that filled the freed memory.
    device_memory_budget_bytes: 'auto' (default), 'device', None or an
      int >= 1: bytes per device the step may use at its peak, as composed
      from XLA's memory analysis of its programs (`device_memory`; the
      figure the memory log records as `peak_device_bytes`). 'auto': the
      device's own size less a reserve where the backend reports it (GPU,
      TPU), what the host can give less the reserve where it does not
      (CPU); 'device': the device's size, and an error where it is not
      reported; None: no budget, the settings as given
      (`trainer._search.budget`).
      Under a budget the trainer plans before the first step on each batch
      shape: it compiles candidate plans (segment lengths, batch slices,
      the fused program, copy-back depth, prefetch;
      `trainer._search.candidates`) and runs the fastest one whose peak
      fits. segment_max_layers and
      batch_slices set to an int pin their dimension of the plan; left at
      'auto' the planner chooses them; n_async_layers is the deepest
      copy-back it tries. If none fits, `one_step` raises
      `planner.DeviceMemoryBudgetError` naming the least budget that
      would, before any weight changes.
    batch_slices: 'auto' (default) or int k >= 1. Every call of the step
      runs over k equal slices of each device's rows of the batch, summing
      the slices' weight gradients before one optimizer update
      (`trainer._step.slices`): per-call temporaries shrink about k-fold, the
      result is the same up to float32 summation order (each slice draws
      its rows of trax's `Dropout` masks: `trainer._step.row_draws`). k must
      divide each device's rows. 'auto': the planner's choice under a
      device memory budget (on the CPU backend 2 rank first where slices
      change no draw and no layer hashes its activations:
      `trainer._search.hashing`), 1 (no slices) without one; an int pins it.
    memory_log_first_steps: int >= 0, steps at the start of each process
      that are recorded too (each waits for its phases to finish, so they
      run slower than unrecorded steps).
    sequence_chunks: 'auto' (default) or int k >= 1. The loss layer's tail
      (its last layers that act on each position alone, and the loss: for
      trax's ReformerLM the concatenation, LayerNorm, Dropout, the Dense to
      the vocabulary and the cross-entropy) runs over k equal chunks of
      the sequence, one after the other, inside the loss layer's own
      program (`trainer._step.loss_tail`, which lists the layers it
      recognises): its temporaries, which for long sequences and large
      vocabularies set the step's peak, shrink about k-fold. Exact up to
      float32 summation order; with dropout in the tail, chunk j draws
      with its layer's RNG of the step folded with j. k must divide the
      sequence length, and the model's loss layer must have such a tail.
      'auto': the planner's choice under a device memory budget (chunks
      only where no plan without them fits), 1 (none) without one; an int
      pins it (an int > 1: the step runs per-layer calls, never the fused
      program, which runs no chunks).
    micro_batches: 'auto' (default) or int m >= 1. The step runs its
      forward and backward passes over m equal parts of each device's rows,
      one after the other, adds each layer's weight gradients of the parts
      together on the device, and applies each layer's optimizer update
      once, in the last part (`trainer._step.batch_parts`): the same update as
      one pass over the batch (exact up to float32 summation order for
      trax's weighted-mean and weighted-sum losses, combined by their
      weight sums). The stack and cotangent stack the step holds across
      its calls are one part's (they shrink m-fold); the accumulated
      gradients (one copy of the weights' size) wait on the device across
      the step, or, where the planner's budget needs it, on the host
      (`plan.StepPlan.grads_on_host`: each part's gradients copied back
      and added there, their sum placed for the last part's update); every
      layer's weights go to the device m times.
      Layer state splits with the rows as batch slices split it; with
      dropout, each part draws with its layers' RNGs of the step. m must
      divide each device's rows; not with `adasum`, weights shared between
      layers, or a loss that is not a weighted mean or sum of its weights.
      'auto': the planner's choice under a device memory budget (parts
      only where no plan without them fits), 1 (none) without one; an int
      pins it (an int > 1: per-layer calls, never the fused program).
    parallel_heads: 'auto' (default) or int n >= 1. trax's efficient
      attention layers (`SelfAttention`, `LSHSelfAttention`,
      `EncDecAttention`, `PureLSHSelfAttention`) compute n of their
      (example, head) pairs at once in every call of the step (all of a
      call's pairs where it has fewer), one group after another (their own
      `n_parallel_heads`, set to n, lower or higher, while the trainer's
      programs are traced: `trainer._step.attention_heads`). Fewer shrink a
      call's attention temporaries (heads x length x length floats at
      once); more fill an accelerator's matrix units; the results are the
      same up to float32 summation order (each pair draws with the same
      RNG either way). n must divide each such layer's heads or be a
      multiple of them, and divide the pairs of a call or be at least all
      of them. 'auto': the planner's choice under a device memory budget,
      in the speed model's order (`trainer._search.speed_rank`: on the CPU
      backend one pair at a time first where no layer hashes its
      activations, `trainer._search.hashing`; on a TPU `SelfAttention`
      layers one example's heads at once first, the other kinds as
      configured; elsewhere the layers as configured first; one pair at a
      time only where nothing else fits), the layers as configured without
      one; an int pins it (above the
      layers' own number as well as below).
    host_memory_budget_bytes: 'auto' (default), None or an int >= 1: host
      bytes the process's step may hold at its peak, as accounted with its
      device memory (the memory log's `peak_host_bytes`: weights, slots and
      state, the batch, what waits on the host, on the CPU backend the
      devices' buffers). 'auto': what the host can give once the backend
      opened and the weights came to the host, less a reserve, plus those
      weights, slots and state (`trainer._search.budget`); None: no host budget.
      Under a device budget no plan over it is chosen; the plan the
      settings name (device_memory_budget_bytes = None) over it is one
      line, `budget.HostMemoryBudgetError`, before any step.
    time_plans: 'auto' (default) or an int >= 0: under a device memory
      budget, how many of the plans that fit are timed on the device
      before the first step on a batch's shapes: the speed model's first
      and the next of its candidate group that run on programs already
      compiled (other copy-back depths, prefetch off: timing compiles
      nothing; not its twin with weights and slots on the host where it
      keeps them on the device, which cannot be faster), and none
      where the first run shows that timing them would take longer than
      compiling their programs did (at least 10 s); the fastest measured
      runs (`trainer._search.plan_timing`: each
      plan's whole step on copies of the weights, slots and states and
      the first batch, one warm-up and the median of 2 runs; nothing it
      runs is kept). A plan whose run fails on the device (out of memory)
      counts as not fitting and the next is timed. 0, or one plan that
      fits: none is timed, the speed model's first runs. 'auto': 3 on an
      accelerator backend, 0 on the CPU, whose speed model's rules are
      measured (tools/) and where a choice timed on cores other work
      shares would not repeat from run to run. A plan chosen by timing is
      kept (`plan_store`) and a run that reads it back times nothing. The
      chosen plan can differ from run to run with the device's load, and
      plans differ in float32 summation order: set 0 for the speed
      model's choice alone. Without a budget nothing is timed.
    params_on_device: 'auto' (default), True or False: every layer's
      weights and slots stay on the device across steps, as trax's default
      `Trainer` keeps them (`plan.StepPlan.params_on_device`: no copy
      either way, the host gets a copy for a checkpoint), or they live on
      the host and go to the device for each call, as stock's
      memory-efficient trainer. 'auto': the planner's choice under a
      device memory budget: on an accelerator each plan with them on the
      device first, then the same plan with them on the host (where the
      step's peak leaves no room for them); on the CPU backend on the host
      (its device buffers are host memory, so neither way copies:
      `trainer._search.speed_rank.SPEED_PARAMS_ON_DEVICE`); on the host
      without a budget. True pins them on the device, False on the host.
      Not where layers share weights, in a multi-process run, or with
      on_non_finite = 'skip' (True there is one line, before any step).
  """

  n_async_layers: int = 8
  memory_log_every_n_steps: int = 100
  memory_log_per_layer: bool = False
  memory_log_tensorboard: bool = True
  output_dir: str | os.PathLike | None = None
  donate: bool = True
  on_non_finite: str = 'raise'
  segment_max_layers: int | str = AUTO
  segment_max_bytes: int = 32 * 2**20
  compile_ahead: bool = True
  release_host_memory: bool = True
  host_mmap_threshold: int | None = None
  backward_segment_max_layers: int | str = AUTO
  clear_compilation_caches: bool = True
  device_memory_budget_bytes: int | str | None = AUTO
  memory_log_first_steps: int = FIRST_STEPS_RECORDED
  batch_slices: int | str = dimension_setting(
    "an int >= 1 that divides each device's rows of the batch (1: no slices)",
    unplanned=1,
  )
  sequence_chunks: int | str = dimension_setting(
    'an int >= 1 that divides the sequence length (1: no chunks)', unplanned=1
  )
  micro_batches: int | str = dimension_setting(
    "an int >= 1 that divides each device's rows of the batch (1: one pass)",
    unplanned=1,
  )
  parallel_heads: int | str = dimension_setting(
    'an int >= 1 (1: one attention head at a time)', unplanned=None
  )
  host_memory_budget_bytes: int | str | None = AUTO
  time_plans: int | str = AUTO
  params_on_device: bool | str = AUTO

  def __post_init__(self):
    """Checks every setting; ints are stored as Python ints.

    Raises:
      validation.TrainerOptionError: a setting out of its range, the first
        in field order.
    """
    checks.check_int(self, 'n_async_layers', 0)
    checks.check_int(
      self,
      'memory_log_every_n_steps',
      1,
      allowed='an int >= 1 (1 records every step)',
    )
    checks.check_int(self, 'memory_log_first_steps', 0)
    for name in ('memory_log_per_layer', 'memory_log_tensorboard', 'donate'):
      checks.check_bool(self, name)
    if not (
      self.output_dir is None or isinstance(self.output_dir, (str, os.PathLike))
    ):
      raise validation.TrainerOptionError(
        'output_dir', self.output_dir, 'None or a directory path (str)'
      )
    if self.on_non_finite not in ON_NON_FINITE:
      raise validation.TrainerOptionError(
        'on_non_finite', self.on_non_finite, f'one of {ON_NON_FINITE}'
      )
    if self.segment_max_layers != AUTO:
      checks.check_int(
        self,
        'segment_max_layers',
        1,
        allowed=f"an int >= 1 (1: one call per layer) or '{AUTO}'",
      )
    checks.check_int(self, 'segment_max_bytes', 0)
    checks.check_bool(self, 'compile_ahead')
    checks.check_bool(self, 'release_host_memory')
    if self.host_mmap_threshold is not None:
      limit = host_release.MAX_MMAP_THRESHOLD_BYTES
      checks.check_int(
        self,
        'host_mmap_threshold',
        0,
        limit,
        allowed=f"None (glibc's own threshold) or an int number of "
        f"bytes in [0, {limit}] (glibc's limit)",
      )
    if self.backward_segment_max_layers != AUTO:
      checks.check_int(
        self,
        'backward_segment_max_layers',
        1,
        allowed=f"an int >= 1 or '{AUTO}'",
      )
    checks.check_bool(self, 'clear_compilation_caches')
    if self.device_memory_budget_bytes not in (None, AUTO, DEVICE):
      checks.check_int(
        self,
        'device_memory_budget_bytes',
        1,
        allowed=f"'{AUTO}', '{DEVICE}', None or an int number of bytes >= 1",
      )
    for name, setting in self.dimension_settings().items():
      if getattr(self, name) != AUTO:
        checks.check_int(
          self, name, 1, allowed=f"{setting.allowed} or '{AUTO}'"
        )
    if self.host_memory_budget_bytes not in (None, AUTO):
      checks.check_int(
        self,
        'host_memory_budget_bytes',
        1,
        allowed=f"'{AUTO}', None or an int number of bytes >= 1",
      )
    if self.time_plans != AUTO:
      checks.check_int(
        self, 'time_plans', 0, allowed=f"'{AUTO}' or an int >= 0 (0: none)"
      )
    if not isinstance(self.params_on_device, (bool, np.bool_)):
      if self.params_on_device != AUTO:
        raise validation.TrainerOptionError(
          'params_on_device', self.params_on_device, f"True, False or '{AUTO}'"
        )
    else:
      checks.check_bool(self, 'params_on_device')

  @classmethod
  def of(cls, settings: Mapping[str, Any]) -> 'TrainerOptions':
    """`TrainerOptions(**settings)`, an unknown name as a one-line error.

    Raises:
      validation.TrainerOptionError: a name that is not a setting, or a
        setting out of its range.
    """
    checks.check_names(GIN_CONFIGURABLE, settings, cls.field_names())
    return cls(**settings)

  def pinned(self, name: str) -> Any:
    """The value the user gave for setting `name` (segment_max_layers,
    backward_segment_max_layers, params_on_device or one of the plan's
    dimensions), or None where it is 'auto'."""
    value = getattr(self, name)
    return None if value == AUTO else value

  def unplanned(self, name: str) -> Any:
    """Setting `name` (segment_max_layers or one of the plan's dimensions,
    `dimension_settings`) as a step without a budget runs it: 'auto'
    resolved to its unplanned value (None: the layers as configured)."""
    value = getattr(self, name)
    if value != AUTO:
      return value
    if name == 'segment_max_layers':
      return UNPLANNED_SEGMENT_MAX_LAYERS
    return self.dimension_settings()[name].unplanned

  @classmethod
  def dimension_settings(cls) -> dict[str, DimensionSetting]:
    """{name: `DimensionSetting`} of the settings of the plan's dimensions
    (`dimension_setting`), in field order."""
    return {
      f.name: f.metadata[_DIMENSION]
      for f in dataclasses.fields(cls)
      if _DIMENSION in f.metadata
    }

  @classmethod
  def field_names(cls) -> tuple[str, ...]:
    """The settings' names (tuple of str), in constructor order."""
    return tuple(f.name for f in dataclasses.fields(cls))


def params_on_device_refusal(
  on_non_finite: str, shared_weights: bool, multi_process: bool
) -> str | None:
  """Why a trainer's weights and slots cannot stay on the device across
  steps (`plan.StepPlan.params_on_device`), in words, or None where they
  can.

  Each call gives its weights and slots up to the update that replaces them
  on the device (donated buffers), so: a step skipped for a non-finite
  value could not put them back; a weight two layers share would be given
  up by the first update while the second still reads it; and a run of
  several processes reads its updates through the host.

  Args:
    on_non_finite: the `TrainerOptions.on_non_finite` policy.
    shared_weights: bool, whether layers share weights (`ties.Ties`).
    multi_process: bool, whether the run spans processes.
  """
  if on_non_finite == 'skip':
    return (
      "on_non_finite = 'skip' puts back the weights and slots a skipped "
      'step replaced, which its calls gave up on the device'
    )
  if shared_weights:
    return 'layers of the model share weights'
  if multi_process:
    return 'a run of several processes reads each update through the host'
  return None


def check_params_on_device(
  options: TrainerOptions, refusal: str | None
) -> None:
  """Raises validation.TrainerOptionError: `params_on_device` is True where
  `refusal` (`params_on_device_refusal`) says the weights cannot stay."""
  if options.params_on_device is True and refusal is not None:
    raise validation.TrainerOptionError(
      'params_on_device',
      True,
      None,
      f'trax_revplus.ReversibleSerialTrainer.params_on_device = True: '
      f"{refusal}; set it to False or 'auto'.",
    )
