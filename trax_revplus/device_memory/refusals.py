"""Programs the backend would not compile: for memory, or for another reason.

An accelerator's compiler checks a program's buffers against the device's
memory while it compiles: on a TPU a program whose temporaries exceed the
chip's HBM fails at compile time with `jax.errors.JaxRuntimeError:
RESOURCE_EXHAUSTED: ...` (e.g. "Ran out of memory on HBM, the total memory
required for HLO temporaries (16.01G) exceeds available HBM (15.75G)"), not
only when it runs. For the accounting such a program is a measurement, not
a failure: the plan that calls it does not fit this device
(`ProgramOutOfMemoryError`, with the least bytes the message or the step's
other figures give). Any other failure to compile is
`ProgramCompileError`, naming the program and the error in one line.

`compile_failure(error, program, least_bytes)` classifies an exception
raised while compiling (`out_of_memory` tells the status and reads the
bytes the compiler's message says the program needs).
"""

from trax_revplus import errors
from trax_revplus.byte_sizes import format_bytes
from trax_revplus.device_memory import out_of_memory

# The most characters of the compiler's message kept in a one-line error.
MAX_CAUSE_CHARS = 240


class ProgramCompileError(ValueError):
  """A program of a step that the backend did not compile.

  Attributes:
    program: the call that runs it, e.g. 'backward layer 3 (...)', or None
      where not known yet.
    cause: the backend's error, one line ('JaxRuntimeError: ...').
  """

  def __init__(self, cause: str, program: str | None = None):
    self.program = program
    self.cause = cause
    super().__init__(self._message())

  def _message(self) -> str:
    return f'{self.program or "a program"} did not compile: {self.cause}'

  def named(self, program: str, least_bytes: int = 0) -> 'ProgramCompileError':
    """The same error for the call `program` (whose step needs at least
    `least_bytes`, for `ProgramOutOfMemoryError`)."""
    del least_bytes
    return ProgramCompileError(self.cause, program)


class ProgramOutOfMemoryError(ProgramCompileError):
  """A program the backend refused to compile for memory: the plan calling
  it does not fit this device, whatever its budget.

  Attributes (besides `ProgramCompileError`'s):
    least_bytes: bytes per device the step calling it needs at least (the
      compiler's own figure for the program, or what the step holds across
      the call, or another call's bytes, whichever is most), or None where
      none is known.
  """

  def __init__(
    self, cause: str, program: str | None = None, least_bytes: int | None = None
  ):
    self.least_bytes = least_bytes
    super().__init__(cause, program)

  def _message(self) -> str:
    least = (
      ''
      if self.least_bytes is None
      else f', needing at least {self.least_bytes} bytes '
      f'({format_bytes(self.least_bytes, unit=None)})'
    )
    return (
      f'the backend refused to compile {self.program or "a program"} '
      f'for memory{least}: {self.cause}'
    )

  def named(
    self, program: str, least_bytes: int = 0
  ) -> 'ProgramOutOfMemoryError':
    known = [b for b in (self.least_bytes, least_bytes) if b]
    return ProgramOutOfMemoryError(
      self.cause, program, max(known) if known else None
    )


def compile_failure(
  error: BaseException, program: str | None = None, least_bytes: int = 0
) -> ProgramCompileError:
  """The `ProgramCompileError` of `error`, raised compiling `program`: a
  `ProgramOutOfMemoryError` for RESOURCE_EXHAUSTED (needing at least the
  compiler's figure or `least_bytes`, whichever is more), else the error
  itself in one line."""
  if isinstance(error, ProgramCompileError):
    return error if program is None else error.named(program, least_bytes)
  cause = errors.one_line(
    error, context=False, all_lines=True, typed=True, max_chars=MAX_CAUSE_CHARS
  )
  if out_of_memory.is_out_of_memory(error):
    refused = out_of_memory.shortfall(error).asked_bytes
    known = [b for b in (refused, least_bytes) if b]
    return ProgramOutOfMemoryError(
      cause, program, max(known) if known else None
    )
  return ProgramCompileError(cause, program)
