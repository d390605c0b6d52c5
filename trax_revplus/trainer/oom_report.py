"""The one line a step's out-of-memory error becomes.

A step that runs out of device memory (a call's allocation fails, or the
backend refuses to compile a program that does not fit: XLA's
RESOURCE_EXHAUSTED) ends the run. `DeviceOutOfMemoryError` says in one
line where (the call and the step), the bytes asked for and the bytes
there were (as the backend's message gives them), what the plan was
accounted to need, the leanest plan accounted, and the setting to change.
Nothing of that step is saved: the last checkpoint stays the run's.
"""

from trax_revplus.byte_sizes import format_bytes
from trax_revplus.device_memory import out_of_memory
from trax_revplus.trainer._plan import options as options_lib
from trax_revplus.trainer._search import planner as planner_lib
from trax_revplus.trainer._step import step_context
from trax_revplus.typing import Batch


class DeviceOutOfMemoryError(RuntimeError):
  """A step's call found too little device memory.

  Attributes:
    call: which call, e.g. 'backward layers 3..6' (`step_run.call_name`),
      or None where the step had dispatched none.
    step: the training step.
    shortfall: `out_of_memory.Shortfall` read from the backend's message.
    suggested_budget_bytes: a device memory budget under which the planner
      would choose a leaner plan, or None.
  """

  def __init__(
    self,
    message: str,
    call: str | None,
    step: int,
    shortfall: out_of_memory.Shortfall,
    suggested_budget_bytes: int | None,
  ):
    super().__init__(message)
    self.call = call
    self.step = step
    self.shortfall = shortfall
    self.suggested_budget_bytes = suggested_budget_bytes


def _size(nbytes: int) -> str:
  return format_bytes(nbytes, unit=None)


def _suggested_budget(shortfall, planned_peak_bytes, budget_bytes):
  """The planned peak (else the budget) less what the call lacked and 1%
  of it, else 80% of it; None where neither is known."""
  base = (
    planned_peak_bytes if planned_peak_bytes is not None else (budget_bytes)
  )
  if base is None:
    return None
  if shortfall.asked_bytes is not None and (
    shortfall.available_bytes is not None
  ):
    lacked = max(0, shortfall.asked_bytes - shortfall.available_bytes)
    return max(1, base - lacked - base // 100)
  return max(1, base * 4 // 5)


def report(
  error: BaseException,
  call: str | None,
  step: int,
  planned_peak_bytes: int | None,
  budget_bytes: int | None,
  least_bytes: int | None,
) -> DeviceOutOfMemoryError:
  """The `DeviceOutOfMemoryError` of `error` (`out_of_memory.
  is_out_of_memory`), raised by `call` of `step`.

  Args:
    error: the backend's error.
    call: the call's name, or None.
    step: the training step.
    planned_peak_bytes: the step's accounted peak device bytes, or None.
    budget_bytes: the device memory budget the step was planned under, or
      None (not planned).
    least_bytes: the least peak among the plans accounted on these shapes,
      or None where none was.
  """
  shortfall = out_of_memory.shortfall(error)
  where = f'in {call}' if call else 'before its first call'
  need = []
  if shortfall.asked_bytes is not None:
    need.append(f'it asked for {_size(shortfall.asked_bytes)}')
  if shortfall.available_bytes is not None:
    need.append(f'{_size(shortfall.available_bytes)} were there')
  detail = ', '.join(need) or out_of_memory.first_line(error)
  setting = f'{options_lib.GIN_CONFIGURABLE}.device_memory_budget_bytes'
  suggested = _suggested_budget(shortfall, planned_peak_bytes, budget_bytes)
  if budget_bytes is None:
    plan = (
      f'the step ran unplanned ({setting} = None); set it to '
      f"'auto' to plan under the device's size"
    )
  else:
    plan = (
      f'its plan was accounted at {_size(planned_peak_bytes)}'
      if planned_peak_bytes is not None
      else 'its plan was not accounted'
    )
    plan += f' under a budget of {_size(budget_bytes)}'
    if least_bytes is not None:
      plan += f'; the leanest plan accounted needs {_size(least_bytes)}'
    if suggested is not None:
      plan += (
        f'; set {setting} = {suggested} so that the planner chooses '
        f'a leaner plan'
      )
  message = (
    f'out of device memory {where} at step {step}: {detail}; '
    f'{plan}, or use a smaller batch or shorter sequences; the '
    f'last checkpoint is the one to resume from'
  )
  return DeviceOutOfMemoryError(message, call, step, shortfall, suggested)


def raise_if_out_of_memory(
  error: BaseException,
  ctx: step_context.StepContext,
  planner: planner_lib.Planner,
  batch: Batch,
) -> None:
  """Raises the `DeviceOutOfMemoryError` of `error` (from `error`) where it
  is the backend's out-of-memory error (`out_of_memory.is_out_of_memory`);
  else returns, and the caller re-raises `error`.

  The error is `report`'s with the call `ctx` (the step's
  `step_context.StepContext` on `batch`) was in, the plan's accounted peak,
  the budget `planner` (`planner.Planner`) planned under and the leanest
  plan accounted on `batch`'s shapes.

  Raises:
    DeviceOutOfMemoryError: `error` is the backend's out-of-memory error.
  """
  if not out_of_memory.is_out_of_memory(error):
    return
  weighed = planner.weighing(batch).weighed
  least = min(
    (w.memory.peak_device_bytes for w in weighed if w.memory is not None),
    default=None,
  )
  raise report(
    error,
    ctx.calling,
    ctx.step,
    ctx.planned_peak_bytes,
    planner.budget_bytes,
    least,
  ) from error
