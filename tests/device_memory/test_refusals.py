"""Compile failures classified: a program refused for memory, with the bytes
the compiler's message names, or any other failure, in one line.

References: the messages JAX 0.10.2 raised compiling programs over a TPU
v5e's 15.75 GiB (one chip, read there), and XLA's TPU compiler's other
out-of-memory wording.
"""

import jax

from trax_revplus.device_memory import refusals

# Compiling, on one TPU v5e chip, a program whose result holds 20 GiB.
TPU_OUT_OF_MEMORY = (
  'RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required '
  'for HLO temporaries (20.00G) exceeds available HBM (15.75G).'
)
# Compiling, there, a sort of more than 2^31 elements.
TPU_UNIMPLEMENTED = (
  'UNIMPLEMENTED: Stable sorting of more than 2^31-1 '
  'elements is not implemented'
)


def test_a_tpu_refusal_for_memory_names_the_bytes_it_needs():
  error = refusals.compile_failure(
    jax.errors.JaxRuntimeError(TPU_OUT_OF_MEMORY),
    'backward layer 3 (X)',
    least_bytes=1000,
  )
  assert isinstance(error, refusals.ProgramOutOfMemoryError)
  assert error.program == 'backward layer 3 (X)'
  assert error.least_bytes == int(20.00 * 2**30)
  assert str(error) == (
    f'the backend refused to compile backward layer 3 (X) for memory, '
    f'needing at least {int(20.00 * 2**30)} bytes (20.0 GiB): '
    f'JaxRuntimeError: {TPU_OUT_OF_MEMORY}'
  )
  # What the step holds across the call, where it is more.
  assert (
    refusals.compile_failure(
      jax.errors.JaxRuntimeError(TPU_OUT_OF_MEMORY), 'p', least_bytes=2**40
    ).least_bytes
    == 2**40
  )


def test_a_refusal_without_a_figure_needs_no_known_bytes():
  error = refusals.compile_failure(
    jax.errors.JaxRuntimeError('RESOURCE_EXHAUSTED: no figure'), 'p'
  )
  assert error.least_bytes is None
  assert str(error).startswith(
    'the backend refused to compile p for '
    'memory: JaxRuntimeError: RESOURCE_EXHAUSTED'
  )


def test_another_failure_is_one_line_naming_the_program():
  error = refusals.compile_failure(
    jax.errors.JaxRuntimeError(TPU_UNIMPLEMENTED + '\n\nmore lines'),
    'loss program, layers 0..5',
  )
  assert not isinstance(error, refusals.ProgramOutOfMemoryError)
  assert isinstance(error, refusals.ProgramCompileError)
  assert str(error) == (
    f'loss program, layers 0..5 did not compile: '
    f'JaxRuntimeError: {TPU_UNIMPLEMENTED} more lines'
  )
  # Named later (a walk knows the call, the program cache does not).
  unnamed = refusals.compile_failure(ValueError('bad'))
  assert str(unnamed) == 'a program did not compile: ValueError: bad'
  assert str(unnamed.named('forward layer 0 (Serial)')) == (
    'forward layer 0 (Serial) did not compile: ValueError: bad'
  )
