"""`CompileCounter`: the programs JAX compiled in this process, as counted
by JAX's public monitoring events (`jax.monitoring`)."""

import threading
from typing import Any

import jax

# The jax.monitoring event of one program's compilation by XLA.
_BACKEND_COMPILE_EVENT = '/jax/core/compile/backend_compile_duration'


class CompileCounter:
  """Programs JAX compiled in this process and their compile seconds.

  Fed by `jax.monitoring`'s event-duration listeners (one per process,
  registered on first use), so compilations on any thread count, e.g. those
  a trainer runs on helper threads.
  """

  _lock = threading.Lock()
  _programs = 0
  _seconds = 0.0
  _names: list[str] = []
  _registered = False

  @classmethod
  def _listen(cls, event: str, duration_secs: float, **kwargs: Any) -> None:
    if event != _BACKEND_COMPILE_EVENT:
      return
    with cls._lock:
      cls._programs += 1
      cls._seconds += duration_secs
      cls._names.append(str(kwargs.get('fun_name', '?')))

  @classmethod
  def snapshot(cls) -> tuple[int, float]:
    """(programs compiled, their compile seconds summed) so far."""
    with cls._lock:
      if not cls._registered:
        jax.monitoring.register_event_duration_secs_listener(cls._listen)
        cls._registered = True
      return cls._programs, cls._seconds

  @classmethod
  def names_since(cls, programs: int) -> list[str]:
    """Names of the functions compiled after the first `programs`."""
    with cls._lock:
      return list(cls._names[programs:])
