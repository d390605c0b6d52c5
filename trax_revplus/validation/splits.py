"""Checks of the device count and of how a batch splits over devices (the
plan's dimensions check their own splits: `trainer._plan.dimensions`)."""

from typing import TYPE_CHECKING

import numpy as np

from trax_revplus import trax_import
from trax_revplus.validation import errors

if TYPE_CHECKING:  # Annotations only: jax is imported inside the check.
  from trax_revplus.typing import Batch


def check_n_devices(n_devices: object) -> int:
  """Checks `n_devices` against the devices this process can use.

  Args:
    n_devices: int >= 1, or None for all local devices.

  Returns:
    The number of devices to use (int).

  Raises:
    DeviceCountError: if n_devices is not a positive int or exceeds
      `jax.local_device_count()`.
  """
  jax = trax_import.jax
  available = jax.local_device_count()
  if n_devices is None:
    return available
  if isinstance(n_devices, bool) or not isinstance(
    n_devices, (int, np.integer)
  ):
    raise errors.DeviceCountError(
      f'n_devices must be an int or None, got {n_devices!r}; pass None to '
      f'use all {available} local device(s).'
    )
  platform = jax.local_devices()[0].platform
  if not 1 <= n_devices <= available:
    raise errors.DeviceCountError(
      f'n_devices={n_devices} but this process has {available} local '
      f'{platform} device(s); pass n_devices between 1 and {available} '
      f'(or None for all), or run where more devices are visible (on CPU: '
      f'XLA_FLAGS=--xla_force_host_platform_device_count={n_devices} before '
      f'JAX is imported).'
    )
  return int(n_devices)


def check_batch(batch: 'Batch', n_devices: int) -> None:
  """Checks that every array of `batch` splits evenly over `n_devices`.

  Args:
    batch: array or tuple/list of arrays of shape (B, ...).
    n_devices: int >= 1.

  Raises:
    BatchSizeError: if some array has no leading axis or B % n_devices != 0.
  """
  arrays = batch if isinstance(batch, (list, tuple)) else (batch,)
  for k, x in enumerate(arrays):
    shape = np.shape(x)
    if not shape:
      raise errors.BatchSizeError(
        f'batch element {k} is a scalar; every batch element needs a '
        f'leading batch axis of shape (B, ...).'
      )
    if shape[0] % n_devices:
      raise errors.BatchSizeError(
        f'batch element {k} has batch size {shape[0]} (shape {shape}), '
        f'not divisible by the {n_devices} devices; use a batch size that '
        f'is a multiple of {n_devices} '
        f'(e.g. {n_devices * max(1, shape[0] // n_devices)}) '
        f'or set n_devices to a divisor of {shape[0]}.'
      )
