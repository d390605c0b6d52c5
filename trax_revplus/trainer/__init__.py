"""The memory-efficient reversible trainer: its supported API.

The names below are the trainer's public surface; the modules and
sub-packages of `trax_revplus.trainer` (`trainer`, `init`, `oom_report`, and
the private layers `_plan`, `_step`, `_accounting`, `_search`) are its
implementation, free to move between releases. docs/architecture.md maps
them.

  ReversibleSerialTrainer  trax's memory-efficient trainer, on current JAX
  TrainerOptions           the settings beyond trax's, validated
  AUTO                     the value that lets the planner choose a setting
  validate_gin_bindings    the gin settings checked without making a trainer
  StepPlan                 how a step runs (`planned(batch).plan`,
                           `least_device_memory_of`)
  PlannedStep              a batch shapes' plan, units and device memory
  init_reversible_blocks   trax's `init_reversible_blocks`, on current JAX
  extract_reversible_blocks  trax's, reused as is

Errors a user catches:

  DeviceOutOfMemoryError   a step ran out of device memory
  MemoryBudgetError        no plan fits a memory budget; its kinds
                           `DeviceMemoryBudgetError` (the device's) and
                           `HostMemoryBudgetError` (the host's)
  DeviceMemoryUnknownError the device's memory size is unknown and no budget
                           is set
  StepCompileError         the step's programs do not compile
"""

from trax.optimizers import trainer as _stock_trainer

from trax_revplus.trainer._plan.options import AUTO
from trax_revplus.trainer._plan.options import TrainerOptions
from trax_revplus.trainer._plan.plan import StepPlan
from trax_revplus.trainer._search.budget import DeviceMemoryBudgetError
from trax_revplus.trainer._search.budget import DeviceMemoryUnknownError
from trax_revplus.trainer._search.budget import HostMemoryBudgetError
from trax_revplus.trainer._search.budget import MemoryBudgetError
from trax_revplus.trainer._search.budget import StepCompileError
from trax_revplus.trainer._step.units import PlannedStep
from trax_revplus.trainer.gin_bindings import validate_gin_bindings
from trax_revplus.trainer.init import init_reversible_blocks
from trax_revplus.trainer.oom_report import DeviceOutOfMemoryError
from trax_revplus.trainer.trainer import ReversibleSerialTrainer

# The class's public home, as the CLI and `repr` name it.
ReversibleSerialTrainer.__module__ = __name__
init_reversible_blocks.__module__ = __name__

# trax's block extraction is backend-neutral and reused as is.
extract_reversible_blocks = _stock_trainer.extract_reversible_blocks

__all__ = [
  'AUTO',
  'DeviceMemoryBudgetError',
  'DeviceMemoryUnknownError',
  'DeviceOutOfMemoryError',
  'HostMemoryBudgetError',
  'MemoryBudgetError',
  'PlannedStep',
  'ReversibleSerialTrainer',
  'StepCompileError',
  'StepPlan',
  'TrainerOptions',
  'extract_reversible_blocks',
  'init_reversible_blocks',
  'validate_gin_bindings',
]
