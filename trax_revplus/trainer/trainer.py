"""ReversibleSerialTrainer: drop-in for `trax.optimizers.ReversibleSerialTrainer`.

The step schedule of trax 1.4.1's memory-efficient trainer, on current JAX:
weights and optimizer slots live on the host as `numpy.ndarray`s, one layer
(or segment of reversible layers) at a time goes to the device(s);
reversible layers recompute their inputs from their outputs on the way
back instead of storing activations; updated weights come back
asynchronously. This module is trax's public surface and the schedule:

  begin step: learning rate, step and per-layer RNGs placed
  batch -> shard over devices
  forward:  for each unit: standard layer, or a segment of reversible
            layers (keep only block inputs and layer states)
  loss:     loss layer forward + backward + optimizer update
  backward: for each unit, last to first: reverse + backward + update
  commit:   every layer's new weights, slots and state back on the host

The other modules of the package (`trax_revplus.trainer`) do the work.
"""

import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

import gin
from trax import fastmath
from trax import layers as tl

from trax_revplus import checkpoints
from trax_revplus import device_memory as device_memory_lib
from trax_revplus import memory
from trax_revplus import placement as placement_lib
from trax_revplus import validation
from trax_revplus.memory import host_release as host_memory
from trax_revplus.trainer import commit
from trax_revplus.trainer import compilation
from trax_revplus.trainer import device_plan as device_plan_lib
from trax_revplus.trainer import hooks as hooks_lib
from trax_revplus.trainer import options as options_lib
from trax_revplus.trainer import plan
from trax_revplus.trainer import step as step_lib
from trax_revplus.trainer import store as store_lib
from trax_revplus.trainer import units as units_lib
from trax_revplus.typing import Array
from trax_revplus.typing import Batch
from trax_revplus.typing import Blocks
from trax_revplus.typing import PRNGKey
from trax_revplus.typing import PyTree


@gin.configurable(module='trax_revplus')
class ReversibleSerialTrainer:
  """Runs an optimizer on a series of layers, reversible and not.

  Drop-in replacement for trax 1.4.1's
  `trax.optimizers.ReversibleSerialTrainer`: same constructor arguments,
  same updates as trax's default `Trainer` on `tl.Serial(blocks +
  [loss_layer])`, same public surface (`one_step`, `loss_layer`,
  `all_layers`, `optimizer_fn`, `slots`), so `training.Loop` uses it
  unchanged. The settings beyond trax's (gin:
  `trax_revplus.ReversibleSerialTrainer.<name>`) are those of
  `options.TrainerOptions`, which documents each: n_async_layers, the
  memory log (memory_log_every_n_steps, memory_log_per_layer,
  memory_log_tensorboard, output_dir), donate, on_non_finite, the segments
  (segment_max_layers, segment_max_bytes, backward_segment_max_layers),
  compile_ahead, and host memory (release_host_memory, host_mmap_threshold,
  clear_compilation_caches).

  Between steps every layer's weights, state and optimizer slots are host
  `numpy.ndarray`s.
  """

  def __init__(self, blocks: Blocks, loss_layer: tl.Layer,
               optimizer_fn: Callable[[], Any],
               n_devices: Optional[int] = None, memoize_jit: bool = True,
               free_accelerators_on_step: bool = False, adasum: bool = False,
               n_async_layers: int = 8, memory_log_every_n_steps: int = 100,
               memory_log_per_layer: bool = False,
               memory_log_tensorboard: bool = True,
               output_dir: Optional[str] = None, donate: bool = True,
               on_non_finite: str = 'raise', segment_max_layers: int = 8,
               segment_max_bytes: int = 32 * 2**20,
               compile_ahead: bool = True, release_host_memory: bool = True,
               host_mmap_threshold: Optional[int] = None,
               backward_segment_max_layers: Any = 'auto',
               clear_compilation_caches: bool = True,
               device_memory_budget_bytes: Optional[int] = None,
               store_activations: str = 'never',
               memory_log_first_steps: int = memory.FIRST_STEPS_RECORDED):
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
      n_async_layers, memory_log_every_n_steps, memory_log_per_layer,
        memory_log_tensorboard, output_dir, donate, on_non_finite,
        segment_max_layers, segment_max_bytes, compile_ahead,
        release_host_memory, host_mmap_threshold,
        backward_segment_max_layers, clear_compilation_caches,
        device_memory_budget_bytes, store_activations,
        memory_log_first_steps: see `options.TrainerOptions`.

    Raises:
      validation.BlockStructureError: blocks are not (standard, reversible)
        pairs, or a reversible list holds a non-reversible layer.
      validation.DeviceCountError: n_devices is not in [1, local devices].
      validation.OptimizerFactoryError (a TypeError): optimizer_fn is an
        optimizer instance, or does not return an `Optimizer`.
      validation.TrainerOptionError (a ValueError): a setting of
        `options.TrainerOptions` out of its range (all checked before any
        layer is placed or compiled).
    """
    validation.check_blocks(blocks)
    validation.check_optimizer_factory(optimizer_fn)
    validation.check_n_devices(n_devices)
    self._options = options = options_lib.TrainerOptions(
        n_async_layers=n_async_layers,
        memory_log_every_n_steps=memory_log_every_n_steps,
        memory_log_first_steps=memory_log_first_steps,
        memory_log_per_layer=memory_log_per_layer,
        memory_log_tensorboard=memory_log_tensorboard,
        output_dir=output_dir, donate=donate, on_non_finite=on_non_finite,
        segment_max_layers=segment_max_layers,
        segment_max_bytes=segment_max_bytes, compile_ahead=compile_ahead,
        release_host_memory=release_host_memory,
        host_mmap_threshold=host_mmap_threshold,
        backward_segment_max_layers=backward_segment_max_layers,
        clear_compilation_caches=clear_compilation_caches,
        device_memory_budget_bytes=device_memory_budget_bytes,
        store_activations=store_activations)
    if options.host_mmap_threshold is not None:
      host_memory.set_mmap_threshold(options.host_mmap_threshold)
    self._loss_layer = loss_layer
    self._optimizer_fn = optimizer_fn
    self._placement = placement_lib.Placement(n_devices)
    self._n_devices = self._placement.n_devices
    self._memory_log = memory.MemoryLog(
        every_n_steps=options.memory_log_every_n_steps,
        first_steps=options.memory_log_first_steps,
        per_layer=options.memory_log_per_layer,
        output_dir=self._files_dir(options.output_dir),
        tensorboard=options.memory_log_tensorboard,
        devices=self._placement.devices)
    # Close the log's files while threads still run: at interpreter exit
    # (weakref.finalize runs from atexit) or when the trainer is collected.
    # Left to garbage collection at exit, TensorBoard's writer waits forever
    # for its already stopped flush thread.
    weakref.finalize(self, self._memory_log.close)

    self._store = store = store_lib.LayerStore(
        blocks, loss_layer, optimizer_fn, self._placement)
    self._pending_init_records = list(store.init_records)
    self._compiler = compilation.Compiler(
        self._placement, store.layers, store.optimizers, memoize_jit,
        options.donate, adasum)
    self._units = units_lib.Units(
        plan.plan_segments(store.block_sizes(), store.params_bytes(),
                           options),
        units_lib.UnitFactory(store.layers, store.optimizers,
                              self._compiler.compile, self._n_devices,
                              adasum))
    self._device_plan = device_plan_lib.DevicePlan(
        self._placement, store, self._units, options)
    self._guard = commit.NonFiniteGuard(
        options.on_non_finite, store, self._describe_last_checkpoint)
    self._commits = commit.CommitQueue(
        self._placement, store, options.n_async_layers, self._guard)
    self._release = (hooks_lib.ReleaseHostMemory()
                     if options.release_host_memory else None)
    self._hooks = self._make_hooks(free_accelerators_on_step)
    self._parts = step_lib.TrainerParts(
        self._placement, store, self._commits, self._hooks, self._memory_log,
        self._release.released_bytes if self._release else None)
    if options.clear_compilation_caches:
      compilation.clear_caches()
    self._release_host_memory()

  def _make_hooks(self, free_accelerators_on_step):
    """The work around each step, in the order it runs at each point."""
    hooks = []
    if free_accelerators_on_step:
      hooks.append(hooks_lib.FreeAccelerators(self._placement,
                                              self._store.keep))
    compile_ahead = (self._options.compile_ahead or
                     self._options.device_memory_budget_bytes is not None)
    hooks.append(hooks_lib.FirstStep(
        self._compile_ahead if compile_ahead else None,
        self._units.decide_backward, self._release_host_memory))
    if self._release:
      hooks.append(self._release)
    return hooks_lib.HookList(hooks)

  def _release_host_memory(self):
    if self._release:
      self._release.release()

  # Public surface of trax's ReversibleSerialTrainer.

  @property
  def loss_layer(self) -> tl.Layer:
    """The loss layer this trainer was created with."""
    return self._loss_layer

  @property
  def all_layers(self) -> List[tl.Layer]:
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
    return self._placement.on_host_device(fastmath.nested_map(
        lambda opt: opt.slots, self._store.trax_optimizers()))

  @slots.setter
  def slots(self, slots: PyTree):
    """Sets the slots of all optimizers (structure as the getter's)."""
    optimizers = self._store.trax_optimizers()
    for ((s_opt, r_opts), (s_slots, r_slots)) in zip(optimizers[:-1],
                                                     slots[:-1]):
      for (opt, slot) in zip([s_opt] + list(r_opts), [s_slots] + list(r_slots)):
        opt.slots = placement_lib.to_numpy(slot)
    optimizers[-1].slots = placement_lib.to_numpy(slots[-1])

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

  def set_output_dir(self, output_dir: Optional[str]):
    """Writes the memory log to `<output_dir>/memory.jsonl` from now on.

    In a multi-process run only process 0 writes files; the others log
    their lines with absl only.
    """
    self._memory_log.set_output_dir(self._files_dir(output_dir))
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

  def one_step(self, batch: Batch, rng: PRNGKey, step: int = 0,
               learning_rate: Optional[float] = None
               ) -> Tuple[Array, Dict[str, Array]]:
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
        gradient norm is NaN/Inf (see `options.TrainerOptions`).
      device_plan.DeviceMemoryBudgetError: with device_memory_budget_bytes,
        no segment plan fits it (before the first step changes anything).
    """
    # In a multi-process run `batch` is this process's rows, for its devices.
    validation.check_batch(batch, self._placement.n_local_devices)
    ctx = self._begin_step(rng, step, learning_rate)
    ctx.stack = self._placement.shard_batch(batch)
    self._hooks.forward_begins(ctx)
    ctx.step_memory = self._step_memory(ctx)
    self._units.forward(ctx)
    ctx.end_phase('forward', ctx.stack)
    self._units.loss(ctx)
    self._hooks.loss_done(ctx)
    ctx.end_phase('loss', ctx.grad_stack)
    self._hooks.loss_phase_ended(ctx)
    self._units.backward(ctx)
    self._commits.drain()
    self._guard.end_step()
    self._hooks.step_ends(ctx)
    ctx.end_phase('backward')
    self._memory_log.end_step(step)
    return ctx.loss_and_stats()

  def _begin_step(self, rng, step, learning_rate):
    """The step's context, once its learning rate, step and RNGs are placed."""
    if self._pending_init_records and self._memory_log.output_dir is not None:
      # Without an output directory the init records already went to the
      # absl log when the layers were placed; `set_output_dir` writes them.
      self._flush_init_records()
    self._memory_log.begin_step(step, self._placement.transfers)
    self._store.set_learning_rate(learning_rate)
    self._commits.begin_step()
    self._guard.begin_step(step)
    ctx = step_lib.StepContext.begin(step, rng, self._parts)
    self._hooks.step_begins(ctx)
    return ctx

  def _compile_ahead(self, ctx):
    """Compiles the step's functions on the types of `ctx`'s arrays,
    accounting its device memory (under a budget: choosing its plan)."""
    self._device_plan.prepare(ctx)

  def _step_memory(self, ctx):
    """The step's `device_memory.StepMemory` for the memory log, or None.

    Accounted when compiled ahead; for new batch shapes on a recorded step
    (which then compiles ahead)."""
    memory = self._device_plan.known(ctx)
    if (memory is None and ctx.recording and
        self._options.compile_ahead and self._device_plan.has_run):
      memory = self._device_plan.prepare(ctx)
    return memory

  def device_memory_of(self, batch: Batch, rng: Optional[PRNGKey] = None,
                       step: int = 1):
    """Device memory of a step on `batch`'s shapes, without running it.

    Compiles the step's programs ahead (as the first step does) and
    composes their XLA memory analyses with what the step holds across
    each call (`device_memory.revplus_trainer`). Under
    device_memory_budget_bytes, chooses the plan first, as step 1 would.

    Args:
      batch: tuple of host arrays or `jax.ShapeDtypeStruct`s of shape
        (B, ...), as `one_step` takes them.
      rng: JAX PRNG key or None (a fixed one).
      step: int, the step number.

    Returns:
      `device_memory.StepMemory` (bytes per device).

    Raises:
      device_memory.UnsupportedTrainerError: the step cannot be compiled
        ahead here.
      device_plan.DeviceMemoryBudgetError: no plan fits the budget.
    """
    batch = device_plan_lib.zeros_batch(batch)
    validation.check_batch(batch, self._n_devices)
    if rng is None:
      rng = fastmath.random.get_prng(0)
    ctx = step_lib.StepContext.begin(step, rng, self._parts)
    ctx.stack = self._placement.shard_batch(batch)
    memory = self._device_plan.prepare(ctx)
    if memory is None:
      raise device_memory_lib.UnsupportedTrainerError(
          "the step's calls cannot all be compiled ahead of it here, so its "
          'device memory cannot be accounted.')
    return memory

  @property
  def device_plan(self) -> device_plan_lib.DevicePlan:
    """The `device_plan.DevicePlan` (budget choice, accounted steps)."""
    return self._device_plan

  def _describe_last_checkpoint(self):
    return checkpoints.describe_last_good(self._memory_log.output_dir)
