"""Gives host memory that the C allocator holds free back to the system.

XLA's CPU runtime and compiler allocate and free their temporaries with the
C library's `malloc`. glibc keeps freed memory in its arenas for reuse, so
after a compile or a large computation the process's resident set (RSS) stays
near its high-water mark, and the next phase's temporaries land on top of
it: in the reversible trainer the backward pass then peaks at the held
memory plus its own buffers. `malloc_trim(0)` (glibc >= 2.8) returns the
free pages of every arena. It is called only when RSS has grown by
`min_growth_bytes` since the last release, so a call that did not grow RSS costs one RSS read (~20 us).
Elsewhere (musl, macOS, Windows) `HostMemoryReleaser.release` does nothing.
"""

import ctypes
import ctypes.util

from trax_revplus import memory


def _load_malloc_trim():
  """Returns glibc's `malloc_trim` as a ctypes function, or None."""
  try:
    libc = ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6')
    trim = libc.malloc_trim
  except (OSError, AttributeError):
    return None
  trim.argtypes = [ctypes.c_size_t]
  trim.restype = ctypes.c_int
  return trim


_MALLOC_TRIM = _load_malloc_trim()


def available():
  """Whether this process's C library can give free memory back (glibc)."""
  return _MALLOC_TRIM is not None


class HostMemoryReleaser:
  """Calls `malloc_trim(0)` when RSS grew enough since the last call.

  Attributes:
    released_bytes: int, total RSS decrease measured across releases.
  """

  def __init__(self, min_growth_bytes=32 * 2**20):
    """Creates a releaser.

    Args:
      min_growth_bytes: int >= 0, RSS growth (bytes) since the last release
        below which `release` does nothing.
    """
    self._min_growth_bytes = int(min_growth_bytes)
    self._rss_after_release = 0
    self.released_bytes = 0

  def release(self):
    """Returns free allocator memory to the system if RSS grew enough.

    Returns:
      int, bytes by which RSS went down (0 if nothing was attempted, or
      without glibc).
    """
    if _MALLOC_TRIM is None:
      return 0
    before = memory.host_rss_bytes()
    if before - self._rss_after_release < self._min_growth_bytes:
      return 0
    _MALLOC_TRIM(0)
    self._rss_after_release = memory.host_rss_bytes()
    released = max(0, before - self._rss_after_release)
    self.released_bytes += released
    return released
