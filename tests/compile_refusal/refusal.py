"""A simulated compiler that refuses programs over a size, as a TPU's does.

On a TPU, XLA refuses at compile time a program whose buffers exceed the
chip's memory: `jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Ran out of
memory ...`. `refusing(limit_bytes)` makes the CPU backend do the same for
every program whose `memory_analysis()` argument + output + temporary -
alias bytes exceed `limit_bytes`, compiled ahead (`.lower().compile()`) or
when called, from JAX's persistent cache or not; `failing(limit_bytes)`
makes it fail those with another status (INTERNAL), as a compiler bug
would. In a process started by a test, `sitecustomize.py` beside this
module installs it where `LIMIT_ENV` is set (`FAILURE_ENV` for the other
status).

Test-only: it wraps JAX's private `jax._src.compiler.compile_or_get_cached`,
which every compilation of a jitted function goes through.
"""

import contextlib

LIMIT_ENV = 'TRAX_REVPLUS_REFUSE_PROGRAMS_OVER_BYTES'
FAILURE_ENV = 'TRAX_REVPLUS_FAIL_PROGRAMS_OVER_BYTES'
OUT_OF_MEMORY = 'RESOURCE_EXHAUSTED'
FAILED = 'INTERNAL'


def program_bytes(executable) -> int:
  """argument + output + temporary - alias bytes of a loaded executable."""
  stats = executable.get_compiled_memory_stats()
  return (
    stats.argument_size_in_bytes
    + stats.output_size_in_bytes
    + stats.temp_size_in_bytes
    - stats.alias_size_in_bytes
  )


def message(status: str, need_bytes: int, limit_bytes: int) -> str:
  """The error text of a refused program, worded as XLA's TPU compiler's."""
  if status == OUT_OF_MEMORY:
    return (
      f'{OUT_OF_MEMORY}: Ran out of memory in memory space hbm. Used '
      f'{need_bytes} of {limit_bytes} hbm (a simulated device; the '
      f"program's arguments, outputs and temporaries)."
    )
  return (
    f'{status}: simulated compiler failure on a program of {need_bytes} bytes.'
  )


def install(limit_bytes: int, status: str = OUT_OF_MEMORY):
  """Refuses every program over `limit_bytes` from now on, with a
  `jax.errors.JaxRuntimeError` of `status`; returns a function that
  uninstalls it."""
  import jax  # pylint: disable=g-import-not-at-top
  from jax._src import compiler  # pylint: disable=g-import-not-at-top

  compile_or_get_cached = compiler.compile_or_get_cached

  def refusing(*args, **kwargs):
    executable = compile_or_get_cached(*args, **kwargs)
    need = program_bytes(executable)
    if need > limit_bytes:
      raise jax.errors.JaxRuntimeError(message(status, need, limit_bytes))
    return executable

  compiler.compile_or_get_cached = refusing

  def uninstall():
    compiler.compile_or_get_cached = compile_or_get_cached

  return uninstall


@contextlib.contextmanager
def refusing(limit_bytes: int, status: str = OUT_OF_MEMORY):
  """Within the block, the backend refuses programs over `limit_bytes`."""
  uninstall = install(limit_bytes, status)
  try:
    yield
  finally:
    uninstall()


def failing(limit_bytes: int):
  """Within the block, programs over `limit_bytes` fail to compile with an
  INTERNAL status (not for memory)."""
  return refusing(limit_bytes, FAILED)
