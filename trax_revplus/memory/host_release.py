"""Gives host memory that the C allocator holds free back to the system.

XLA's CPU runtime and compiler allocate and free their temporaries with the
C library's `malloc`. glibc keeps freed memory in its arenas for reuse, so
after a compile or a large computation the process's resident set (RSS) stays
near its high-water mark, and the next phase's temporaries land on top of
it: in the reversible trainer the backward pass then peaks at the held
memory plus its own buffers. `malloc_trim(0)` (glibc >= 2.8) returns the
free pages of every arena. It is called only when RSS has grown by
`min_growth_bytes` since the last release, so a call that did not grow RSS
costs one RSS read (~20 us).
Elsewhere (musl, macOS, Windows) `HostMemoryReleaser.release` does nothing.

`set_mmap_threshold` fixes glibc's `M_MMAP_THRESHOLD`. By default glibc
raises that threshold each time a mapped block is freed, up to 32 MiB, so
after XLA's first large temporaries every block below 32 MiB comes from the
arenas and stays resident there once freed; which arena and which hole the
next call's blocks land in then varies from process to process. With a
fixed 1 MiB threshold each such block gets its own mapping, unmapped when
freed.
"""

import ctypes
import ctypes.util
import operator
import os

from trax_revplus.memory.probes import host_rss_bytes


def _load_glibc_function(name, argtypes):
  """Returns glibc's function `name` as a ctypes function, or None."""
  try:
    libc = ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6')
    fn = getattr(libc, name)
  except (OSError, AttributeError):
    return None
  fn.argtypes = argtypes
  fn.restype = ctypes.c_int
  return fn


_MALLOC_TRIM = _load_glibc_function('malloc_trim', [ctypes.c_size_t])
_MALLOPT = (
  _load_glibc_function('mallopt', [ctypes.c_int, ctypes.c_int])
  if _MALLOC_TRIM is not None
  else None
)  # glibc's, not another's
_M_MMAP_THRESHOLD = -3  # glibc's malloc.h
MAX_MMAP_THRESHOLD_BYTES = 32 * 2**20  # glibc's limit on 64-bit systems
_TUNABLE = 'glibc.malloc.mmap_threshold'


def available() -> bool:
  """Whether this process's C library can give free memory back (glibc)."""
  return _MALLOC_TRIM is not None


def set_mmap_threshold(nbytes: int) -> bool:
  """Makes glibc map blocks of `nbytes` or more on their own, for good.

  Calls `mallopt(M_MMAP_THRESHOLD, nbytes)`, which also stops glibc from
  raising the threshold as mapped blocks are freed. Applies to the whole
  process, from this call on; a later call replaces it.

  Args:
    nbytes: int (or integer-like, not bool) in [0,
      `MAX_MMAP_THRESHOLD_BYTES`] (32 MiB), block size in bytes from which
      `malloc` maps a block of its own.

  Returns:
    bool, whether the threshold was set: False without glibc, and when the
    environment's `GLIBC_TUNABLES` sets `glibc.malloc.mmap_threshold`
    (the user's choice is kept).

  Raises:
    ValueError: `nbytes` is not an int in that range (checked first).
  """
  try:
    value = None if isinstance(nbytes, bool) else operator.index(nbytes)
  except TypeError:
    value = None
  if value is None or not 0 <= value <= MAX_MMAP_THRESHOLD_BYTES:
    raise ValueError(
      f'the mmap threshold must be an int number of bytes in [0, '
      f"{MAX_MMAP_THRESHOLD_BYTES}] (glibc's limit), got {nbytes!r}."
    )
  if _MALLOPT is None or _TUNABLE in os.environ.get('GLIBC_TUNABLES', ''):
    return False
  return _MALLOPT(_M_MMAP_THRESHOLD, value) == 1


class HostMemoryReleaser:
  """Calls `malloc_trim(0)` when RSS grew enough since the last call.

  Attributes:
    released_bytes: int, total RSS decrease measured across releases.
  """

  def __init__(self, min_growth_bytes: int = 32 * 2**20):
    """Creates a releaser.

    Args:
      min_growth_bytes: int >= 0, RSS growth (bytes) since the last release
        below which `release` does nothing.
    """
    self._min_growth_bytes = int(min_growth_bytes)
    self._rss_after_release = 0
    self.released_bytes = 0

  def release(self, keep_bytes: int = 0) -> int:
    """Returns free allocator memory to the system if RSS grew enough.

    Args:
      keep_bytes: int >= 0, growth on top of `min_growth_bytes` not worth
        returning: memory the caller will take again soon (e.g. a step's
        own working set, faulted in again by its next phase).

    Returns:
      int, bytes by which RSS went down (0 if nothing was attempted, or
      without glibc).
    """
    if _MALLOC_TRIM is None:
      return 0
    before = host_rss_bytes()
    if before - self._rss_after_release < self._min_growth_bytes + keep_bytes:
      return 0
    _MALLOC_TRIM(0)
    self._rss_after_release = host_rss_bytes()
    released = max(0, before - self._rss_after_release)
    self.released_bytes += released
    return released
