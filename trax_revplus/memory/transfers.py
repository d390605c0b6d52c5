"""`TransferCounter`: bytes copied host-to-device and device-to-host."""

import threading


class TransferCounter:
  """Counts bytes moved between host and devices.

  The code that issues a copy adds its size; counting at the call site is
  exact and free, where probing the runtime is neither. Thread-safe, so
  copies completed on a background thread may count themselves.

  Attributes:
    h2d_bytes: int, bytes copied host-to-device since creation.
    d2h_bytes: int, bytes copied device-to-host since creation.
  """

  def __init__(self):
    self._lock = threading.Lock()
    self.h2d_bytes = 0
    self.d2h_bytes = 0

  def add_h2d(self, nbytes: int) -> None:
    """Counts `nbytes` (int, bytes) copied host-to-device."""
    with self._lock:
      self.h2d_bytes += int(nbytes)

  def add_d2h(self, nbytes: int) -> None:
    """Counts `nbytes` (int, bytes) copied device-to-host."""
    with self._lock:
      self.d2h_bytes += int(nbytes)

  def snapshot(self) -> tuple[int, int]:
    """Returns (h2d_bytes, d2h_bytes), both int bytes, read together."""
    with self._lock:
      return (self.h2d_bytes, self.d2h_bytes)

  def since(self, snapshot: tuple[int, int]) -> tuple[int, int]:
    """Returns (h2d_bytes, d2h_bytes) moved since an earlier `snapshot()`."""
    h2d, d2h = self.snapshot()
    return (h2d - snapshot[0], d2h - snapshot[1])
