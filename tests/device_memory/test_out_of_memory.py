"""Telling a backend's out-of-memory errors, and the bytes they name.

The messages are those XLA's backends raise (TPU at compile and at run
time, its BFC allocator elsewhere), as `jax.errors.JaxRuntimeError`."""

import jax
import pytest

from trax_revplus.device_memory import out_of_memory

GiB = 2**30


@pytest.mark.parametrize(
  'message,asked,available',
  [
    (
      'RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm. Used '
      '16.01G of 15.75G hbm. Exceeded hbm capacity by 262.46M.',
      int(16.01 * GiB),
      int(15.75 * GiB),
    ),
    (
      'RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory '
      'required for HLO temporaries (16.01G) exceeds available HBM (15.75G)',
      int(16.01 * GiB),
      int(15.75 * GiB),
    ),
    (
      'RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory '
      'in memory space hbm. Used 20.18G of 15.48G hbm. Exceeded hbm capacity '
      'by 4.70G.',
      int(20.18 * GiB),
      int(15.48 * GiB),
    ),
    (
      'RESOURCE_EXHAUSTED: Error allocating device buffer: Attempting to '
      'allocate 2.00G. That was not possible. There are 1.50G free.',
      2 * GiB,
      int(1.5 * GiB),
    ),
    (
      'RESOURCE_EXHAUSTED: Out of memory while trying to allocate '
      '4294967296 bytes.',
      4 * GiB,
      None,
    ),
    ('RESOURCE_EXHAUSTED: something new', None, None),
  ],
)
def test_a_resource_exhausted_error_and_its_bytes(message, asked, available):
  error = jax.errors.JaxRuntimeError(message)
  assert out_of_memory.is_out_of_memory(error)
  found = out_of_memory.shortfall(error)
  assert found.asked_bytes == asked
  assert found.available_bytes == available


@pytest.mark.parametrize(
  'error',
  [
    jax.errors.JaxRuntimeError('INTERNAL: YNNPACK operation failed'),
    ValueError('RESOURCE_EXHAUSTED: not raised by a backend'),
  ],
)
def test_other_errors_are_not_out_of_memory(error):
  assert not out_of_memory.is_out_of_memory(error)
