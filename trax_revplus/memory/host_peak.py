"""The peak resident set size of this process between two moments.

Linux keeps one high-water mark of a process's resident set size (`VmHWM` in
`/proc/self/status`, also getrusage's `ru_maxrss`), and lets the process
reset it to the current size by writing "5" to `/proc/self/clear_refs`
(Linux >= 4.0). Reading the mark after a step and resetting it gives that
step's true peak, short spikes included: exact and deterministic, with no
sampler thread.

There is one mark per process, so every reset must go through `reset()`,
which folds the peak it ends into each open `PeakWindow` and into the
process's lifetime peak (`process_peak_bytes`). Code that resets the mark by
other means makes those figures too low.

Elsewhere (no `/proc`, or the file cannot be written): `supported()` is
False, `reset()` returns None and `PeakWindow.peak_bytes()` and
`process_peak_bytes()` fall back to getrusage's `ru_maxrss`, the peak since
the process started, or to the current RSS where even that is missing.
"""

import sys
import threading
import weakref

from trax_revplus.memory import probes

try:
  import resource  # pylint: disable=g-import-not-at-top
except ImportError:  # Windows has no getrusage.
  resource = None  # type: ignore[assignment]  # the module or None

_STATUS_PATH = '/proc/self/status'
_CLEAR_REFS_PATH = '/proc/self/clear_refs'
# Written to clear_refs: reset the peak RSS to the current RSS (proc(5)).
_RESET_PEAK_RSS = '5'

_lock = threading.Lock()
_windows: weakref.WeakSet = weakref.WeakSet()
_can_reset = None  # Unknown until the first reset.


def hwm_bytes() -> int | None:
  """The kernel's peak RSS mark since the last reset (VmHWM), bytes.

  Returns:
    int, or None where `/proc/self/status` has no VmHWM.
  """
  try:
    with open(_STATUS_PATH, encoding='ascii', errors='replace') as f:
      for line in f:
        if line.startswith('VmHWM:'):
          return int(line.split()[1]) * 1024  # Reported in kB.
  except (OSError, ValueError, IndexError):
    pass
  return None


def _ru_maxrss_bytes():
  """getrusage's peak RSS, bytes; the current RSS without getrusage."""
  if resource is None:
    return probes.host_rss_bytes()
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  # ru_maxrss is in KiB on Linux and in bytes on macOS.
  return int(peak) if sys.platform == 'darwin' else int(peak) * 1024


def _mark_bytes():
  """The peak since the last reset: VmHWM, else ru_maxrss."""
  hwm = hwm_bytes()
  return hwm if hwm is not None else _ru_maxrss_bytes()


def supported() -> bool:
  """Whether `reset()` can reset the kernel's peak RSS mark (bool)."""
  global _can_reset
  with _lock:
    if _can_reset is None:
      peak = hwm_bytes()
      if peak is not None:
        _fold_all(peak)  # Trying the reset must not lose the peak so far.
      _can_reset = peak is not None and _write_clear_refs()
    return _can_reset


def _fold_all(peak_bytes):
  for window in list(_windows):
    window._fold(peak_bytes)  # pylint: disable=protected-access


def _write_clear_refs():
  try:
    with open(_CLEAR_REFS_PATH, 'w', encoding='ascii') as f:
      f.write(_RESET_PEAK_RSS)
    return True
  except OSError:
    return False


class PeakWindow:
  """The peak RSS of this process from the window's creation on.

  Creating a window resets the kernel's mark (where supported), so the
  window sees no earlier peak; later resets by `reset()` fold their peaks
  into every open window, so a window stays true across them.
  """

  def __init__(self):
    self._folded = 0
    reset()
    with _lock:
      _windows.add(self)

  def _fold(self, peak_bytes):
    self._folded = max(self._folded, peak_bytes)

  def peak_bytes(self) -> int:
    """Peak RSS since the window was created, bytes (int).

    Where the mark cannot be reset, the peak since the process started.
    """
    with _lock:
      return max(self._folded, _mark_bytes())


class _Lifetime(PeakWindow):
  """The window from process start: created without a reset."""

  def __init__(self):  # pylint: disable=super-init-not-called
    self._folded = _mark_bytes()
    with _lock:
      _windows.add(self)


def reset() -> int | None:
  """Ends the current interval: returns its peak RSS and resets the mark.

  The interval starts at the previous `reset()` (or at process start); its
  peak is folded into every open `PeakWindow` and the lifetime peak before
  the kernel's mark is set back to the current RSS.

  Returns:
    int, the interval's peak RSS in bytes; None where the mark cannot be
    reset (see the module docstring), then nothing is reset.
  """
  if not supported():
    return None
  with _lock:
    peak = hwm_bytes()
    if peak is None:
      return None
    _fold_all(peak)
    _write_clear_refs()
    return peak


def process_peak_bytes() -> int:
  """Peak RSS of this process since it started, bytes (int).

  Includes imports and initialization. Exact where the mark is reset only
  through `reset()`; else as getrusage's `ru_maxrss`.
  """
  return max(_LIFETIME.peak_bytes(), _ru_maxrss_bytes())


# Created at import, before any reset by this module.
_LIFETIME = _Lifetime()
