"""`CompileCounter`: the programs JAX compiled in this process, as counted
by JAX's public monitoring events (`jax.monitoring`).

A program JAX reads back from its persistent compilation cache
(`trax_revplus.compilation_cache`) passes through the same compile event,
in far less time; it is counted apart too (`cache_hits`)."""

import threading
from typing import Any

import jax

from trax_revplus.device_memory import compile_threads

# The jax.monitoring event of one program's compilation by XLA.
_BACKEND_COMPILE_EVENT = '/jax/core/compile/backend_compile_duration'
# The jax.monitoring event of a program read from the persistent cache.
_CACHE_HIT_EVENT = '/jax/compilation_cache/cache_hits'


class CompileCounter:
  """Programs JAX compiled in this process and their compile seconds.

  Fed by `jax.monitoring`'s event-duration listeners (one per process,
  registered on first use), so compilations on any thread count, e.g. those
  a trainer runs on helper threads, but those of a plan that compiles
  beside the training steps (`compile_threads.beside_steps`).
  """

  _lock = threading.Lock()
  _programs = 0
  _seconds = 0.0
  _names: list[str] = []
  _cache_hits = 0
  _registered = False

  @classmethod
  def _listen(cls, event: str, duration_secs: float, **kwargs: Any) -> None:
    # A plan's program compiling beside the steps (while they run another
    # plan) is no step's compiling.
    if event != _BACKEND_COMPILE_EVENT or (
      compile_threads.compiling_beside_steps()
    ):
      return
    with cls._lock:
      cls._programs += 1
      cls._seconds += duration_secs
      cls._names.append(str(kwargs.get('fun_name', '?')))

  @classmethod
  def _listen_event(cls, event: str, **kwargs: Any) -> None:
    del kwargs
    if event == _CACHE_HIT_EVENT:
      with cls._lock:
        cls._cache_hits += 1

  @classmethod
  def _register(cls) -> None:
    """Listens from now on (once per process); call with the lock held."""
    if not cls._registered:
      jax.monitoring.register_event_duration_secs_listener(cls._listen)
      jax.monitoring.register_event_listener(cls._listen_event)
      cls._registered = True

  @classmethod
  def snapshot(cls) -> tuple[int, float]:
    """(programs compiled, their compile seconds summed) so far; programs
    read from the persistent compilation cache count among them."""
    with cls._lock:
      cls._register()
      return cls._programs, cls._seconds

  @classmethod
  def cache_hits(cls) -> int:
    """Programs read from the persistent compilation cache so far."""
    with cls._lock:
      cls._register()
      return cls._cache_hits

  @classmethod
  def names_since(cls, programs: int) -> list[str]:
    """Names of the functions compiled after the first `programs`."""
    with cls._lock:
      return list(cls._names[programs:])
