"""The records of `memory.jsonl`: their one-line form and JSON values.

A record is one JSON object on one line; what each field means, and the
types readers check: `fields`. Readers skip a line that is not a valid
record, e.g. one cut short by a killed writer (`reading`).
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
  labelled = [
    ('weights_bytes', 'weights'),
    ('slots_bytes', 'slots'),
    ('host_rss_added_bytes', 'host added'),
    ('h2d_bytes', 'H2D'),
    ('d2h_bytes', 'D2H'),
  ]
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
    'host_peak_bytes': largest(
      ('host_peak_bytes', 'host_rss_bytes', 'host_peak_between_steps_bytes')
    ),
    'device_bytes_peak': largest(('device_bytes_in_use', 'device_peak_bytes')),
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
