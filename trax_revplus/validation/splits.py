"""Checks of the device count and of how a batch splits over devices."""

import numpy as np

from trax_revplus.validation import errors


def check_n_devices(n_devices):
  """Checks `n_devices` against the devices this process can use.

  Args:
    n_devices: int >= 1, or None for all local devices.

  Returns:
    The number of devices to use (int).

  Raises:
    DeviceCountError: if n_devices is not a positive int or exceeds
      `jax.local_device_count()`.
  """
  import jax  # pylint: disable=g-import-not-at-top
  available = jax.local_device_count()
  if n_devices is None:
    return available
  if isinstance(n_devices, bool) or not isinstance(
      n_devices, (int, np.integer)):
    raise errors.DeviceCountError(
        f'n_devices must be an int or None, got {n_devices!r}; pass None to '
        f'use all {available} local device(s).')
  platform = jax.local_devices()[0].platform
  if not 1 <= n_devices <= available:
    raise errors.DeviceCountError(
        f'n_devices={n_devices} but this process has {available} local '
        f'{platform} device(s); pass n_devices between 1 and {available} '
        f'(or None for all), or run where more devices are visible (on CPU: '
        f'XLA_FLAGS=--xla_force_host_platform_device_count={n_devices} before '
        f'JAX is imported).')
  return int(n_devices)


def check_batch(batch, n_devices):
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
          f'leading batch axis of shape (B, ...).')
    if shape[0] % n_devices:
      raise errors.BatchSizeError(
          f'batch element {k} has batch size {shape[0]} (shape {shape}), '
          f'not divisible by the {n_devices} devices; use a batch size that '
          f'is a multiple of {n_devices} '
          f'(e.g. {n_devices * max(1, shape[0] // n_devices)}) '
          f'or set n_devices to a divisor of {shape[0]}.')


def check_batch_slices(batch_slices, rows):
  """Checks that `batch_slices` divides each device's `rows` of the batch.

  Args:
    batch_slices: int >= 1, the trainer's `batch_slices`.
    rows: int, rows of the batch each device gets.

  Raises:
    BatchSlicesError: if `rows % batch_slices != 0`.
  """
  if rows % batch_slices:
    divisors = [k for k in range(1, rows + 1) if rows % k == 0]
    raise errors.BatchSlicesError(
        f'trax_revplus.ReversibleSerialTrainer.batch_slices = {batch_slices} '
        f'does not divide the {rows} rows of the batch each device gets; use '
        f'one of {divisors}, or a batch whose rows per device are a '
        f'multiple of {batch_slices}.')


def check_sequence_chunks(sequence_chunks, length, loss_name):
  """Checks that `sequence_chunks` can split the loss layer's tail.

  Args:
    sequence_chunks: int >= 1, the trainer's `sequence_chunks`.
    length: int, the sequence length of the loss layer's tail's inputs, or
      None where the loss layer has no tail that can run in chunks
      (`trainer.sequence_chunks.tail_length`).
    loss_name: str, the loss layer's name (for the message).

  Raises:
    SequenceChunksError: sequence_chunks > 1 and `length` is None or not a
      multiple of it.
  """
  name = 'trax_revplus.ReversibleSerialTrainer.sequence_chunks'
  if sequence_chunks == 1:
    return
  if length is None:
    raise errors.SequenceChunksError(
        f'{name} = {sequence_chunks}: the loss layer {loss_name} does not '
        f'end in layers that act on each position alone and a weighted mean '
        f'or sum (the list: trax_revplus.trainer.sequence_chunks); set it '
        f'to 1.')
  if length % sequence_chunks:
    divisors = [c for c in range(1, min(length, 64) + 1) if length % c == 0]
    raise errors.SequenceChunksError(
        f'{name} = {sequence_chunks} does not divide the sequence length '
        f'{length} of the loss layer\'s inputs; use a divisor of {length}, '
        f'e.g. one of {divisors}.')


def check_micro_batches(micro_batches, rows, batch_slices, refusal):
  """Checks that `micro_batches` can split each device's rows.

  Args:
    micro_batches: int >= 1, the trainer's `micro_batches`.
    rows: int, rows of the batch each device gets.
    batch_slices: int >= 1, the batch slices each part's calls run over.
    refusal: str or None, why the step cannot run in micro-batches
      (`trainer.micro_batches.refusal`).

  Raises:
    MicroBatchesError: micro_batches > 1 and it does not divide `rows`,
      `batch_slices` does not divide a part's rows, or `refusal` is set.
  """
  name = 'trax_revplus.ReversibleSerialTrainer.micro_batches'
  if micro_batches == 1:
    return
  if refusal is not None:
    raise errors.MicroBatchesError(
        f'{name} = {micro_batches}: {refusal}; set it to 1.')
  if rows % micro_batches:
    divisors = [m for m in range(1, rows + 1) if rows % m == 0]
    raise errors.MicroBatchesError(
        f'{name} = {micro_batches} does not divide the {rows} rows of the '
        f'batch each device gets; use one of {divisors}, or a batch whose '
        f'rows per device are a multiple of {micro_batches}.')
  part_rows = rows // micro_batches
  if part_rows % batch_slices:
    raise errors.MicroBatchesError(
        f'{name} = {micro_batches} leaves {part_rows} rows per device in '
        f'each part, which batch_slices = {batch_slices} does not divide; '
        f'use micro_batches and batch_slices whose product divides {rows}.')
