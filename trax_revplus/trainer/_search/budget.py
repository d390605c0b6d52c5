"""The device and host memory budgets a trainer plans its steps to fit.

`device_memory_budget_bytes` (`options.TrainerOptions`) is:

  'auto' (default)  the device's own size less `RESERVE_FRACTION` of it,
                    where the backend reports its size (GPU, TPU:
                    `memory_stats()['bytes_limit']`, the least over the
                    process's devices); where it does not (CPU, whose
                    devices are the host's memory), what the host can give
                    now (`memory.host_available_bytes`) less the same
                    reserve, shared by the process's devices: so every run
                    is planned, on a CPU as on an accelerator;
  'device'          the device's size as for 'auto', and an error where
                    the size is not reported;
  an int            that many bytes per device;
  None              no budget: the plan the segment settings name runs.

The reserve leaves room for what the composed XLA figures do not count:
the allocator's fragmentation and rounding, the runtime's own buffers
(e.g. convolution workspaces), and arrays held outside the trainer.

`host_memory_budget_bytes` (`host_budget_bytes`) is the host bytes the
process's step may hold at its peak (`device_memory.StepMemory.
peak_host_bytes`: weights, slots and state, the batch, what waits on the
host, and on the CPU backend the devices' buffers):

  'auto' (default)  what the host can give when the trainer is made, after
                    the backend opened and the layers' weights, slots and
                    state came to the host (`memory.host_available_bytes`),
                    less `RESERVE_FRACTION`, plus those weights, slots and
                    state (the accounted figure counts them, the host's
                    available memory no longer does);
  an int            that many bytes for the process;
  None              no host budget.

On the CPU backend the devices' buffers are host memory: a plan's host
figure counts its device bytes on each device, so its host budget, which
holds what the host can give once, binds before the device budget 'auto'
(the same memory shared by the devices) does, by the host's own holdings;
where memory is plentiful neither binds.

A program the backend refuses to compile for memory is a plan that does
not fit the device whatever the budget; where even the least plan's is
refused, `nothing_fits` says so.
"""

from trax_revplus import device_memory
from trax_revplus import memory
from trax_revplus import placement as placement_lib
from trax_revplus import validation
from trax_revplus.trainer._plan import dimensions
from trax_revplus.trainer._plan import options as options_lib
from trax_revplus.trainer._plan import plan as plan_lib
from trax_revplus.trainer._search import weighed_plans as weighed_plans_lib

RESERVE_FRACTION = 0.1


class MemoryBudgetError(validation.ConfigurationError):
  """A step no plan of which fits the memory it may use (a ValueError)."""


class DeviceMemoryBudgetError(MemoryBudgetError):
  """No plan's step fits the device memory budget, or this device."""


class HostMemoryBudgetError(MemoryBudgetError):
  """The step would hold more host memory than its host budget."""


class StepCompileError(validation.ConfigurationError):
  """A program of the step did not compile, for a reason other than
  memory."""


def _below_one_row() -> list[dimensions.PlanDimension]:
  """The plan's dimensions that can take a step below one row's batch
  slice (all but the slicing): a least plan names them where they differ
  from a plain step's."""
  return [d for d in dimensions.DIMENSIONS if d.name != 'batch_slices']


def _pinned(options: options_lib.TrainerOptions) -> str:
  """', set X and Y to 'auto'' for the plan settings `options` pins."""
  pinned = [
    name
    for name in (
      'segment_max_layers',
      'batch_slices',
      'backward_segment_max_layers',
      *(d.name for d in _below_one_row()),
    )
    if getattr(options, name) != options_lib.AUTO
  ]
  return f", set {' and '.join(pinned)} to 'auto'" if pinned else ''


def _plan_text(plan: plan_lib.StepPlan) -> str:
  """'batch_slices=2, micro_batches=4 and one layer per call, ...' (the
  plan's slicing, its other dimensions where they differ from a plain
  step's)."""
  layers = plan.settings()['segment_max_layers']
  assert isinstance(layers, int)  # the longest forward segment's length
  below = ''.join(
    f', {d.name}={getattr(plan, d.name)}'
    for d in _below_one_row()
    if getattr(plan, d.name) != d.none
  )
  how = (
    'every layer in the loss program'
    if plan.loss - plan.fused_from
    else f'{"one layer" if layers <= 1 else f"{layers} layers"} per '
    f'call, saved inputs and states'
    f'{" and accumulated gradients" if plan.grads_on_host else ""}'
    f' on the {"host" if plan.saved_on_host else "device"}'
  )
  return f'batch_slices={plan.batch_slices}{below} and {how}'


def _sized(nbytes: int) -> str:
  return f'{nbytes} bytes ({nbytes / 2**20:.1f} MiB)'


def nothing_fits(
  plan: plan_lib.StepPlan,
  need_bytes: int,
  budget_bytes: int | None,
  options: options_lib.TrainerOptions,
  refused: str | None = None,
) -> DeviceMemoryBudgetError:
  """The error where no plan fits `budget_bytes`: it names the least plan
  (`plan`, whose peak is `need_bytes`), the budget it needs, and the
  settings pinned in `options` that kept the planner from leaner plans.
  With `refused` (the backend refused to compile that plan's program
  `refused` for memory, so `need_bytes` is only a lower bound): no budget
  makes it fit this device; without a budget (None) `plan` is the one the
  settings name."""
  if refused is not None:
    head, whose = (
      ('no plan fits this device on this batch', 'the least plan')
      if budget_bytes is not None
      else (
        'the plan the settings name does not fit this device on this batch',
        'it',
      )
    )
    fix = (
      _pinned(options)
      if budget_bytes is not None
      else f', set {options_lib.GIN_CONFIGURABLE}.device_memory_budget_bytes'
      f" = '{options_lib.AUTO}'{_pinned(options)}"
    )
    return DeviceMemoryBudgetError(
      f'{head}: the backend refused to '
      f'compile {refused} of {whose} ({_plan_text(plan)}) for memory, '
      f'which needs at least {_sized(need_bytes)}; use a shorter sequence '
      f'or a smaller batch{fix}, or a device with more memory.'
    )
  # Without a refusal, the planner searched under a budget.
  assert budget_bytes is not None
  return DeviceMemoryBudgetError(
    f'no plan fits device_memory_budget_bytes={budget_bytes} '
    f'({budget_bytes / 2**20:.1f} MiB) on this batch: the least needs '
    f'{_sized(need_bytes)}, with {_plan_text(plan)}; set '
    f'{options_lib.GIN_CONFIGURABLE}.device_memory_budget_bytes >= '
    f'{need_bytes}{_pinned(options)}, or use a shorter sequence or a '
    f'smaller batch.'
  )


def _host_budget_text(budget_bytes: int, setting: int | str | None) -> str:
  auto = (
    " ('auto': what the host could give after the backend opened, "
    'less 10%, with the weights, slots and state it held then)'
    if setting == options_lib.AUTO
    else ''
  )
  return (
    f'host_memory_budget_bytes={budget_bytes} '
    f'({budget_bytes / 2**20:.1f} MiB){auto}'
  )


def host_nothing_fits(
  plan: plan_lib.StepPlan,
  need_bytes: int,
  budget_bytes: int,
  options: options_lib.TrainerOptions,
) -> HostMemoryBudgetError:
  """The error where no plan that fits the device fits the host budget
  `budget_bytes`: `plan`, the one weighed with the least host bytes
  (`need_bytes`)."""
  budget = _host_budget_text(budget_bytes, options.host_memory_budget_bytes)
  return HostMemoryBudgetError(
    f'no plan fits {budget} on this batch: of the plans that fit the '
    f'device, the least host memory is {_sized(need_bytes)}, with '
    f'{_plan_text(plan)}; free host memory, set '
    f'{options_lib.GIN_CONFIGURABLE}.host_memory_budget_bytes '
    f'>= {need_bytes} (None: no host budget){_pinned(options)}, or use a '
    f'shorter sequence or a smaller batch.'
  )


def host_exceeded(
  plan_text: str,
  step: device_memory.StepMemory,
  budget_bytes: int,
  options: options_lib.TrainerOptions,
) -> HostMemoryBudgetError:
  """The error where the plan the settings name (`plan_text`) would hold
  more host memory at its peak (`step`, its `StepMemory`) than
  `budget_bytes`."""
  need = step.peak_host_bytes
  parts = sorted(
    step.peak_host_call.host_parts().items(), key=lambda kv: -kv[1]
  )[:3]
  listed = ', '.join(
    f'{name} {nbytes / 2**20:.1f} MiB' for name, nbytes in parts if nbytes
  )
  return HostMemoryBudgetError(
    f'the plan the settings name ({plan_text}) needs {_sized(need)} of '
    f'host memory at its peak ({listed}), more than '
    f'{_host_budget_text(budget_bytes, options.host_memory_budget_bytes)}; '
    f'set {options_lib.GIN_CONFIGURABLE}.device_memory_budget_bytes = '
    f"'{options_lib.AUTO}'{_pinned(options)} so that the planner chooses a "
    f'plan that fits both, set host_memory_budget_bytes = None to run it '
    f'anyway, or use a smaller batch.'
  )


def nothing_fits_error(
  least: tuple[plan_lib.StepPlan, device_memory.StepMemory],
  weighing: weighed_plans_lib.Weighing,
  options: options_lib.TrainerOptions,
) -> MemoryBudgetError:
  """The error where no plan fits the budgets of `weighing` (a
  `weighed_plans.Weighing`), `least` the (plan, `StepMemory`) of the least
  plan: the device budget's (`nothing_fits`) where the least plan exceeds
  it, else the host budget's (`host_nothing_fits`), naming the plan
  weighed with the least host bytes of those that fit the device."""
  plan, step = least
  budget = weighing.budget_bytes
  assert budget is not None  # the planner searches under a device budget
  if step.peak_device_bytes > budget:
    return nothing_fits(plan, step.peak_device_bytes, budget, options)
  # The least plan fits the device: the host budget excluded every plan.
  assert weighing.host_budget_bytes is not None
  plan, step = min(
    (
      (w.plan, w.memory)
      for w in weighing.weighed
      if w.memory is not None and w.memory.peak_device_bytes <= budget
    ),
    key=lambda weighed: weighed[1].peak_host_bytes,
  )
  return host_nothing_fits(
    plan, step.peak_host_bytes, weighing.host_budget_bytes, options
  )


def not_compiled(
  error: device_memory.ProgramCompileError, configured: bool
) -> StepCompileError:
  """The error where a program of the step did not compile (`error`, a
  `device_memory.ProgramCompileError`, not for memory)."""
  what = (
    'the plan the settings name'
    if configured
    else 'a plan the device memory budget weighed'
  )
  return StepCompileError(
    f'{error} (in {what}); the step cannot run this way on this backend: '
    f'check the model on a smaller batch, or try other plan settings.'
  )


class DeviceMemoryUnknownError(validation.ConfigurationError):
  """'device' asked for a budget of the device's size, which this backend
  does not report."""


def device_budget_bytes(limit_bytes: int) -> int:
  """The budget of a device whose allocator may hand out `limit_bytes`."""
  return limit_bytes - int(limit_bytes * RESERVE_FRACTION)


def shared_host_budget_bytes(available_bytes: int, n_devices: int) -> int:
  """The device budget of each of `n_devices` devices that share the
  host's `available_bytes` (CPU devices)."""
  return device_budget_bytes(available_bytes) // max(1, n_devices)


def host_budget_bytes(setting: int | str | None, held_bytes: int) -> int | None:
  """The host budget `setting` means for a process holding `held_bytes` of
  weights, slots and state on the host now (see the module docstring); in
  a run of several processes the least over them."""
  if setting is None or isinstance(setting, int):
    return setting
  return placement_lib.least_over_processes(
    held_bytes + device_budget_bytes(memory.host_available_bytes())
  )


def budget_bytes(
  setting: int | str | None, placement: placement_lib.Placement
) -> int | None:
  """The budget `setting` means on `placement`'s devices.

  Args:
    setting: 'auto', 'device', an int, or None (see the module docstring).
    placement: the trainer's `placement.Placement`.

  Returns:
    int bytes per device, or None (no budget).

  Raises:
    DeviceMemoryUnknownError: `setting` is 'device' and the backend does
      not report its devices' size.
  """
  if setting is None or isinstance(setting, int):
    return setting
  limit = placement.memory_limit_bytes()
  if limit is not None:
    return placement_lib.least_over_processes(device_budget_bytes(limit))
  if setting == options_lib.DEVICE:
    raise DeviceMemoryUnknownError(
      f'{options_lib.GIN_CONFIGURABLE}.device_memory_budget_bytes = '
      f"'device', but the {placement.platform} backend does not report its "
      f"devices' memory size (memory_stats()['bytes_limit']); set the "
      f"budget in bytes (e.g. 17179869184 for 16 GiB), or 'auto' to plan "
      f'under what the host can give.'
    )
  # Every process plans under the least host's budget, so all run one plan.
  return placement_lib.least_over_processes(
    shared_host_budget_bytes(
      memory.host_available_bytes(), len(placement.devices)
    )
  )
