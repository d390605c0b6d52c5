"""The memory-efficient reversible trainer, split by job.

Public names: `ReversibleSerialTrainer`, `init_reversible_blocks`,
`DeviceOutOfMemoryError` (a step that ran out of device memory),
`extract_reversible_blocks` (trax's, reused as is), `TrainerOptions` and
`validate_gin_bindings` (the settings beyond trax's, checked without making
a trainer).

Modules, from the schedule down:

  trainer     `ReversibleSerialTrainer`: trax's public surface, `one_step`
  planner     per batch shapes, before the step: plan, units, device memory
  budget      the device memory budget (the device's own size by default)
  candidates  the plans a budget chooses from, fastest first
  plan_search one search of a shapes' candidates: the chosen and the least
  plan        `StepPlan`: which calls a step makes, over what, holding what
  dimensions  each dimension of the plan declared once: its setting, check,
              search role and store field, read by the modules above
  step_context one step's run on placed arrays: shared values, the owner
              of the walk's points (observers, freeing device buffers)
  observers   what observes a step: memory-log phases, host memory release
  units       standard units, reversible segments, the loss program; the
              one walk over a fixed plan (the step's schedule)
  step_run    `StepRun`: what a walk runs on, what a step holds on the
              device, when an update leaves it and the sink it goes to (one
              description for all walks)
  unit_factory builds a plan's units from the step functions
  ahead       the walk on types: compiling ahead (into
              `device_memory.calls.Programs`), accounting device memory
  compilation the compile cache
  fingerprints what a layer computes (which layers share a compilation)
  step_fns    the pure functions compiled: forward, FBO, reverse-and-update
  fused_fns   the fused loss program's function
  slices      the same functions over batch slices
  loss_slices how slices of a loss combine; the loss programs over slices
  oom_report  the one line a step's out-of-memory error becomes
  commit      the step's update sink: committing updates to the host; the
              non-finite guard
  store       layers, optimizers, host weights / state / slots
  options     the settings beyond trax's, validated
  init        `init_reversible_blocks`
"""

from trax.optimizers import trainer as _stock_trainer

from trax_revplus.trainer.init import init_reversible_blocks
from trax_revplus.trainer.oom_report import DeviceOutOfMemoryError
from trax_revplus.trainer.options import TrainerOptions
from trax_revplus.trainer.options import validate_gin_bindings
from trax_revplus.trainer.trainer import ReversibleSerialTrainer

# The class's public home, as the CLI and `repr` name it.
ReversibleSerialTrainer.__module__ = __name__
init_reversible_blocks.__module__ = __name__

# trax's block extraction is backend-neutral and reused as is.
extract_reversible_blocks = _stock_trainer.extract_reversible_blocks

__all__ = ['DeviceOutOfMemoryError', 'ReversibleSerialTrainer',
           'TrainerOptions',
           'extract_reversible_blocks', 'init_reversible_blocks',
           'validate_gin_bindings']
