"""Telling a device's out-of-memory error from others, and reading its bytes.

A backend that cannot give a program the memory it needs raises
`jax.errors.JaxRuntimeError` with XLA's status RESOURCE_EXHAUSTED: on a TPU
at compile time already, for a program whose buffers exceed the chip's
memory ("Ran out of memory in memory space hbm. Used 16.01G of 15.75G
hbm."; "the total memory required for HLO temporaries (16.01G) exceeds
available HBM (15.75G)"), and on any backend at run time, when an
allocation fails ("Out of memory while trying to allocate 4294967296
bytes."; "Attempting to allocate 2.00G. That was not possible. There are
1.50G free."). `is_out_of_memory` tells such an error; `shortfall` reads
the bytes it asked for and the bytes there were, where its message says.
"""

import dataclasses
import re

# XLA's status code, first in the message of every such error.
_STATUS = 'RESOURCE_EXHAUSTED'
_UNITS = {'': 1, 'B': 1, 'K': 2**10, 'M': 2**20, 'G': 2**30, 'T': 2**40}
_SIZE = r'(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?'
# (pattern, which group is asked, which is available); sizes as _SIZE.
_FORMS = (
  (re.compile(rf'Used {_SIZE} of {_SIZE}', re.I), 0, 1),
  (
    re.compile(
      rf'required for [\w ]+\({_SIZE}\) exceeds available '
      rf'[\w ]*\({_SIZE}\)',
      re.I,
    ),
    0,
    1,
  ),
  (
    re.compile(
      rf'allocate {_SIZE}\b.*?There (?:are|is) {_SIZE} free', re.I | re.S
    ),
    0,
    1,
  ),
  (re.compile(r'allocate (\d+)() bytes', re.I), 0, None),
)


@dataclasses.dataclass(frozen=True)
class Shortfall:
  """What an out-of-memory error says it asked for and what there was.

  Attributes:
    asked_bytes: bytes the program or allocation needed, or None where the
      message does not say.
    available_bytes: bytes the device had for it, or None.
  """

  asked_bytes: int | None = None
  available_bytes: int | None = None


def is_out_of_memory(error: BaseException) -> bool:
  """Whether `error` is a backend's RESOURCE_EXHAUSTED error: a program or
  an allocation the device has no memory for."""
  # jax.errors.JaxRuntimeError, or the same status re-raised by a caller
  # that kept the message (e.g. a compilation on a helper thread).
  return isinstance(error, RuntimeError) and str(error).lstrip().startswith(
    _STATUS
  )


def _bytes(number: str, unit: str) -> int:
  return int(float(number) * _UNITS[unit.upper()])


def shortfall(error: BaseException) -> Shortfall:
  """The bytes `error`'s message says were asked for and available."""
  text = str(error)
  for pattern, asked, available in _FORMS:
    match = pattern.search(text)
    if match:
      sizes = match.groups()
      return Shortfall(
        _bytes(*sizes[2 * asked : 2 * asked + 2]),
        None
        if available is None
        else _bytes(*sizes[2 * available : 2 * available + 2]),
      )
  return Shortfall()


def first_line(error: BaseException) -> str:
  """The first line of `error`'s message (XLA appends allocator dumps)."""
  lines = str(error).strip().splitlines()
  return lines[0].strip() if lines else type(error).__name__
