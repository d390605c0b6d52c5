"""The programs a step's calls run, by call key: traced, compiled on demand
on the compile threads, analyzed once.

`Programs` is shared by every walk of a trainer (`trainer._accounting.
on_types`) and by the replays of other trainers' schedules
(`stock_trainer`, `default_trainer`): a call key seen again (equal layers
share one jitted function; walks of several plans share programs) traces
and compiles nothing. A program traced and not compiled yet has its figures
before it compiles (`estimates`); one the backend does not compile is kept
as such, so that no other walk compiles it again.
"""

import concurrent.futures
import time
from typing import Any, Callable, Hashable, Iterable, Protocol

import jax

from trax_revplus.device_memory import compile_threads
from trax_revplus.device_memory import estimates
from trax_revplus.device_memory import program as program_lib
from trax_revplus.device_memory import refusals
from trax_revplus.typing import PyTree


class Lowerable(Protocol):
  """A function a step calls: `jax.jit`'s (a `jax.stages.Wrapped`, traced
  then lowered) or `jax.pmap`'s (only lowered)."""

  def __call__(self, *args: Any) -> Any: ...

  def lower(self, *args: Any) -> jax.stages.Lowered: ...


def call_key(fn: Callable, args: PyTree) -> Hashable:
  """The key of a call of `fn` with `args`: equal for calls that run one
  program (the function's id, `program.types_key` of the arguments)."""
  return (id(fn), program_lib.types_key(args))


class Programs:
  """Programs for calls, by `call_key`: traced, compiled on demand, analyzed.

  A program is added either compiled and analyzed at once (`analyzed`), or
  traced only (`add_traced`): its result types are known then, and its
  figures before it compiles (`uncompiled`). `compile` starts the
  compilations of traced programs on helper threads (one per CPU core: XLA
  compiles without the GIL, so programs compile beside each other and
  beside the tracing) and `wait` waits for them; `analysis` compiles a
  program not started yet and reads its memory analysis once. A program
  that did not compile raises its `refusals.ProgramCompileError` each time
  it is asked for, and is not compiled again.

  Attributes:
    compile_spans: dict key -> (start, end), `time.monotonic()` seconds of
      each compilation started here (end None while it runs).
    trace_spans: dict key -> (start, end) of each program's trace, where
      its tracer timed it.
  """

  def __init__(self):
    self._outputs = {}  # key -> result types
    self._traced = {}  # key -> (jax.stages.Traced, args), until compiled
    self._compiled = {}  # key -> future of jax.stages.Compiled
    # key -> the function, kept alive so that its id in the key is not
    # reused by another.
    self._functions = {}
    self._analyses = {}  # key -> program.Analysis
    self._failed = {}  # key -> refusals.ProgramCompileError
    self._uncompiled = {}  # key -> estimates.Uncompiled
    self.compile_spans: dict[Hashable, tuple[float, float | None]] = {}
    self.trace_spans: dict[Hashable, tuple[float, float]] = {}

  def __contains__(self, key: Hashable) -> bool:
    return key in self._outputs

  def add_traced(
    self,
    key: Hashable,
    fn: Callable,
    traced: jax.stages.Traced,
    args: tuple = (),
    trace_span: tuple[float, float] | None = None,
  ) -> None:
    """Adds the program of `key`: `fn` traced for a call with `args`
    (abstract), not compiled yet (`compile`); `trace_span` is the
    (start, end) `time.monotonic()` seconds of its trace."""
    self._outputs[key] = traced.out_info
    self._functions[key] = fn
    self._traced[key] = (traced, args)
    if trace_span is not None:
      self.trace_spans[key] = trace_span

  def compile(
    self, keys: Iterable[Hashable], beside_steps: bool = False
  ) -> None:
    """Starts compiling the traced programs of `keys` not started yet, each
    on a helper thread; returns at once (`wait`). `beside_steps`: they
    compile while training steps run (`compile_threads.beside_steps`)."""
    for key in keys:
      if (
        key in self._compiled or key in self._failed or (key in self._analyses)
      ):
        continue
      traced, _ = self._traced[key]
      self._compiled[key] = compile_threads.compile_pool().submit(
        self._compile_timed, key, traced, beside_steps
      )

  def _compile_timed(self, key, traced, beside_steps=False):
    start = time.monotonic()
    self.compile_spans[key] = (start, None)
    try:
      with compile_threads.beside_steps(beside_steps):
        return traced.lower().compile()
    finally:
      self.compile_spans[key] = (start, time.monotonic())

  def started(self, key: Hashable) -> bool:
    """Whether the program of `key` is compiled, compiling or failed."""
    return (
      key in self._compiled or key in self._failed or (key in self._analyses)
    )

  def done(self, key: Hashable) -> bool:
    """Whether the program of `key` is compiled (or failed to)."""
    if key in self._analyses or key in self._failed:
      return True
    future = self._compiled.get(key)
    return future is not None and future.done()

  def wait(self, keys: Iterable[Hashable] | None = None) -> None:
    """Waits for the compilations of `keys` (default: every one started);
    a signal reaches the waiting thread meanwhile (the wait wakes each
    `compile_threads.WAIT_SLICE_SECONDS`)."""
    futures = [
      self._compiled[k]
      for k in (self._compiled if keys is None else keys)
      if k in self._compiled
    ]
    while futures:
      _, pending = concurrent.futures.wait(
        futures, timeout=compile_threads.WAIT_SLICE_SECONDS
      )
      futures = list(pending)

  def uncompiled(self, key: Hashable) -> estimates.Uncompiled:
    """The figures of a traced program before it compiles
    (`estimates.uncompiled`), read once."""
    if key not in self._uncompiled:
      traced, args = self._traced[key]
      self._uncompiled[key] = estimates.uncompiled(
        traced, args, self._outputs[key]
      )
    return self._uncompiled[key]

  def analyzed(self, fn: Lowerable, args: tuple) -> Hashable:
    """The key of a call of `fn` with `args`, its program compiled and
    analyzed now where it is not yet (`program.analyze`).

    Raises:
      refusals.ProgramCompileError: the backend did not compile it (a
        `refusals.ProgramOutOfMemoryError` where it refused it for memory),
        now or before; the error names no call.
      Whatever tracing or lowering `fn` raises for `args`; ValueError where
      the backend gives no memory analysis.
    """
    key = call_key(fn, args)
    failed = self._failed.get(key)
    if failed is not None:
      raise failed
    if key not in self:
      # Traced (or lowered) apart from compiling: only the backend's
      # compilation of the program can refuse it.
      staged: jax.stages.Traced | jax.stages.Lowered = (
        fn.trace(*args) if hasattr(fn, 'trace') else fn.lower(*args)
      )
      try:
        compiled = (
          staged.lower() if isinstance(staged, jax.stages.Traced) else staged
        ).compile()
      except Exception as e:  # pylint: disable=broad-except
        self._failed[key] = refusals.compile_failure(e)
        raise self._failed[key] from None
      memory = program_lib.ProgramMemory.from_compiled(compiled)
      self._outputs[key] = staged.out_info
      self._functions[key] = fn
      self._analyses[key] = program_lib.Analysis(
        memory,
        staged.out_info,
        program_lib.kept_arguments(compiled, args, memory)
        if hasattr(fn, 'trace')
        else None,
      )
    return key

  def outputs(self, key: Hashable) -> PyTree:
    """The result types of the program of `key` (`jax.ShapeDtypeStruct`s,
    as traced: the same objects each time)."""
    return self._outputs[key]

  def analysis(self, key: Hashable, args: tuple) -> program_lib.Analysis:
    """The `program.Analysis` of the program of `key`, compiled now where
    it was not started; `args` are a call's arguments (for which ones the
    program keeps), read on the first ask.

    Raises:
      refusals.ProgramCompileError: the program did not compile (a
        `refusals.ProgramOutOfMemoryError` where the backend refused it for
        memory); the error names no call.
      ValueError: the backend gives no memory analysis.
    """
    if key in self._failed:
      raise self._failed[key]
    if key not in self._analyses:
      self.compile([key])
      self.wait([key])
      try:
        compiled = self._compiled[key].result()
      except Exception as e:  # pylint: disable=broad-except
        self._failed[key] = refusals.compile_failure(e)
        raise self._failed[key] from None
      memory = program_lib.ProgramMemory.from_compiled(compiled)
      self._analyses[key] = program_lib.Analysis(
        memory,
        self._outputs[key],
        program_lib.kept_arguments(compiled, args, memory),
      )
      # The trace (and its jaxpr) is no longer needed.
      self._traced.pop(key, None)
      self._compiled[key] = compile_threads.DONE
    return self._analyses[key]

  def compile_seconds(
    self,
    keys: Iterable[Hashable] | None = None,
    traces: bool = True,
    since: float | None = None,
  ) -> float:
    """Seconds during which at least one program of `keys` (default: every
    one started here) was traced (with `traces`) or compiled: the length of
    the union of their spans (a running compilation counts up to now),
    from `since` on (a `time.monotonic()` time; None: all)."""
    now = time.monotonic()
    keys = None if keys is None else set(keys)
    floor = float('-inf') if since is None else since
    spans = sorted(
      (max(start, floor), now if end is None else end)
      for spans_of in (
        (self.compile_spans, self.trace_spans)
        if traces
        else (self.compile_spans,)
      )
      for key, (start, end) in spans_of.items()
      if keys is None or key in keys
    )
    total, reach = 0.0, None
    for start, end in spans:
      if end <= start:  # wholly before `since`
        continue
      if reach is None or start > reach:
        total += end - start
        reach = end
      elif end > reach:
        total += end - reach
        reach = end
    return total
