"""ReversibleSerialTrainer: a drop-in for trax's ReversibleSerialTrainer.

The step schedule of trax 1.4.1's memory-efficient trainer, on current JAX:
weights and optimizer slots live on the host as `numpy.ndarray`s, one layer
(or segment of reversible layers) at a time goes to the device(s);
reversible layers recompute their inputs from their outputs on the way
back instead of storing activations; updated weights come back
asynchronously. This module is trax's public surface; a step is

  plan:     on first sight of the batch's shapes, the step's plan, its
            compiled units and device memory (`planner`), fixed from then on
            (or from the step after the fused program compiled, where the
            first steps ran on a plan ready sooner)
  begin:    learning rate, step and per-layer RNGs placed
            (`step_context.StepContext`)
  walk:     the plan's one schedule (`units.Units.walk`): batch placed;
            forward, loss, backward; every layer's new weights, slots and
            state committed on the host (`commit.CommitQueue`)
  result:   the loss and statistics

The package's private sub-packages do the work, each a layer that imports
only those before it: `_plan` (what a step is to do), `_step` (the units
and the run), `_accounting` (device memory), `_search` (the plan a budget
chooses).
"""

import weakref
from typing import Any, Callable

import gin
from trax import fastmath
from trax import layers as tl

from trax_revplus import checkpoints
from trax_revplus import memory
from trax_revplus import placement as placement_lib
from trax_revplus import run_classes
from trax_revplus import validation
from trax_revplus.memory import host_release
from trax_revplus.trainer import oom_report
from trax_revplus.trainer import step_inquiries
from trax_revplus.trainer._plan import options as options_lib
from trax_revplus.trainer._search import budget as budget_lib
from trax_revplus.trainer._search import planner as planner_lib
from trax_revplus.trainer._search import speed_rank
from trax_revplus.trainer._step import commit
from trax_revplus.trainer._step import compilation
from trax_revplus.trainer._step import host_store as store_lib
from trax_revplus.trainer._step import observers
from trax_revplus.trainer._step import step_context
from trax_revplus.trainer._step import unit_factory
from trax_revplus.typing import Array
from trax_revplus.typing import Batch
from trax_revplus.typing import Blocks
from trax_revplus.typing import PRNGKey
from trax_revplus.typing import PyTree


# The gin parameters: trax's arguments, then the settings of
# `options.TrainerOptions` (listed there, once).
GIN_PARAMETERS = (
  'blocks',
  'loss_layer',
  'optimizer_fn',
  'n_devices',
  'memoize_jit',
  'free_accelerators_on_step',
  'adasum',
) + options_lib.TrainerOptions.field_names()


@gin.configurable(module='trax_revplus', allowlist=GIN_PARAMETERS)
class ReversibleSerialTrainer(step_inquiries.StepInquiries):
  """Runs an optimizer on a series of layers, reversible and not.

  Drop-in replacement for trax 1.4.1's
  `trax.optimizers.ReversibleSerialTrainer`: same constructor arguments,
  same updates as trax's default `Trainer` on `tl.Serial(blocks +
  [loss_layer])`, same public surface (`one_step`, `loss_layer`,
  `all_layers`, `optimizer_fn`, `slots`), so `training.Loop` uses it
  unchanged. The settings beyond trax's are keyword arguments (gin:
  `trax_revplus.ReversibleSerialTrainer.<name>`), those of
  `options.TrainerOptions`, which documents each.

  Between steps every layer's weights, state and optimizer slots are host
  `numpy.ndarray`s. A step's plan and device memory, asked without running
  it (`planned`, `device_memory_of`, `least_device_memory_of`, `planner`),
  are `step_inquiries.StepInquiries`'.

  Attributes:
    steps_on_ready_plan: list of the step numbers (`one_step`'s `step`)
      that ran on a plan ready first while the fused program compiled
      (`planner.Planner.step_for`'s `ready_first`), in order.
  """

  gin_parameters = GIN_PARAMETERS

  def __init__(
    self,
    blocks: Blocks,
    loss_layer: tl.Layer,
    optimizer_fn: Callable[[], Any],
    n_devices: int | None = None,
    memoize_jit: bool = True,
    free_accelerators_on_step: bool = False,
    adasum: bool = False,
    **settings: Any,
  ):
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
      **settings: the settings of `options.TrainerOptions` (e.g.
        `device_memory_budget_bytes=2**30`, `n_async_layers=4`).

    Raises:
      validation.BlockStructureError: blocks are not (standard, reversible)
        pairs, or a reversible list holds a non-reversible layer.
      validation.DeviceCountError: n_devices is not in [1, local devices].
      validation.OptimizerFactoryError (a TypeError): optimizer_fn is an
        optimizer instance, or does not return an `Optimizer`.
      validation.TrainerOptionError (a ValueError): an unknown setting, or
        one out of its range (all checked before any layer is placed or
        compiled).
      budget.DeviceMemoryUnknownError (a ValueError): the budget is
        'device' and the backend does not report its devices' size.
    """
    validation.check_blocks(blocks)
    validation.check_optimizer_factory(optimizer_fn)
    validation.check_n_devices(n_devices)
    self._options = options = options_lib.TrainerOptions.of(settings)
    if options.host_mmap_threshold is not None:
      host_release.set_mmap_threshold(options.host_mmap_threshold)
    self._loss_layer = loss_layer
    self._optimizer_fn = optimizer_fn
    self._placement = placement = placement_lib.Placement(n_devices)
    # The backend is open now (the placement or the model's initialization
    # opened it), the layers' weights not yet taken to the host: the
    # baseline a run's measured host peak is read against.
    self._host_rss_backend_open_bytes = memory.host_rss_bytes()
    self._n_devices = placement.n_devices
    budget_bytes = budget_lib.budget_bytes(
      options.device_memory_budget_bytes, placement
    )
    self._memory_log = memory.MemoryLog(
      every_n_steps=options.memory_log_every_n_steps,
      first_steps=options.memory_log_first_steps,
      per_layer=options.memory_log_per_layer,
      output_dir=self._files_dir(options.output_dir),
      tensorboard=options.memory_log_tensorboard,
      devices=placement.devices,
    )
    # Close the log's files while threads still run: at interpreter exit
    # (weakref.finalize runs from atexit) or when the trainer is collected.
    # Left to garbage collection at exit, TensorBoard's writer waits forever
    # for its already stopped flush thread.
    weakref.finalize(self, self._memory_log.close)

    self._store = store = store_lib.LayerStore(
      blocks, loss_layer, optimizer_fn, placement
    )
    self._pending_init_records = list(store.init_records)
    options_lib.check_params_on_device(
      options,
      options_lib.params_on_device_refusal(
        options.on_non_finite, bool(store.ties), placement.processes is not None
      ),
    )
    # The 'start' record names this trainer and its layers; in a Loop,
    # those of the Loop's model instead (`swap`), as the summary does.
    classes = run_classes.of_trainers_and_model([self], store.layers)
    self._memory_log.set_run_classes(classes.trainer, classes.reversible_layers)
    self._compiler = compilation.Compiler(
      placement,
      store.layers,
      store.optimizers,
      memoize_jit,
      options.donate,
      adasum,
    )
    self._planner = planner_lib.Planner(
      placement,
      store,
      unit_factory.UnitFactory(
        store.layers,
        store.optimizers,
        self._compiler.compile,
        self._n_devices,
        adasum,
        store.ties,
        speed_rank.scans_equal_blocks(placement.platform),
      ),
      options,
      budget_bytes,
      explicit=settings,
      fingerprint_of=self._compiler.fingerprint_of if memoize_jit else None,
      host_budget_bytes=budget_lib.host_budget_bytes(
        options.host_memory_budget_bytes, store.host_bytes()
      ),
    )
    self._planner.keep_plans_in(self._files_dir(options.output_dir))
    self._commits = commit.CommitQueue(
      placement, store, options.on_non_finite, self._describe_last_checkpoint
    )
    # Layers whose weights and slots a step that kept them on the device
    # gave up before it stopped on a non-finite value (`one_step`).
    self._given_up: list[int] = []
    self.steps_on_ready_plan: list[int] = []
    self._release = (
      observers.ReleaseHostMemory() if options.release_host_memory else None
    )
    self._parts = step_context.TrainerParts(
      placement,
      store,
      self._commits,
      self._memory_log,
      self._release,
      bool(free_accelerators_on_step),
    )
    if options.clear_compilation_caches:
      compilation.clear_caches()
    self._release_host_memory()

  def _release_host_memory(self):
    if self._release:
      self._release.release()

  # Public surface of trax's ReversibleSerialTrainer.

  @property
  def loss_layer(self) -> tl.Layer:
    """The loss layer this trainer was created with."""
    return self._loss_layer

  @property
  def all_layers(self) -> list[tl.Layer]:
    """All layers in forward order: [std0, rev0..., std1, ..., loss]."""
    return list(self._store.layers)

  @property
  def optimizer_fn(self) -> Callable[[], Any]:
    """The optimizer factory this trainer was created with."""
    return self._optimizer_fn

  @property
  def slots(self) -> PyTree:
    """Slots of all optimizers: [(std slots, [rev slots...]), ..., loss].

    Leaves are `jax.Array`s in host memory (the CPU device), as trax's
    `tl.on_cpu` gives: `training.Loop.load_checkpoint` compares leaves with
    `in [None, ()]`, which numpy arrays cannot answer.
    """
    return self._placement.on_host_device(
      fastmath.nested_map(lambda opt: opt.slots, self._store.trax_optimizers())
    )

  @slots.setter
  def slots(self, slots: PyTree) -> None:
    """Sets the slots of all optimizers (structure as the getter's)."""
    optimizers = self._store.trax_optimizers()
    for (s_opt, r_opts), (s_slots, r_slots) in zip(optimizers[:-1], slots[:-1]):
      for opt, slot in zip([s_opt] + list(r_opts), [s_slots] + list(r_slots)):
        opt.slots = placement_lib.to_numpy(slot)
    self._store.optimizers[-1].slots = placement_lib.to_numpy(slots[-1])

  @property
  def placement(self) -> placement_lib.Placement:
    """The `placement.Placement` this trainer uses."""
    return self._placement

  @property
  def memory_log(self) -> memory.MemoryLog:
    """The `memory.MemoryLog` this trainer records to."""
    return self._memory_log

  @property
  def options(self) -> options_lib.TrainerOptions:
    """The settings beyond trax's this trainer was created with."""
    return self._options

  @property
  def n_compiled_functions(self) -> int:
    """Distinct functions compiled for the step so far (layers computing
    the same thing share one)."""
    return self._compiler.n_compiled_functions

  def set_output_dir(self, output_dir: str | None) -> None:
    """Writes the memory log to `<output_dir>/memory.jsonl` from now on.

    In a multi-process run only process 0 writes files; the others log
    their lines with absl only.
    """
    self._memory_log.set_output_dir(self._files_dir(output_dir))
    self._planner.keep_plans_in(self._files_dir(output_dir))
    self._flush_init_records()

  def _files_dir(self, output_dir):
    """`output_dir`, or None on a process other than 0 of a multi-process
    run: process 0 alone writes the memory log's files."""
    processes = self._placement.processes
    if processes is not None and processes.process_index != 0:
      return None
    return output_dir

  def _flush_init_records(self):
    records, self._pending_init_records = self._pending_init_records, []
    for fields in records:
      self._memory_log.record(0, 'init', **fields)

  # One training step.

  def one_step(
    self,
    batch: Batch,
    rng: PRNGKey,
    step: int = 0,
    learning_rate: float | None = None,
  ) -> tuple[Array, dict[str, Array]]:
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
      RuntimeError: an earlier step that kept weights and slots on the
        device (`plan.StepPlan.params_on_device`) stopped on a non-finite
        value, after its calls had given some of them up.
      validation.BatchSizeError: N does not divide B.
      validation.NonFiniteError: with on_non_finite='raise', the loss or a
        gradient norm is NaN/Inf (see `options.TrainerOptions`).
      validation.BatchSlicesError: the batch slices set do not divide
        each device's rows of the batch (before anything changes).
      planner.DeviceMemoryBudgetError: under a device memory budget, no
        plan fits it, or the backend refuses to compile even the least
        plan's programs for memory (before anything changes).
      budget.HostMemoryBudgetError: no plan fits the host memory budget,
        or without a device budget the plan the settings name exceeds it
        (before anything changes).
      budget.StepCompileError: a program of the step does not compile, for
        a reason other than memory (before anything changes).
      oom_report.DeviceOutOfMemoryError: a call of the step found too
        little device memory (the backend's RESOURCE_EXHAUSTED); the step's
        updates are incomplete.
    """
    # In a multi-process run `batch` is this process's rows, for its devices.
    validation.check_batch(batch, self._placement.n_local_devices)
    ctx = self._begin_step(batch, rng, step, learning_rate)
    try:
      ctx.units.walk(ctx)
    except RuntimeError as e:
      oom_report.raise_if_out_of_memory(e, ctx, self._planner, batch)
      raise
    except validation.NonFiniteError:
      if ctx.plan.params_on_device:
        # Its calls gave up (donated) what they were to replace.
        self._given_up = self._store.given_up()
      raise
    figures = ctx.host_figures(self._host_rss_backend_open_bytes)
    self._memory_log.end_step(step, **figures)
    return ctx.loss_and_stats()

  def _begin_step(self, batch, rng, step, learning_rate):
    """The step's context: its plan (planned now on first sight of the
    batch's shapes), its learning rate, batch, step and RNGs placed."""
    if self._given_up:
      raise RuntimeError(
        f'the weights and slots of layers {self._given_up} were given up on '
        f'the device to a step that stopped on a non-finite value; this '
        f'trainer cannot step again: make another from the last checkpoint.'
      )
    if self._pending_init_records and self._memory_log.output_dir is not None:
      # Without an output directory the init records already went to the
      # absl log when the layers were placed; `set_output_dir` writes them.
      self._flush_init_records()
    self._memory_log.begin_step(step, self._placement.transfers)
    self._store.set_learning_rate(learning_rate)
    planned = self.planned(batch, ready_first=True)
    if planned.while_compiling:
      self.steps_on_ready_plan.append(step)
    self._commits.begin_step(step, planned.plan.params_on_device)
    return step_context.StepContext.for_step(
      planned, step, rng, batch, self._parts
    )

  def _describe_last_checkpoint(self):
    return checkpoints.describe_last_good(self._memory_log.output_dir)
