"""Device memory of a training step, from XLA's figures for its programs.

  program: `ProgramMemory`, XLA's memory analysis of one compiled program,
    and `analyze`, which compiles a jitted function for a call's argument
    types without placing or running anything.
  out_of_memory: `is_out_of_memory`, whether an error is the backend
    refusing a program or an allocation for memory, and the bytes its
    message names (`shortfall`).
  refusals: a program the backend would not compile, for memory (a plan
    that does not fit) or another reason (one line naming it).
  composition: `Held`, `Call`, `StepMemory`: a step's peak device bytes as
    the most, over its calls, of what is held across a call plus what the
    call adds; its peak host bytes likewise, from what the host holds.
  calls: `Programs`, the programs compiled for calls, once per function and
    argument types; `StepCalls`, a step's calls on abstract arrays and what
    is held across each, composed into its `StepMemory`.
  default_trainer, stock_trainer: the calls of one step of trax's default
    `Trainer` and of stock trax's `ReversibleSerialTrainer`. trax_revplus's
    own trainer walks its step itself (`trainer._accounting.on_types`),
    noting its calls in a `StepCalls` over the trainer's `Programs`.
  report: `TrainerMemory`, one trainer's figures (or a one-line error).
  refusals: `ProgramOutOfMemoryError`, a program the backend refused to
    compile for memory (a plan that does not fit the device), and
    `ProgramCompileError`, one it did not compile for another reason.

See docs/device-memory.md for what the figures mean and how exact they are.
"""

from trax_revplus.device_memory.composition import AccountingError
from trax_revplus.device_memory.composition import Call
from trax_revplus.device_memory.composition import Held
from trax_revplus.device_memory.composition import StepMemory
from trax_revplus.device_memory.composition import UnsupportedTrainerError
from trax_revplus.device_memory.composition import compose
from trax_revplus.device_memory.composition import devices_on_host
from trax_revplus.device_memory.composition import held_parts
from trax_revplus.device_memory.out_of_memory import is_out_of_memory
from trax_revplus.device_memory.program import ProgramMemory
from trax_revplus.device_memory.program import abstract
from trax_revplus.device_memory.program import analyze
from trax_revplus.device_memory.refusals import ProgramCompileError
from trax_revplus.device_memory.refusals import ProgramOutOfMemoryError
from trax_revplus.device_memory.report import TrainerMemory
from trax_revplus.device_memory.report import account
from trax_revplus.device_memory.report import default_trainer_memory
from trax_revplus.device_memory.report import stock_trainer_memory
from trax_revplus.device_memory.report import trainer_memory
from trax_revplus.device_memory.programs import Programs
from trax_revplus.device_memory.calls import StepCalls
