"""The memory-efficient reversible trainer, split by job.

Public names: `ReversibleSerialTrainer`, `init_reversible_blocks`,
`extract_reversible_blocks` (trax's, reused as is), `TrainerOptions` and
`validate_gin_bindings` (the settings beyond trax's, checked without making
a trainer).

Modules, from the schedule down:

  trainer     `ReversibleSerialTrainer`: trax's public surface, `one_step`
  step        one step's context: shared values, memory-log phases
  hooks       first-step work (compiling ahead, backward splits), freeing
  units       standard units, reversible segments, the loss unit; the walk
  run         `Run`: what a walk runs on (the step, or compiling ahead)
  plan        the segment plan: which layers each compiled call runs
  compilation the compile cache, compiling ahead
  fingerprints what a layer computes (which layers share a compilation)
  step_fns    the pure functions compiled: forward, FBO, reverse-and-update
  commit      the lazy copy-back queue and the non-finite guard
  store       layers, optimizers, host weights / state / slots
  options     the settings beyond trax's, validated
  init        `init_reversible_blocks`
"""

from trax.optimizers import trainer as _stock_trainer

from trax_revplus.trainer.init import init_reversible_blocks
from trax_revplus.trainer.options import TrainerOptions
from trax_revplus.trainer.options import validate_gin_bindings
from trax_revplus.trainer.trainer import ReversibleSerialTrainer

# The class's public home, as the CLI and `repr` name it.
ReversibleSerialTrainer.__module__ = __name__
init_reversible_blocks.__module__ = __name__

# trax's block extraction is backend-neutral and reused as is.
extract_reversible_blocks = _stock_trainer.extract_reversible_blocks

__all__ = ['ReversibleSerialTrainer', 'TrainerOptions',
           'extract_reversible_blocks', 'init_reversible_blocks',
           'validate_gin_bindings']
