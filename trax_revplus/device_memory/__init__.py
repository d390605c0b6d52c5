"""Device memory of a training step, from XLA's figures for its programs.

  program: `ProgramMemory`, XLA's memory analysis of one compiled program,
    and `analyze`, which compiles a jitted function for a call's argument
    types without placing or running anything.
  composition: `Held`, `Call`, `StepMemory`: a step's peak device bytes as
    the most, over its calls, of what is held across a call plus what the
    call adds.
  walk: `StepWalk`, which replays a trainer's schedule with abstract
    arrays, compiling each call's program and naming what is held.
  default_trainer, stock_trainer: the calls of one step of trax's default
    `Trainer` and of stock trax's `ReversibleSerialTrainer`. trax_revplus's
    own trainer accounts its step itself (`trainer.ahead`), with these
    figures and compositions.
  report: `TrainerMemory`, one trainer's figures (or a one-line error).

See docs/device-memory.md for what the figures mean and how exact they are.
"""

from trax_revplus.device_memory.composition import AccountingError
from trax_revplus.device_memory.composition import Call
from trax_revplus.device_memory.composition import compose
from trax_revplus.device_memory.composition import Held
from trax_revplus.device_memory.composition import held_parts
from trax_revplus.device_memory.composition import StepMemory
from trax_revplus.device_memory.composition import UnsupportedTrainerError
from trax_revplus.device_memory.program import abstract
from trax_revplus.device_memory.program import analyze
from trax_revplus.device_memory.program import ProgramMemory
from trax_revplus.device_memory.report import account
from trax_revplus.device_memory.report import default_trainer_memory
from trax_revplus.device_memory.report import stock_trainer_memory
from trax_revplus.device_memory.report import trainer_memory
from trax_revplus.device_memory.report import TrainerMemory
from trax_revplus.device_memory.walk import StepWalk
