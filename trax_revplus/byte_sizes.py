"""Byte counts as the package prints them, e.g. '12.1 MiB' or '1.5 GiB'.

Only the standard library is imported here: the CLI formats sizes before
trax's import, and every package (`memory`, `cli`, `compare`,
`checkpoints`, `device_memory`, `trainer`) may import this module without
a cycle.
"""

# Bytes in one MiB, the unit every figure printed in MiB is divided by.
BYTES_PER_MIB = 1 << 20

_UNIT_BYTES = {'KiB': 1 << 10, 'MiB': BYTES_PER_MIB, 'GiB': 1 << 30}


def format_bytes(
  nbytes: float | None,
  unit: str | None = 'MiB',
  spec: str = '.1f',
  suffix: bool = True,
  none: str = '-',
) -> str:
  """A byte count in a binary unit, e.g. '12.1 MiB'.

  Args:
    nbytes: bytes, or None where unknown.
    unit: 'KiB', 'MiB' or 'GiB'; None: the largest of them that `nbytes`
      reaches, and below 1 KiB the bytes as given with ' B' ('512 B').
    spec: the number's format spec, e.g. '.1f', '.0f', '.4g'.
    suffix: the unit after the number ('12.1 MiB'); False: the number
      alone ('12.1'), for a table whose header names the unit.
    none: the text for None.

  Returns:
    str.
  """
  if nbytes is None:
    return none
  if unit is None:
    unit = next(
      (name for name, size in reversed(_UNIT_BYTES.items()) if nbytes >= size),
      None,
    )
    if unit is None:
      return f'{nbytes} B'
  number = format(nbytes / _UNIT_BYTES[unit], spec)
  return f'{number} {unit}' if suffix else number


def format_apart(*nbytes: int) -> list[str]:
  """Byte counts a line compares, each in its own binary unit
  (`format_bytes(n, unit=None)`), or all in bytes ('2048 bytes') where the
  unit's rounding would show two different counts alike (a need just over
  a budget must not read as equal to it)."""
  words = [format_bytes(n, unit=None) for n in nbytes]
  if len(set(words)) < len(set(nbytes)):
    return [f'{n} bytes' for n in nbytes]
  return words
