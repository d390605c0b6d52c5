"""The records of `memory.jsonl`: their fields, one-line form, and reading.

A record is one JSON object on one line. Every figure carries its unit in its
name; sizes are in bytes, durations in seconds, times in Unix seconds.

  Always present:
    step (int): training step the record belongs to; trax's Loop numbers the
      first training step 1; records made while initializing use 0.
    phase (str): what the record measures. The trainer writes
      'init' (a layer's weights and slots placed on the host),
      'start' (the process began training: one per process, before its
        first step's records; its step is the last step done before this
        process, 0 for a fresh run),
      'forward', 'loss', 'backward' and 'free' (device buffers released):
        phases of a recorded step,
      'step' (one per step, after its phases),
      'end' (the log was closed: after the process's last step);
      any other string is accepted.
    time (float): Unix time when the record was made, seconds.

  From the probes (omitted when a probe failed earlier in the run, and in
  'step' records of steps without phase records):
    host_rss_bytes (int): resident set size of this process.
    device_bytes_in_use (int): bytes in use, summed over the probed devices.
    device_peak_bytes (int or None): sum over devices of each device's peak
      bytes in use, where the backend reports it (`Device.memory_stats()`
      'peak_bytes_in_use'); None for the live-array fallback.
    device_bytes_source (str): 'memory_stats' when every probed device
      reports `Device.memory_stats()` (GPU, TPU); 'live_arrays' otherwise
      (CPU), where the bytes are those of `jax.live_arrays()` resident on each
      device, each array's shards counted on the devices that hold them.
    device_bytes_in_use_per_device (list of int): the same, per device, in
      the order of the probed devices.

  'start', 'step' and 'end' records (`host_peak`):
    host_peak_bytes (int): the true peak RSS of the interval the record
      closes: for 'step', from the step's begin to its end; for 'start',
      from process start to the first step's begin (imports, building and
      initializing the model); for 'end', from the last step's end to the
      log's closing (evals, checkpoints).
    host_peak_source (str): 'kernel_hwm' where the kernel's high-water mark
      is reset around each step (Linux), so the figure is exact;
      'sampled' elsewhere, and while the log writes no `memory.jsonl`
      (the kernel's mark is then left to the process): the largest RSS read
      at the step's boundaries and phase records, a lower bound.
    process_index (int): `jax.process_index()` of the writing process.
    pid (int): its operating-system process id.
  'start' also: process_start_time (float, Unix seconds, when the process
    was created). 'step' also: seconds, h2d_bytes, d2h_bytes of the whole
    step; host_peak_between_steps_bytes (int, the peak RSS from the
    previous step's end to this step's begin: evals and checkpoints run
    there; absent for the first step of a process); recorded (bool, whether
    the step has phase records).

  From the caller (present when passed; the trainer's fields):
    seconds (float): wall time of the phase.
    layer (int): index of the layer in the trainer's `all_layers` order
      (per-layer records only).
    layer_name (str): the layer's name (per-layer records only).
    h2d_bytes, d2h_bytes (int): bytes copied host-to-device and
      device-to-host during the phase.
    weights_bytes, slots_bytes (int): bytes of the layer's weights and
      optimizer slots.
    host_rss_added_bytes (int): growth of host RSS while the layer was
      initialized.
    freed_arrays (int), freed_bytes (int): device arrays released and their
      bytes.
    host_released_bytes (int): decrease of host RSS when free C-allocator
      memory was given back to the system during the phase
      (`host_release.HostMemoryReleaser`).
  Other caller fields are written as given (numpy and JAX scalars and arrays
  become JSON numbers and lists; non-finite floats become null).

Readers skip a line that is not a valid record, e.g. one cut short by a
killed writer (`reading`).
"""

import math
import os
from typing import Any

import jax
import numpy as np

from trax_revplus.byte_sizes import format_bytes

MEMORY_LOG_FILENAME = 'memory.jsonl'
TENSORBOARD_SUBDIR = 'memory'

Record = dict[str, Any]


def to_json_value(value: Any) -> Any:
  """Converts a field value to plain JSON types (numbers, str, lists, dicts)."""
  if value is None or isinstance(value, (bool, int, str)):
    return value
  if isinstance(value, float):
    return value if math.isfinite(value) else None
  if isinstance(value, np.generic):
    return to_json_value(value.item())
  if isinstance(value, dict):
    return {str(k): to_json_value(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [to_json_value(v) for v in value]
  if isinstance(value, (np.ndarray, jax.Array)):
    value = np.asarray(value)
    return to_json_value(value.item() if value.ndim == 0 else value.tolist())
  return str(value)


def format_record(record: Record) -> str:
  """Returns the one-line, human-readable form of a record (str).

  E.g. 'memory step 101 backward layer 3 (ReversibleHalfResidual): host
  1532.4 MiB, device 210.3 MiB (live arrays), H2D 12.1 MiB, D2H 12.1 MiB,
  0.412 s'.
  """
  head = f'memory step {record.get("step")} {record.get("phase")}'
  if record.get('layer') is not None:
    head += f' layer {record["layer"]}'
    if record.get('layer_name'):
      head += f' ({record["layer_name"]})'
  parts = []
  if record.get('host_rss_bytes') is not None:
    parts.append('host ' + format_bytes(record['host_rss_bytes']))
  if isinstance(record.get('host_peak_bytes'), (int, float)):
    parts.append('host peak ' + format_bytes(record['host_peak_bytes']))
  if record.get('device_bytes_in_use') is not None:
    device = 'device ' + format_bytes(record['device_bytes_in_use'])
    if record.get('device_peak_bytes') is not None:
      device += ', peak ' + format_bytes(record['device_peak_bytes'])
    if record.get('device_bytes_source') == 'live_arrays':
      device += ' (live arrays)'
    parts.append(device)
  labelled = [('weights_bytes', 'weights'), ('slots_bytes', 'slots'),
              ('host_rss_added_bytes', 'host added'),
              ('h2d_bytes', 'H2D'), ('d2h_bytes', 'D2H')]
  for key, label in labelled:
    if isinstance(record.get(key), (int, float)):
      parts.append(f'{label} {format_bytes(record[key])}')
  if isinstance(record.get('freed_bytes'), (int, float)):
    freed = 'freed '
    if record.get('freed_arrays') is not None:
      freed += f'{record["freed_arrays"]} arrays, '
    parts.append(freed + format_bytes(record['freed_bytes']))
  if isinstance(record.get('seconds'), (int, float)):
    parts.append(f'{record["seconds"]:.3f} s')
  return head + ': ' + ', '.join(parts)


def is_number(value: Any) -> bool:
  """Whether `value` is a JSON number (int or float, not bool)."""
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def peaks(records: list[Record]) -> dict[str, int | None]:
  """The largest figures of a run's records, for `compare` and plots.

  Args:
    records: from `reading.read_memory_log`.

  Returns:
    dict with 'host_peak_bytes' (the largest host_peak_bytes or
    host_rss_bytes, int), 'device_bytes_peak' (the largest
    device_bytes_in_use or device_peak_bytes, int) and 'peak_device_bytes'
    (the largest XLA-computed `peak_device_bytes` a trainer wrote, int);
    each None where no record carries the figure.
  """
  def largest(keys):
    values = [r[k] for r in records for k in keys if is_number(r.get(k))]
    return int(max(values)) if values else None
  return {
      'host_peak_bytes': largest(('host_peak_bytes', 'host_rss_bytes',
                                  'host_peak_between_steps_bytes')),
      'device_bytes_peak': largest(('device_bytes_in_use',
                                    'device_peak_bytes')),
      'peak_device_bytes': largest(('peak_device_bytes',)),
  }


def ends_without_newline(path: str) -> bool:
  """Whether `path` exists, is non-empty and its last byte is not a newline."""
  try:
    with open(path, 'rb') as f:
      f.seek(0, os.SEEK_END)
      if f.tell() == 0:
        return False
      f.seek(-1, os.SEEK_END)
      return f.read(1) != b'\n'
  except FileNotFoundError:
    return False
