"""One trainer's memory figures, or the one line saying why there are none.

`TrainerMemory` is what `trax-revplus estimate`, `compare` and the
benchmark report per trainer: the step's peak device and host bytes
(`composition.StepMemory`), the weights and optimizer slots it keeps on the
host, the largest single program, and whether it fits a device memory.
`trainer_memory(name, trainer, batch, backend)` accounts any of the three
trainers, built; `account(name, fn)` turns a program the backend refused
to compile for memory into `TrainerMemory.refused` (the step does not fit
this device) and any other exception raised while building or compiling a
trainer into `TrainerMemory.error`, one line each.
"""

import dataclasses
from typing import TYPE_CHECKING, Any, Callable

from trax_revplus import errors
from trax_revplus.device_memory import composition
from trax_revplus.device_memory import default_trainer
from trax_revplus.device_memory import refusals
from trax_revplus.device_memory import stock_trainer
from trax_revplus.trax_door import trainers as trainer_door
from trax_revplus.typing import PyTree

if TYPE_CHECKING:  # Annotations only: accounting does not import trax.
  from trax import optimizers as trax_optimizers

# The most characters of `TrainerMemory.error`: a compiler's message can run
# to pages, and the error stands in a table's row.
MAX_ERROR_CHARS = 300


@dataclasses.dataclass(frozen=True)
class TrainerMemory:
  """Memory of one training step of one trainer (bytes, per device).

  Attributes:
    trainer: which trainer, e.g. 'default', 'stock', 'revplus'.
    backend: the platform the programs were compiled for ('cpu', 'gpu',
      'tpu'); their figures are that backend's.
    n_devices: devices the step runs on.
    step: the step's calls and peak, or None with `error`.
    weights_bytes, slots_bytes: the model's weights and the optimizer
      slots, one copy.
    weights_and_slots_on_host: whether they live on the host between steps
      (stock and trax_revplus) or on the device (the default Trainer, where
      they are in the step's peak instead).
    error: one line saying why there are no figures, or None.
    least: the `composition.StepMemory` of the leanest plan the trainer can
      run, or None: the trainer has one plan (`step`'s).
    plan: the plan `step` ran, as its settings (trax_revplus's trainer), or
      None.
    least_plan: the leanest plan's settings, or None.
    step_error: one line, trax's error, where the trainer's first step on
      this config would fail although its programs compile (stock's
      donation of a shared weight, `stock_trainer.step_1_failure`); None
      where nothing known stops it. The figures are then what the step
      would have needed.
    max_devices: the most devices the trainer can run on here, where that
      is fewer than asked (stock: 1 on current JAX), or None.
    refused: one line where the backend refused to compile a program of
      the step for memory (it does not fit this device; no figures), else
      None.
    refused_least_bytes: the bytes the refused step needs at least, where
      known, else None.
    least_weighed: False where the trainer has leaner plans than `step`'s
      and they were not weighed (`min_peak_device_bytes` is then None).
  """

  trainer: str
  backend: str
  n_devices: int
  step: composition.StepMemory | None = None
  weights_bytes: int = 0
  slots_bytes: int = 0
  weights_and_slots_on_host: bool = True
  error: str | None = None
  least: composition.StepMemory | None = None
  plan: dict | None = None
  least_plan: dict | None = None
  step_error: str | None = None
  max_devices: int | None = None
  refused: str | None = None
  refused_least_bytes: int | None = None
  least_weighed: bool = True

  @property
  def runs(self) -> bool | None:
    """Whether the trainer's step runs on this config: False where it
    would fail (`step_error`, `refused`), None where it could not be
    accounted (`error`)."""
    if self.error is not None:
      return None
    return self.step_error is None and self.refused is None

  def devices_text(self) -> str:
    """The devices the figures are for, e.g. '2', '1 device only'."""
    if self.max_devices is not None and self.n_devices <= self.max_devices:
      return (
        f'{self.n_devices} device only'
        if self.n_devices == 1
        else (f'{self.n_devices} devices only')
      )
    return f'{self.n_devices}'

  @property
  def peak_device_bytes(self) -> int | None:
    return None if self.step is None else self.step.peak_device_bytes

  @property
  def peak_host_bytes(self) -> int | None:
    """The step's peak host bytes (the process's: what the trainer keeps on
    the host, and on the CPU backend the devices' buffers)."""
    return None if self.step is None else self.step.peak_host_bytes

  @property
  def min_peak_device_bytes(self) -> int | None:
    """The least peak device bytes any plan of this trainer steps in (its
    only plan's, for trainers with one); None where unknown."""
    if self.step is None or not self.least_weighed:
      return None
    if self.least is None:
      return self.step.peak_device_bytes
    return min(self.least.peak_device_bytes, self.step.peak_device_bytes)

  @property
  def largest_program_bytes(self) -> int | None:
    return None if self.step is None else self.step.largest_program_bytes

  @property
  def host_weights_and_slots_bytes(self) -> int:
    """Host bytes of weights + slots between steps (0 where they live on
    the device)."""
    if self.step is None or not self.weights_and_slots_on_host:
      return 0
    return self.weights_bytes + self.slots_bytes

  def fits(self, device_memory_bytes: int | None) -> bool | None:
    """Whether the step's peak fits `device_memory_bytes` (None: no figure
    or no memory given)."""
    if self.refused is not None:
      return False  # Not on this device, whatever its memory.
    if self.step is None or device_memory_bytes is None:
      return None
    if self.step_error is not None:
      return False  # It would not step in any memory.
    return self.step.peak_device_bytes <= device_memory_bytes

  def to_json(self, device_memory_bytes: int | None = None) -> dict:
    """The JSON object `estimate --json` writes for this trainer."""
    devices = {'n_devices': self.n_devices, 'max_devices': self.max_devices}
    if self.error is not None:
      return {'error': self.error, 'runs': None, **devices}
    if self.refused is not None:
      return {
        'refused': self.refused,
        'runs': False,
        'fits': False,
        'least_device_bytes': self.refused_least_bytes,
        **devices,
      }
    step = self.step
    assert step is not None, 'figures are kept where nothing failed'
    out = {
      'runs': self.runs,
      **devices,
      'peak_device_bytes': self.peak_device_bytes,
      'min_peak_device_bytes': self.min_peak_device_bytes,
      'host_weights_and_slots_bytes': self.host_weights_and_slots_bytes,
      'largest_program_bytes': self.largest_program_bytes,
      'fits': self.fits(device_memory_bytes),
      'weights_bytes': self.weights_bytes,
      'slots_bytes': self.slots_bytes,
      'n_calls': len(step.calls),
      'peak_call': step.peak_call.name,
      'peak_parts_bytes': step.peak_call.parts(),
      'phase_peak_device_bytes': step.phase_peaks(),
      'peak_host_bytes': self.peak_host_bytes,
      'peak_host_call': step.peak_host_call.name,
      'peak_host_parts_bytes': step.peak_host_call.host_parts(),
    }
    if self.plan is not None:
      out['plan'] = self.plan
    if self.least_plan is not None:
      out['least_plan'] = self.least_plan
    if self.step_error is not None:
      out['error'] = self.step_error
    return out


def account(
  trainer: str,
  backend: str,
  n_devices: int,
  fn: Callable[[], TrainerMemory],
  passes: tuple[type[Exception], ...] = (),
) -> TrainerMemory:
  """`fn()`, or a `TrainerMemory` with the one-line error it raised.

  For building a trainer and composing its step, where a trainer that
  cannot be built or compiled on this JAX gets an error instead of
  figures, and one whose program the backend refused to compile for
  memory the refusal (`refused`). KeyboardInterrupt, SystemExit and the
  `passes` types (mistakes of the config the caller reports itself) pass
  through.
  """
  try:
    return fn()
  except passes:
    raise
  except refusals.ProgramOutOfMemoryError as e:
    return TrainerMemory(
      trainer,
      backend,
      n_devices,
      refused=errors.one_line(e, max_chars=MAX_ERROR_CHARS),
      refused_least_bytes=e.least_bytes,
    )
  except Exception as e:  # pylint: disable=broad-except
    return TrainerMemory(
      trainer,
      backend,
      n_devices,
      error=errors.one_line(
        e, context=False, typed=True, max_chars=MAX_ERROR_CHARS
      ),
    )


def default_trainer_memory(
  trainer: 'trax_optimizers.Trainer',
  batch: PyTree,
  backend: str,
  name: str = 'default',
) -> TrainerMemory:
  """`TrainerMemory` of trax's default `Trainer` (see `default_trainer`);
  its weights and slots live on the device."""
  step = default_trainer.default_trainer_step(trainer, batch)
  weights, slots = default_trainer.weights_and_slots_bytes(trainer)
  n_devices = trainer_door.n_devices(trainer)
  # On 2+ devices its first step fails on current JAX: it pmaps arrays
  # committed to one device (`default_trainer`).
  return TrainerMemory(
    name,
    backend,
    n_devices,
    step,
    weights,
    slots,
    weights_and_slots_on_host=False,
    max_devices=1,
  )


def stock_trainer_memory(
  trainer: 'trax_optimizers.ReversibleSerialTrainer',
  batch: PyTree,
  backend: str,
  name: str = 'stock',
) -> TrainerMemory:
  """`TrainerMemory` of stock trax's `ReversibleSerialTrainer` (see
  `stock_trainer`); its weights and slots live on the host. Where its
  first step would fail (`stock_trainer.step_1_failure`), the figures come
  with that error (`step_error`)."""
  step = stock_trainer.stock_trainer_step(trainer, batch)
  weights, slots = stock_trainer.weights_and_slots_bytes(trainer)
  n_devices = trainer_door.n_devices(trainer)
  # Stock's multi-device step needs jax.device_put_replicated, which
  # current JAX removed (`stock_trainer`).
  return TrainerMemory(
    name,
    backend,
    n_devices,
    step,
    weights,
    slots,
    weights_and_slots_on_host=True,
    step_error=stock_trainer.step_1_failure(trainer),
    max_devices=1,
  )


def trainer_memory(
  name: str,
  trainer: Any,
  batch: Any,
  backend: str,
  step: composition.StepMemory | None = None,
  plan: dict | None = None,
  least: Any = None,
  weigh_least: bool = True,
) -> TrainerMemory:
  """`TrainerMemory` of one built trainer, whichever of the three it is.

  The one place that knows how each trainer is accounted, so that
  `trax-revplus estimate` and the benchmark report the same figures.
  trax_revplus's trainer is recognized by its `device_memory_of` method
  rather than by its class: this package must not import
  `trax_revplus.trainer`, which imports it.

  Args:
    name: 'default' (trax's `Trainer`), 'stock' (stock trax's
      `ReversibleSerialTrainer`) or any other name (e.g. 'revplus', 'ours')
      for trax_revplus's `ReversibleSerialTrainer`; it becomes
      `TrainerMemory.trainer`.
    trainer: the built trainer.
    batch: tuple of `jax.ShapeDtypeStruct`s (or arrays) of the step's batch.
    backend: the platform the programs compile for, e.g.
      `jax.default_backend()`.
    step: trax_revplus's trainer only: its step's `StepMemory` when the
      caller already has it (e.g. the least plan's when no plan fits a
      budget); None accounts `trainer.device_memory_of(batch)`.
    plan: trax_revplus's trainer only: the settings of the plan `step` ran.
    least: trax_revplus's trainer only: (plan settings, `StepMemory`) of
      its leanest plan, or None (`trainer.least_device_memory_of(batch)`
      where `weigh_least`).
    weigh_least: trax_revplus's trainer only: whether to weigh its leanest
      plan where `least` is None (it compiles the leanest plans' programs);
      False leaves `least_weighed` False.

  Returns:
    `TrainerMemory`; trax_revplus's and stock's keep their weights and
    slots on the host between steps, the default Trainer's on the device.

  Raises:
    TypeError: `name` is not 'default' or 'stock' and `trainer` has no
      `device_memory_of`.
    Whatever accounting raises, e.g. `UnsupportedTrainerError`, or
    `trax_revplus.trainer._search.planner.DeviceMemoryBudgetError` when no plan
    of trax_revplus's trainer fits its device memory budget (wrap the call
    in `account` for a one-line error instead).
  """
  if name == 'default':
    return default_trainer_memory(trainer, batch, backend, name)
  if name == 'stock':
    return stock_trainer_memory(trainer, batch, backend, name)
  if not hasattr(trainer, 'device_memory_of'):
    raise TypeError(
      f'trainer {name!r}: {type(trainer).__name__} is not '
      "trax_revplus's ReversibleSerialTrainer (no "
      'device_memory_of); name it default or stock'
    )
  if step is None:
    step = trainer.device_memory_of(batch)
    plan = trainer.planned(batch).plan.settings()
  if least is None and weigh_least:
    least_plan, least_step = trainer.least_device_memory_of(batch)
    least = (least_plan.settings(), least_step)
  # Ours keeps the layers and slots stock keeps (`all_layers`, `slots`).
  weights, slots = stock_trainer.weights_and_slots_bytes(trainer)
  return TrainerMemory(
    name,
    backend,
    trainer.placement.n_devices,
    step,
    weights,
    slots,
    weights_and_slots_on_host=True,
    least=None if least is None else least[1],
    plan=plan,
    least_plan=None if least is None else least[0],
    least_weighed=least is not None,
  )
