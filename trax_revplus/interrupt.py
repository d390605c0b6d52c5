"""Stopping a trax `Loop` cleanly on SIGINT or SIGTERM.

`StopOnSignal` turns the first SIGINT / SIGTERM into a stop at the next step
boundary, with a checkpoint: the Loop's callback saves the checkpoint set
at the end of the step during which the signal came (a signal between two
steps, during a step's save or evals, stops after the next one) and raises
`Interrupted` out of `Loop.run`. Before the first step begins (importing,
parsing, building and initializing the model, loading a checkpoint) nothing
new would be lost, so a signal stops at once, with `Interrupted` raised
from the signal handler; during trax's import, once the import ends
(`import_signals`: raised inside it, the exception can crash a C
extension half way through its initialization). A second signal does what
it did before the handler was installed (e.g. a plain Ctrl-C), and is noted
in `second_signum`. The steps the Loop began and ended are noted too
(`step_begun`, `step_ended`), so that a caller can say after which step a
signal stops the run and which steps a second signal lost (`trax-revplus
train` names the checkpoint that stands and the step a resume runs from).
Work that loses nothing when stopped half way, inside a step too, runs
under `stops_at_once` (the trainer planning a step before it runs: minutes of
compiling at the sizes users run, nothing changed yet): a signal then
stops at once as well.

The handlers are installed for SIGINT and SIGTERM whatever their
disposition was, ignored included: a process started in the background of
a shell inherits SIGINT ignored, and a run must still stop on it. A caller
enters `StopOnSignal` as early as it can (`trax-revplus train` does before
joining a multi-process run), so that no signal finds Python's defaults.
"""

import contextlib
import functools
import os
import signal
import types
from typing import Any, Callable, Iterator

from absl import logging

from trax_revplus import import_signals
from trax_revplus import trax_import

SIGNALS = ('SIGINT', 'SIGTERM')

# How many `stops_at_once` spans the main thread is in.
_at_once = 0


@contextlib.contextmanager
def stops_at_once() -> Iterator[None]:
  """A span of work a signal stops at once (`Interrupted` raised in it,
  with `planning` True), also after the first step began: nothing it does
  is lost when it stops half way."""
  global _at_once
  _at_once += 1
  try:
    yield
  finally:
    _at_once -= 1


class Interrupted(Exception):
  """A run stopped after SIGINT or SIGTERM.

  Attributes:
    signum: int, the signal received.
    step: int or None, the Loop's step when it stopped (None: before the
      first step).
    checkpoint: str or None, path of the `.pkl.gz` saved at that step.
    loop: the `training.Loop`, or None if it stopped before one was built.
    planning: bool, it stopped a step's planning (`stops_at_once`): no
      step of the run changed anything since the last checkpoint.
  """

  def __init__(
    self,
    signum: int,
    step: int | None = None,
    checkpoint: str | None = None,
    loop: Any = None,
    planning: bool = False,
  ):
    super().__init__(f'interrupted by signal {signum} at step {step}')
    self.signum = signum
    self.step = step
    self.checkpoint = checkpoint
    self.loop = loop
    self.planning = planning


class StopOnSignal:
  """Stops a `training.Loop` at the next step boundary on SIGINT / SIGTERM.

  A context manager: enter it before the run starts (from the main thread:
  signal handlers can only be installed there) and pass `callback` in the
  Loop's callbacks.

  Attributes:
    basename: str, the checkpoint saved when a signal stops the run.
    signum: int or None, the first signal received.
    second_signum: int or None, a second signal received, which stopped
      the run at once (the handler then in place acted on it).
    steps_started: bool, whether the Loop has begun a step; until then a
      signal raises `Interrupted` at once.
    step_begun: int or None, the last step the Loop began, as the Loop
      numbers it (1-based; a resumed run's first step is its checkpoint's
      step + 1).
    step_ended: int or None, the last step the Loop ended.
    stopped_at_step: int or None, the step after which the run stopped
      (None: it has not, or it stopped before the first step).
  """

  def __init__(
    self, basename: str = 'model', notify: Callable[[int], None] | None = None
  ):
    """Prepares the handlers; `__enter__` installs them.

    Args:
      basename: str, the checkpoint saved when a signal stops the run.
      notify: callable(signum), called from the handler when a signal
        arrives after the first step began (the run stops after
        `stops_after_step`); default: an absl warning.
    """
    self.basename = basename
    self.signum: int | None = None
    self.second_signum: int | None = None
    self.steps_started = False
    self.step_begun: int | None = None
    self.step_ended: int | None = None
    self.stopped_at_step: int | None = None
    self._notify = notify or _warn
    self._previous: dict[int, Any] = {}

  def __enter__(self) -> 'StopOnSignal':
    for name in SIGNALS:
      signum = getattr(signal, name)
      self._previous[signum] = signal.signal(signum, self._handle)
    return self

  def __exit__(self, *exc_info) -> None:
    self._restore()

  def _restore(self) -> None:
    previous, self._previous = self._previous, {}
    for signum, handler in previous.items():
      # None: installed outside Python; SIG_DFL is the nearest.
      signal.signal(signum, signal.SIG_DFL if handler is None else handler)

  def _handle(self, signum: int, frame: types.FrameType | None) -> None:
    del frame
    if import_signals.defer(signum):
      return  # Raised again once the import ends.
    if self.signum is not None:
      # Asked twice: stop now, as without this handler.
      self.second_signum = signum
      self._restore()
      os.kill(os.getpid(), signum)
      return
    self.signum = signum
    if not self.steps_started or _at_once:
      raise Interrupted(signum, planning=bool(_at_once))
    self._notify(signum)

  @property
  def stops_after_step(self) -> int | None:
    """The step after which a first signal now stops the run: the step in
    progress, or, between steps (a step's save and evals come after its
    end), the next one; None before the first step (a signal stops at
    once)."""
    if self.step_begun is None:
      return None
    if self.step_ended == self.step_begun:
      return self.step_begun + 1
    return self.step_begun

  def raise_if_signalled(self) -> None:
    """Raises `Interrupted` for a signal that came before the first step.

    The handler raises it at once, but where the signal interrupts a
    callback that a library runs (e.g. JAX's garbage-collection callback
    while trax is imported), Python reports the exception as ignored and
    carries on: a caller checks here between the stages before its steps.

    Raises:
      Interrupted: a signal came and no step has begun.
    """
    if self.signum is not None and not self.steps_started:
      raise Interrupted(self.signum)

  def callback(self, loop: Any) -> Any:
    """The Loop callback (trax calls `callback(loop)` for each entry)."""
    return _callback_class()(loop, self)


def _warn(signum: int) -> None:
  logging.warning(
    'signal %d received: stopping after this step with a '
    'checkpoint (send it again to stop at once).',
    signum,
  )


@functools.cache
def _callback_class() -> type:
  """The Loop callback class of `StopOnSignal`.

  Made on first use: its base class comes with trax, which this module does
  not import, so that signals are handled while trax is being imported.
  """
  step_callback: Any = trax_import.module(
    'trax.supervised.callbacks'
  ).TrainingStepCallback

  class _StopOnSignalCallback(step_callback):
    """Saves a checkpoint and raises `Interrupted` after a signalled step."""

    def __init__(self, loop, owner):
      super().__init__(loop)
      # Our own reference: trax's base keeps the Loop in a private name.
      self._trained_loop = loop
      self._owner = owner
      if owner.signum is not None:  # Came while the Loop was being built.
        raise Interrupted(owner.signum, loop=loop)

    def call_at(self, step):
      del step
      return True

    def on_step_begin(self, step):
      self._owner.steps_started = True
      self._owner.step_begun = step

    def on_step_end(self, step):
      owner = self._owner
      if owner.signum is None:
        owner.step_ended = step
        return
      checkpoint = None
      if self._trained_loop.output_dir is not None:
        self._trained_loop.save_checkpoint(owner.basename)
        checkpoint = os.path.join(
          self._trained_loop.output_dir, owner.basename + '.pkl.gz'
        )
      owner.step_ended = owner.stopped_at_step = step
      raise Interrupted(
        owner.signum, step=step, checkpoint=checkpoint, loop=self._trained_loop
      )

  return _StopOnSignalCallback
