"""Device memory of a step of stock trax's `ReversibleSerialTrainer`.

trax 1.4.1's memory-efficient trainer runs one compiled program per layer
and phase: each block's standard layer forward (`pure_fn`, jitted), its
reversible layers' forwards, the loss layer's forward + backward + update
(`_fbo_with_layer_and_opt`), then per block, last to first, each
reversible layer's reverse + backward + update
(`_reverse_and_fbo_with_layer_and_opt`, last layer first) and the standard
layer's forward + backward + update. `stock_trainer_step` walks that
schedule as `one_step` runs it on one device, with abstract arrays: each
call's program is lowered and compiled from the trainer's own jitted
functions (nothing is placed or run) and its result types are the next
calls' arguments.

What the device holds across each call follows where `one_step` keeps its
arrays on an accelerator:

  * the stack and the cotangent stack (`grad_stack`) items that are device
    arrays; block inputs saved for the backward pass go to the host
    (`tl.on_cpu`) and come back for their call (`tl.on_accelerator`), and
    the reconstructed stack holds those host copies after a block's
    standard layer;
  * the per-layer RNGs (`random.split`, kept the whole step);
  * arrays still referenced by `one_step`'s locals: during the forward
    pass the block's (and until replaced, the previous block's)
    standard-layer inputs and new state, and its reversible layers' old and
    new states (device arrays, whose host copies are saved);
  * weights updated but not yet copied back (`_lazy_unreplicate`): the
    reversible layer updated just before (`n_async_layers = 1`), and the
    block's first reversible layer during its standard layer's update.

Weights, slots, state and optimizer hyperparameters are placed for each call
(`_replicate`, `tl.on_accelerator`) and released after it, so they count as
the call's own arguments. Not counted: per-layer statistics (scalars).

`start_stock_trainer_step` walks the schedule on the calling thread,
tracing each program there (trax layers hold their weights while traced:
one thread at a time) and compiling it on the compile threads
(`compile_threads`: XLA compiles without the GIL) while the walk goes on
and after it; the next `stock_trainer_step` of the same trainer and
argument types composes the step from those programs: the same programs,
the same figures, and the same error where one does not compile (the
first call whose program failed, as the walk that compiles each program
when it meets it names it).

One device only: on more, stock's `one_step` replicates with
`jax.device_put_replicated`, which current JAX removed.
"""

from typing import TYPE_CHECKING, Callable, Sequence

import jax
import numpy as np

from trax import layers as tl
from trax.layers import combinators as cb

from trax_revplus.device_memory import composition
from trax_revplus.device_memory import program as program_lib
from trax_revplus.device_memory import calls as calls_lib
from trax_revplus.device_memory import programs as programs_lib
from trax_revplus.device_memory import refusals
from trax_revplus.device_memory import started_steps
from trax_revplus.trax_door import trainers as trainer_door
from trax_revplus.typing import PyTree

if TYPE_CHECKING:  # Annotations only: accounting does not import trax.
  from trax import optimizers as trax_optimizers


# Steps `start_stock_trainer_step` walked, by trainer.
_started = started_steps.StartedSteps()


def start_stock_trainer_step(
  trainer: 'trax_optimizers.ReversibleSerialTrainer',
  batch: PyTree,
  step: int = 1,
) -> programs_lib.Programs:
  """Walks one step of stock's `one_step` here, tracing each program, and
  starts their compilations on the compile threads; returns once the walk
  is done. The next `stock_trainer_step` of `trainer` with the same
  arguments composes the step from those programs.

  Returns:
    The `programs.Programs` they compile in (its `compile_spans` time
    them).

  Raises:
    As `stock_trainer_step` while walking: UnsupportedTrainerError,
    whatever tracing raises (or, where a program met before it did not
    compile, that program's error, as `stock_trainer_step` would raise it).
  """
  programs, compose = _walk(trainer, batch, step, True)
  _started.start(trainer, batch, (step,), compose)
  return programs


def stock_trainer_step(
  trainer: 'trax_optimizers.ReversibleSerialTrainer',
  batch: PyTree,
  step: int = 1,
) -> composition.StepMemory:
  """Composes the device memory of one step of stock trax's
  `ReversibleSerialTrainer` on one device (from the programs
  `start_stock_trainer_step` started, where it started this step).

  Args:
    trainer: a `trax.optimizers.trainer.ReversibleSerialTrainer` (trax
      1.4.1's), built (its layers initialized).
    batch: tuple of arrays or `jax.ShapeDtypeStruct`s of shape (B, ...), as
      `one_step` would get it.
    step: int.

  Returns:
    `composition.StepMemory` whose calls are those `one_step` makes, in its
    order: 'forward' per layer, 'loss', 'backward' per layer.

  Raises:
    composition.UnsupportedTrainerError: the trainer runs on more than one
      device.
    Whatever tracing, lowering or compiling the trainer's functions raises
    for these arguments.
  """
  compose = _started.take(trainer, batch, (step,))
  if compose is not None:
    return compose()
  return _walk(trainer, batch, step, False)[1]()


class _AheadCalls:
  """`calls.StepCalls.call` for a walk that compiles ahead: each program is
  traced when the walk meets it and compiled on the compile threads; the
  calls are checked in order once compiled (`check`), so that the error
  raised is the one the walk compiling as it goes raises."""

  def __init__(self, record: calls_lib.StepCalls):
    self._record = record

  def call(
    self,
    name: str,
    phase: str,
    fn: programs_lib.Lowerable,
    args: tuple,
    held: Sequence[tuple[str, PyTree]],
    host_held: Sequence[tuple[str, PyTree]] = (),
  ) -> PyTree:
    record = self._record
    programs = record.programs
    key = programs_lib.call_key(fn, args)
    if key not in programs:
      if not hasattr(fn, 'trace'):  # lowered only: compiled as it goes
        return record.call(name, phase, fn, args, held, host_held)
      programs.add_traced(key, fn, fn.trace(*args), args)
      programs.compile([key])
    on_device = [
      (
        part,
        [
          x
          for x in jax.tree_util.tree_leaves(tree)
          if id(x) in record.on_device
        ],
      )
      for part, tree in held
    ]
    record.note(name, phase, key, args, on_device, host_held)
    return record.device(record.host(programs.outputs(key)))

  def check(self) -> None:
    """Waits for the programs of the calls noted and raises, for the first
    call (in order) whose program did not compile, its error naming the
    call and what the device holds across it (as `StepCalls.call`)."""
    programs = self._record.programs
    # Every compilation started ends first: none runs on once this raises.
    programs.wait()
    for noted in self._record.noted:
      try:
        programs.analysis(noted.key, noted.args)
      except refusals.ProgramCompileError as e:
        raise e.named(
          noted.name,
          sum(h.size_bytes for h in composition.held_parts(noted.held, ())),
        ) from None


def _walk(
  trainer: 'trax_optimizers.ReversibleSerialTrainer',
  batch: PyTree,
  step: int,
  ahead: bool,
) -> tuple[programs_lib.Programs, started_steps.Compose]:
  """Walks the step (`ahead`: tracing its programs, compiling them on the
  compile threads; else compiling each as it is met); returns (the
  `Programs` they compile in, the function composing its `StepMemory`)."""
  n_devices = trainer_door.n_devices(trainer)
  if n_devices != 1:
    raise composition.UnsupportedTrainerError(
      f'stock ReversibleSerialTrainer with n_devices='
      f'{n_devices}: its step replicates with '
      f'jax.device_put_replicated, which current JAX removed; accounted '
      f'on one device only.'
    )
  record = calls_lib.StepCalls(
    devices_on_host=composition.devices_on_host(jax.default_backend(), 1)
  )
  ahead_calls = _AheadCalls(record) if ahead else None
  try:
    _walk_calls(
      trainer,
      batch,
      step,
      record,
      record.call if ahead_calls is None else ahead_calls.call,
    )
  except Exception:
    if ahead_calls is not None:
      # A program met before did not compile: the walk compiling as it
      # goes stopped there, with that error.
      ahead_calls.check()
    raise

  def compose() -> composition.StepMemory:
    if ahead_calls is not None:
      ahead_calls.check()
    return composition.compose(record.calls)

  return record.programs, compose


def _walk_calls(
  trainer: 'trax_optimizers.ReversibleSerialTrainer',
  batch: PyTree,
  step: int,
  record: calls_lib.StepCalls,
  call: Callable[..., PyTree],
) -> None:
  """Walks `one_step`'s schedule, each call through `call`
  (`StepCalls.call`'s arguments and results)."""
  parts = trainer_door.stock_trainer_parts(trainer)
  blocks = parts.blocks
  n_layers = parts.n_layers
  rngs = record.device(jax.ShapeDtypeStruct((n_layers, 2), np.uint32))
  rng_rows = record.device(
    [jax.ShapeDtypeStruct((2,), np.uint32) for _ in range(n_layers)]
  )
  keep: list[tuple[str, PyTree]] = [('rngs', (rngs, rng_rows))]
  weights_of = lambda layer: program_lib.abstract(layer.weights)
  state_of = lambda layer: program_lib.abstract(layer.state)

  # Forward. Locals of one_step that keep device arrays alive until their
  # next assignment.
  stack = program_lib.abstract(
    tuple(batch) if isinstance(batch, list) else batch
  )
  # Per block: (std layer index, host copies of its inputs and new state,
  # of the reversible layers' old and new states).
  saved: list[tuple[int, PyTree, PyTree]] = []
  locals_: dict[str, PyTree] = {}
  # On the host across every call: each layer's weights, state and slots
  # (`tl.on_cpu`), the batch, and the blocks' saved inputs and states.
  between_steps = (
    [layer.weights for layer in trainer.all_layers],
    [layer.state for layer in trainer.all_layers],
    trainer.slots,
  )
  batch_on_host = program_lib.host_types(batch)

  def on_host() -> list[tuple[str, PyTree]]:
    return [
      ('weights, slots and state', between_steps),
      ('batch', batch_on_host),
      ('saved block inputs and states', [s[1:] for s in saved]),
    ]

  k = 0
  for b, (std_layer, rev_layers) in enumerate(blocks):
    std_fn, rev_fns = parts.accelerated_layer_fns[b]
    inputs = cb.inputs_from_stack(stack, std_layer.n_in)
    args: tuple = (
      inputs,
      weights_of(std_layer),
      state_of(std_layer),
      rng_rows[k],
    )
    outputs, new_state = call(
      f'forward layer {k} ({std_layer.name})',
      'forward',
      std_fn,
      args,
      keep + [('stack', stack)] + list(locals_.items()),
      on_host(),
    )
    stack = cb.outputs_onto_stack(outputs, stack, std_layer.n_in)
    locals_['standard-layer inputs and state (one_step locals)'] = (
      inputs,
      new_state,
    )
    std_k = k
    k += 1
    old_states: list[PyTree] = []
    new_states: list[PyTree] = []
    for layer, fn in zip(rev_layers, rev_fns):
      state = record.device(state_of(layer))
      old_states.append(state)
      inputs = cb.inputs_from_stack(stack, layer.n_in)
      args = (inputs, weights_of(layer), state, rng_rows[k])
      outputs, new_state = call(
        f'forward layer {k} ({layer.name})',
        'forward',
        fn,
        args,
        keep
        + [
          ('stack', stack),
          ('reversible layer states', (old_states, new_states)),
        ]
        + list(locals_.items()),
        on_host(),
      )
      stack = cb.outputs_onto_stack(outputs, stack, layer.n_in)
      new_states.append(new_state)
      k += 1
    locals_['reversible layer states (one_step locals)'] = (
      old_states,
      new_states,
    )
    saved.append(
      (
        std_k,
        record.host(
          locals_['standard-layer inputs and state (one_step locals)']
        ),
        record.host((old_states, new_states)),
      )
    )

  # Loss layer: forward, backward and update.
  loss_layer, loss_opt = parts.loss_layer, parts.loss_opt
  loss_inputs = cb.inputs_from_stack(stack, loss_layer.n_in)
  args = (
    loss_inputs,
    weights_of(loss_layer),
    None,
    state_of(loss_layer),
    program_lib.abstract(loss_opt.slots),
    program_lib.abstract(parts.replicated_loss_opt_params),
    rng_rows[k],
    step,
  )
  _, _, _, grad_stack, _ = call(
    f'loss layer {k} ({loss_layer.name})',
    'loss',
    parts.loss_fbo,
    args,
    keep + [('stack', stack)] + list(locals_.items()),
    on_host(),
  )
  locals_.clear()

  # Backward, last block first.
  for b in range(len(blocks) - 1, -1, -1):
    std_layer, rev_layers = blocks[b]
    std_fbo, rev_fbos = parts.fbos[b]
    std_opt, rev_opts = parts.optimizers[b]
    std_params, rev_params = parts.replicated_opt_params[b]
    std_k, (std_inputs, std_state), (old_states, new_states) = saved[b]
    pending: list[PyTree] = []  # lazily copied-back weights still on the device
    for j in range(len(rev_layers) - 1, -1, -1):
      layer, opt = rev_layers[j], rev_opts[j]
      k = std_k + 1 + j
      outputs = cb.inputs_from_stack(stack, layer.n_out)
      grads = cb.inputs_from_stack(grad_stack, layer.n_out)
      # tl.on_accelerator: host values get a device copy for the call.
      args = (
        outputs,
        weights_of(layer),
        grads,
        old_states[j],
        new_states[j],
        program_lib.abstract(opt.slots),
        program_lib.abstract(rev_params[j]),
        rng_rows[k],
        step,
      )
      new_weights, _, inputs, grads_in, _ = call(
        f'backward layer {k} ({layer.name})',
        'backward',
        rev_fbos[j],
        args,
        keep
        + [
          ('stack', stack),
          ('cotangent stack', grad_stack),
          ('weights not yet copied back', pending),
        ],
        on_host(),
      )
      stack = cb.outputs_onto_stack(inputs, stack, layer.n_out)
      grad_stack = cb.outputs_onto_stack(grads_in, grad_stack, layer.n_out)
      pending = [new_weights]  # the previous layer's are collected now
    grads = cb.inputs_from_stack(grad_stack, std_layer.n_out)
    args = (
      std_inputs,
      weights_of(std_layer),
      grads,
      std_state,
      program_lib.abstract(std_opt.slots),
      program_lib.abstract(std_params),
      rng_rows[std_k],
      step,
    )
    _, _, _, grads_in, _ = call(
      f'backward layer {std_k} ({std_layer.name})',
      'backward',
      std_fbo,
      args,
      keep
      + [
        ('stack', stack),
        ('cotangent stack', grad_stack),
        ('weights not yet copied back', pending),
      ],
      on_host(),
    )
    grad_stack = cb.outputs_onto_stack(grads_in, grad_stack, std_layer.n_out)
    stack = cb.outputs_onto_stack(std_inputs, stack, std_layer.n_out)


def weights_and_slots_bytes(
  trainer: 'trax_optimizers.ReversibleSerialTrainer',
) -> tuple[int, int]:
  """(weights bytes, slots bytes) over all layers; both live on the host
  between steps."""
  weights = [layer.weights for layer in trainer.all_layers]
  return program_lib.tree_bytes(weights), program_lib.tree_bytes(trainer.slots)


# trax's message when one buffer is donated twice to a program, as JAX
# raises it (`JaxRuntimeError: INVALID_ARGUMENT: ...`).
DONATED_TWICE = 'Attempt to donate the same buffer twice'


def _buffer(x: object) -> tuple | None:
  """What identifies the memory of an array leaf as a program gets it:
  a JAX array's device buffer, a numpy array's data (which JAX on the
  CPU takes without a copy); None for anything else."""
  if isinstance(x, jax.Array):
    return ('device', x.unsafe_buffer_pointer())
  if isinstance(x, np.ndarray) and x.size:
    return ('host', x.__array_interface__['data'][0], x.nbytes)
  return None


def _donated_twice(tree: PyTree) -> tuple[str, str] | None:
  """(first path, second path) of two leaves of `tree` that are one
  buffer, or None."""
  seen: dict[tuple, str] = {}
  for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
    key = _buffer(leaf)
    if key is None:
      continue
    if key in seen:
      return seen[key], jax.tree_util.keystr(path)
    seen[key] = jax.tree_util.keystr(path)
  return None


def step_1_failure(
  trainer: 'trax_optimizers.ReversibleSerialTrainer',
) -> str | None:
  """Why stock's first step would fail on this trainer, or None.

  Stock's backward programs donate each layer's weights
  (`donate_argnums=(1, 2)` and `(0, 1, 2)` in trax 1.4.1's
  `ReversibleSerialTrainer`), and it places a layer's weights for the call
  with `tl.on_accelerator`, leaf by leaf. A layer that holds one weight at
  two places (a layer shared inside it, e.g. a ConfigurableTerraformer's
  embedding shared by its encoder and decoder) then hands the program one
  buffer twice, which XLA refuses at step 1: "Attempt to donate the same
  buffer twice". This places every layer's weights as stock does (on a
  machine without an accelerator `tl.on_accelerator` returns them as they
  are) and compares the buffers; nothing is compiled or run.

  Args:
    trainer: stock trax's `ReversibleSerialTrainer`, built.

  Returns:
    One line naming the error, the layer and the two places; or None.
  """
  layers = list(trainer.all_layers)
  for k, layer in enumerate(layers):
    placed = (
      tl.on_accelerator(layer.weights)
      if trainer_door.n_devices(trainer) == 1
      else None
    )
    twice = None if placed is None else _donated_twice(placed)
    if twice is not None:
      return (
        f'{DONATED_TWICE} (its update of layer {k} '
        f"({layer.name}) donates the layer's weights, whose "
        f'{twice[0]} and {twice[1]} are one shared array)'
      )
  return None
