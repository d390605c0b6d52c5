"""Byte counts as people write them: '16GiB' -> bytes (printed back by
`byte_sizes.format_bytes`).
"""

import decimal
import re

_UNITS = {
  '': 1,
  'b': 1,
  'kb': 10**3,
  'mb': 10**6,
  'gb': 10**9,
  'tb': 10**12,
  'kib': 2**10,
  'mib': 2**20,
  'gib': 2**30,
  'tib': 2**40,
}
# More than any one device holds (1 PiB): a size past it is a typo.
MAX_DEVICE_BYTES = 2**50


def parse_bytes(text: str) -> int:
  """'16GiB', '16 GB', '512MiB', '1e9', '1.5GiB' -> bytes (int), exactly.

  The number is read as a decimal, not a float, so every whole byte count
  up to `MAX_DEVICE_BYTES` is kept exactly.

  Raises:
    ValueError: not a number with an optional unit (B, kB, MB, GB, TB,
      KiB, MiB, GiB, TiB; case-insensitive), zero, not a whole number of
      bytes, or more than `MAX_DEVICE_BYTES`.
  """
  match = re.fullmatch(
    r'\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*'
    r'([a-zA-Z]*)\s*',
    text,
  )
  unit = match and match.group(2).lower()
  if not match or unit not in _UNITS:
    raise ValueError(
      f'--device_memory={text!r} is not a size: give bytes '
      'or a number with a unit, e.g. 16GiB, 40GB, 512MiB'
    )
  number = decimal.Decimal(match.group(1))
  if number == 0:
    raise ValueError(
      f'--device_memory={text!r} is zero; give the memory of '
      f'one device, e.g. 16GiB'
    )
  # Exact: enough digits for the number as written times the unit.
  with decimal.localcontext() as context:
    context.prec = len(text) + 40
    context.Emin, context.Emax = decimal.MIN_EMIN, decimal.MAX_EMAX
    value = number * _UNITS[unit] if number <= MAX_DEVICE_BYTES else number
  if value > MAX_DEVICE_BYTES:
    raise ValueError(
      f'--device_memory={text!r} is more than any device '
      f'holds (at most {MAX_DEVICE_BYTES} bytes, 1 PiB); give '
      f'the memory of one device, e.g. 16GiB'
    )
  if value != value.to_integral_value():
    raise ValueError(
      f'--device_memory={text!r} is not a whole number of '
      f'bytes; give whole bytes or a unit, e.g. 512MiB'
    )
  return int(value)
