"""The device memory budget a trainer plans its steps to fit.

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
"""

from trax_revplus import memory
from trax_revplus import placement as placement_lib
from trax_revplus import validation
from trax_revplus.trainer import options as options_lib

RESERVE_FRACTION = 0.1
# Plan dimensions a least plan names where they differ from a plain step's.
_BELOW_ONE_ROW = {'sequence_chunks': 1, 'micro_batches': 1,
                  'parallel_heads': None}


class DeviceMemoryBudgetError(validation.ConfigurationError):
  """No plan's step fits the device memory budget (a ValueError)."""


def nothing_fits(plan, need_bytes: int, budget_bytes: int,
                 options: options_lib.TrainerOptions
                 ) -> DeviceMemoryBudgetError:
  """The error where no plan fits `budget_bytes`: it names the least plan
  (`plan`, whose peak is `need_bytes`), the budget it needs, and the
  settings pinned in `options` that kept the planner from leaner plans."""
  pinned = [name for name in ('segment_max_layers', 'batch_slices',
                              'backward_segment_max_layers', *_BELOW_ONE_ROW)
            if getattr(options, name) != options_lib.AUTO]
  unpin = (f", set {' and '.join(pinned)} to 'auto'" if pinned else '')
  layers = plan.settings()['segment_max_layers']
  below = ''.join(f', {k}={v}' for k, v in plan.settings().items()
                  if k in _BELOW_ONE_ROW and v != _BELOW_ONE_ROW[k])
  how = ('every layer in the loss program' if plan.loss - plan.fused_from
         else f'{"one layer" if layers <= 1 else f"{layers} layers"} per '
         f'call, saved inputs and states'
         f'{" and accumulated gradients" if plan.grads_on_host else ""}'
         f' on the host')
  return DeviceMemoryBudgetError(
      f'no plan fits device_memory_budget_bytes={budget_bytes} '
      f'({budget_bytes / 2**20:.1f} MiB) on this batch: the least needs '
      f'{need_bytes} bytes ({need_bytes / 2**20:.1f} MiB), with '
      f'batch_slices={plan.batch_slices}{below} and {how}; set '
      f'{options_lib.GIN_CONFIGURABLE}.device_memory_budget_bytes >= '
      f'{need_bytes}{unpin}, or use a shorter sequence or a smaller batch.')


class DeviceMemoryUnknownError(validation.ConfigurationError):
  """'device' asked for a budget of the device's size, which this backend
  does not report."""


def device_budget_bytes(limit_bytes: int) -> int:
  """The budget of a device whose allocator may hand out `limit_bytes`."""
  return limit_bytes - int(limit_bytes * RESERVE_FRACTION)


def host_budget_bytes(available_bytes: int, n_devices: int) -> int:
  """The budget of each of `n_devices` devices that share the host's
  `available_bytes` (CPU devices)."""
  return device_budget_bytes(available_bytes) // max(1, n_devices)


def budget_bytes(setting, placement) -> int | None:
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
        f"{options_lib.GIN_CONFIGURABLE}.device_memory_budget_bytes = "
        f"'device', but the {placement.platform} backend does not report its "
        f"devices' memory size (memory_stats()['bytes_limit']); set the "
        f"budget in bytes (e.g. 17179869184 for 16 GiB), or 'auto' to plan "
        f"under what the host can give.")
  # Every process plans under the least host's budget, so all run one plan.
  return placement_lib.least_over_processes(host_budget_bytes(
      memory.host_available_bytes(), len(placement.devices)))
