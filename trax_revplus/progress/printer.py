"""`ProgressPrinter`: progress lines and compile notices for a trax Loop.

`ProgressPrinter` is a `trax.supervised.callbacks.TrainingStepCallback`. Every
`every_n_steps` steps (and on the first and last step) it prints one line::

    step 120/300  loss 2.912  3.10 steps/s  host 1530 MiB

loss: mean training loss (nats per token for cross-entropy) of the steps since
the previous line; steps/s: training steps per second of time spent inside
those steps (evals and checkpoints excluded), over the steps that compiled
nothing; host: resident set size of this process in MiB. A step during
which JAX compiled a program (the first step of a process, and any step that
meets a new input shape) is timed apart: a window of such steps only reads
`compiling 14.2 s` instead of a rate, and a mixed window names them; a
step in which trax_revplus's trainer planned (the first on a batch's
shapes) says how much of it planning took (each a single line on the
terminal)::

    step 1/300  loss 5.812  compiling 14.2 s (9.8 s of it planning)  host
        1110 MiB
    step 60/300  loss 3.104  3.05 steps/s (1 step compiling, 4.1 s, left
        out)  host 1535 MiB

After the first step, a step that compiles prints a line of its own naming
the programs it compiled (at most `line_text.MAX_NAMES_SHOWN`), the first
`MAX_RECOMPILE_NOTICES` times, and what changed since the step before
(`step_inputs`): trax's variable-length inputs compile once for each new
shape; trax's default `Trainer` and stock's `ReversibleSerialTrainer`
compile again at step 2 on a machine without an accelerator, the batch's
shapes unchanged, because they hand their weights over placed otherwise
than at step 1::

    step 57: 2 programs compiled in this step (4.1 s): jit(forward),
        jit(backward); the batch has new shapes or dtypes (int32[8, 300];
        step 56: int32[8, 256])

Compilations are counted from JAX's public monitoring events
(`jax.monitoring`), not timed around calls. `summary()` returns the figures
of the whole run.

The loss is the value the Loop's `_run_one_step` returns: trax hands a
callback only the step number, so the printer observes that method's result
on its own Loop (the trainer is left as it is, so this works alike for
trax's `Trainer`, trax's `ReversibleSerialTrainer` and trax_revplus's).
It also records the figures of every step (`run_stats.StepFigures`) and
writes them, at the last step and again when `summary()` is called, to
`<output_dir>/run_stats.json`.

Add it from gin with::

    train.callbacks = [@trax_revplus.progress.ProgressPrinter]

`trax-revplus train` adds one itself unless the config already does.
"""

import dataclasses
import sys
import time
from typing import Any, Callable, TextIO

from absl import logging
import gin
import numpy as np

from trax.supervised import callbacks
from trax.supervised import training
from trax_revplus.progress import eval_history
from trax_revplus.progress import line_text
from trax_revplus.progress import run_stats as run_stats_lib
from trax_revplus.progress.compiles import CompileCounter
from trax_revplus.progress.step_inputs import StepInputs
from trax_revplus.trax_door import loop as loop_door

# Recompiles after the first step printed as a line of their own.
MAX_RECOMPILE_NOTICES = 3


def _mean_loss(losses: list[Any]) -> float | None:
  """Mean of scalar (possibly device, possibly replicated) losses."""
  if not losses:
    return None
  return float(np.mean([np.mean(np.asarray(loss)) for loss in losses]))


@dataclasses.dataclass(frozen=True)
class RunSummary:
  """The figures of a run so far (`ProgressPrinter.summary`), which the
  summary block shows (`cli.summary.format_summary`).

  Attributes:
    last_step: int, the Loop's step (also when this process ran no step:
      the checkpoint was already at the last step).
    steps_run: int, steps run under the printer.
    train_seconds: float, seconds spent inside training steps.
    last_train_loss: float or None, the loss the last step of this process
      returned (`run_stats.json`'s last `loss`; None where not finite), at
      step `last_train_loss_step` (int or None: no step ran).
    mean_train_loss: float or None, mean loss of the last printed window
      (the last progress line's), which spans steps
      `mean_train_loss_from_step` (int or None) .. `last_step`.
    eval_losses: list of (step, float), trax's eval 'loss' metric at each
      eval, from `loop.history` and the evals earlier runs of the output
      directory kept (`eval_history`).
    peak_host_rss_bytes: int, peak resident set size of the process.
    steps_per_second: float or None, steps_run / train_seconds.
    compiling_steps: list of (step, seconds, programs), the steps during
      which JAX compiled, their seconds and programs compiled.
    steps_per_second_without_compiling: float or None, over the other
      steps.
    programs_from_cache: int, programs read back from JAX's persistent
      compilation cache instead of compiled, since the printer began (the
      build's and evals' too).
    planning: list of str, or None, what planning cost, one line per
      batch's shapes planned (`run_stats.json`'s `planning` in words).
    median_step_seconds: float or None, `run_stats.json`'s.
    step_floor: dict or None, `run_stats.json`'s.
  """

  last_step: int
  steps_run: int
  train_seconds: float
  last_train_loss: float | None
  last_train_loss_step: int | None
  mean_train_loss: float | None
  mean_train_loss_from_step: int | None
  eval_losses: list[tuple[int, float]]
  peak_host_rss_bytes: int
  steps_per_second: float | None = None
  compiling_steps: list[tuple[int, float, int]] = dataclasses.field(
    default_factory=list
  )
  steps_per_second_without_compiling: float | None = None
  programs_from_cache: int = 0
  planning: list[str] | None = None
  median_step_seconds: float | None = None
  step_floor: dict[str, Any] | None = None


@gin.configurable(module='trax_revplus.progress')
class ProgressPrinter(callbacks.TrainingStepCallback):
  """Prints step, loss, steps/s and host memory while a Loop trains.

  Attributes:
    lines: The lines printed so far (list of str).
  """

  def __init__(
    self,
    loop: training.Loop,
    total_steps: int | None = None,
    every_n_steps: int = 10,
    stream: TextIO | None = None,
  ):
    """Attaches to `loop`; trax's Loop calls this as `ProgressPrinter(loop)`.

    Args:
      loop: The `trax.supervised.training.Loop` being run.
      total_steps: Step number the run ends at, shown as "step k/N"; None
        shows "step k".
      every_n_steps: Print a line every this many steps (>= 1).
      stream: File-like object to print to; sys.stdout if None.

    Raises:
      ValueError: If every_n_steps < 1.
    """
    super().__init__(loop)
    # Our own reference: trax's base keeps the Loop in a private name.
    self._trained_loop = loop
    if every_n_steps < 1:
      raise ValueError(f'every_n_steps must be >= 1, got {every_n_steps}.')
    self._total_steps = total_steps
    self._every_n_steps = every_n_steps
    self._stream = stream
    self.lines: list[str] = []
    self._first_step: int | None = None
    self._last_step: int | None = None
    self._step: int | None = None  # The step begun and not yet recorded.
    self._step_start: float | None = None
    self._step_seconds: float | None = None
    self._compiles_at_step_begin: tuple[int, float] | None = None
    self._plannings_at_step_begin = 0
    self._window = self._new_window()
    # (first step, mean loss) of a window.
    self._last_window: tuple[Any, Any] = (None, None)
    self._train_seconds = 0.0
    self._steps_run = 0
    # (step, seconds, programs)
    self._compiling_steps: list[tuple[int, float, int]] = []
    self._recompile_notices = 0
    # evals in the Loop's history when last kept
    self._evals_kept: int | None = None
    self._figures = run_stats_lib.StepFigures(
      loop_door.trainers(loop), getattr(loop, 'model', None)
    )
    CompileCounter.snapshot()  # Listens from now on.
    self._cache_hits_at_start = CompileCounter.cache_hits()
    self._observe_step_results(loop)
    self._inputs = StepInputs(loop)

  @property
  def last_batch(self) -> Any:
    """The last training batch's `jax.ShapeDtypeStruct`s, or None."""
    return self._inputs.last_batch

  def end_steps(self) -> None:
    """Closes the figures of the steps: the peak host RSS is kept as it is
    now (`run_stats.StepFigures.end_steps`), before what runs after them."""
    self._figures.end_steps()

  def set_step_floor(self, floor: dict[str, Any]) -> None:
    """Keeps a step's floor (`step_floor.StepFloor.as_json()`) in
    run_stats.json and the summary."""
    self._figures.step_floor = floor

  def _observe_step_results(self, loop: training.Loop) -> None:
    """Has this printer see the (loss, stats) each training step returns.

    trax's Loop calls `_run_one_step` once per step (it calls the callbacks'
    `on_step_begin` and `on_step_end` inside) and uses its result for its
    own loss lines; this Loop's calls go through `observed`, which hands the
    result on unchanged.
    """

    def observing(run_one_step: Callable[..., Any]) -> Callable[..., Any]:
      def observed(*args: Any, **kwargs: Any) -> Any:
        loss, stats = run_one_step(*args, **kwargs)
        self._end_step(loss)
        return loss, stats

      return observed

    loop_door.wrap_run_one_step(loop, observing)

  @staticmethod
  def _new_window() -> dict[str, Any]:
    return {
      'losses': [],
      'steps': 0,
      'seconds': 0.0,
      'compiling_steps': 0,
      'compiling_seconds': 0.0,
      'planning_seconds': 0.0,
    }

  def call_at(self, step: int) -> bool:
    del step
    return True

  def on_step_begin(self, step: int) -> None:
    # trax runs a step's evals after its callbacks: the first point that
    # sees them is the next step's beginning (and `summary`, after the last).
    history = self._history_eval_losses()
    if len(history) != self._evals_kept:
      self._eval_losses(history, step)
    if self._first_step is None:
      self._first_step = step
    self._step = step
    self._step_seconds = None
    self._figures.begin_step()
    self._inputs.begin(step)
    self._compiles_at_step_begin = CompileCounter.snapshot()
    self._plannings_at_step_begin = len(self._figures.planning() or ())
    self._step_start = time.perf_counter()

  def on_step_end(self, step: int) -> None:
    del step
    if self._step_start is not None:
      self._step_seconds = time.perf_counter() - self._step_start

  def _end_step(self, loss: Any) -> None:
    """Records the step `_run_one_step` just returned `loss` for."""
    step = self._step
    if (
      step is None
      or self._step_seconds is None
      or self._compiles_at_step_begin is None
    ):
      return  # Not a step this printer saw begin and end.
    self._step = None
    # Waiting for the loss makes the step's time that of its computation,
    # not of its dispatch; trax's Loop reads the loss right after anyway.
    wait_start = time.perf_counter()
    loss = _mean_loss([loss])
    seconds = self._step_seconds + time.perf_counter() - wait_start
    programs_before, _ = self._compiles_at_step_begin
    programs = CompileCounter.snapshot()[0] - programs_before
    window = self._window
    if loss is not None:
      window['losses'].append(loss)
    window['steps'] += 1
    window['seconds'] += seconds
    if programs:
      window['compiling_steps'] += 1
      window['compiling_seconds'] += seconds
      self._compiling_steps.append((step, seconds, programs))
    # Planning a new batch shape happens inside its first step.
    plannings = self._figures.planning() or []
    window['planning_seconds'] += sum(
      c['seconds'] for c in plannings[self._plannings_at_step_begin :]
    )
    self._steps_run += 1
    self._last_step = step
    self._figures.end_step(step, loss, seconds, programs)
    if programs and step != self._first_step:
      self._recompile_notice(step, seconds, programs, programs_before)
    is_last = self._total_steps is not None and step >= self._total_steps
    if step == self._first_step or step % self._every_n_steps == 0 or is_last:
      self._print_line(step)
    if is_last:
      self.write_run_stats()

  def _history_eval_losses(self) -> list[tuple[int, float]]:
    """(step, loss) of each eval in the Loop's history."""
    history = getattr(self._trained_loop, 'history', None)
    return [] if history is None else history.get('eval', 'metrics/loss')

  def _eval_losses(
    self, history: list[tuple[int, float]], step: int
  ) -> list[tuple[int, float]]:
    """`history` merged with the evals kept in the output directory up to
    `step`, and kept there (`eval_history.merged`), so that an eval survives
    a run that ends before its next checkpoint."""
    self._evals_kept = len(history)
    return eval_history.merged(
      getattr(self._trained_loop, 'output_dir', None),
      history,
      step,
      write=getattr(self._trained_loop, 'is_chief', True),
    )

  def _print(self, line: str) -> None:
    self.lines.append(line)
    print(line, file=self._stream or sys.stdout, flush=True)

  def _recompile_notice(
    self, step: int, seconds: float, programs: int, programs_before: int
  ) -> None:
    names = CompileCounter.names_since(programs_before)
    logging.info(
      'step %d compiled %d programs (%.1f s): %s',
      step,
      programs,
      seconds,
      ', '.join(names),
    )
    self._recompile_notices += 1
    if self._recompile_notices > MAX_RECOMPILE_NOTICES:
      return
    # The programs by name and what changed since the step before (a new
    # input length, or the same shapes with the weights placed otherwise:
    # trax's trainers at step 2, `step_inputs`), not a guessed cause.
    line = line_text.compile_notice(
      step, seconds, programs, names, self._inputs.cause(step)
    )
    if self._recompile_notices == MAX_RECOMPILE_NOTICES:
      line += ' (later ones: train.log and the summary)'
    self._print(line)

  def _print_line(self, step: int) -> None:
    """Prints one progress line and starts a new window."""
    window = self._window
    loss = _mean_loss(window['losses'])
    rss = self._figures.sample_rss()
    self._train_seconds += window['seconds']
    if loss is not None:
      self._last_window = (step - window['steps'] + 1, loss)
    self._print(
      line_text.progress_line(step, self._total_steps, loss, window, rss)
    )
    self._window = self._new_window()

  def run_stats(self) -> dict[str, Any]:
    """Returns the per-step figures of this process's steps.

    Returns:
      dict with the keys of `run_stats.json` (`run_stats`); plain JSON
      types.
    """
    return self._figures.run_stats()

  def write_run_stats(self) -> str | None:
    """Writes `run_stats()` to `<loop output_dir>/run_stats.json`.

    Only the chief process (trax's `Loop.is_chief`) writes: the other
    processes of a multi-process run share its output directory. Never
    raises (see `run_stats.StepFigures.write`).

    Returns:
      The path written, or None.
    """
    if not getattr(self._trained_loop, 'is_chief', True):
      return None
    return self._figures.write(getattr(self._trained_loop, 'output_dir', None))

  def summary(self) -> 'RunSummary':
    """Returns the figures of the run so far (`RunSummary`); rewrites
    run_stats.json."""
    # Steps after the last line, if any.
    if self._window['steps'] and self._last_step is not None:
      self._print_line(self._last_step)
    if self._steps_run:
      self.write_run_stats()
    from_step, train_loss = self._last_window
    compiling_seconds = sum(s for _, s, _ in self._compiling_steps)
    plain_steps = self._steps_run - len(self._compiling_steps)
    plain_seconds = self._train_seconds - compiling_seconds
    last_step = self._last_step
    if last_step is None:
      last_step = int(getattr(self._trained_loop, 'step', 0))
    eval_losses = self._eval_losses(self._history_eval_losses(), last_step)
    last_loss_step, last_loss = self._figures.last_loss()
    return RunSummary(
      last_step=last_step,
      steps_run=self._steps_run,
      train_seconds=self._train_seconds,
      steps_per_second=(
        self._steps_run / self._train_seconds
        if self._train_seconds > 0
        else None
      ),
      compiling_steps=list(self._compiling_steps),
      programs_from_cache=(
        CompileCounter.cache_hits() - self._cache_hits_at_start
      ),
      steps_per_second_without_compiling=(
        plain_steps / plain_seconds
        if plain_steps and plain_seconds > 0
        else None
      ),
      last_train_loss=last_loss,
      last_train_loss_step=last_loss_step,
      mean_train_loss=train_loss,
      mean_train_loss_from_step=from_step,
      eval_losses=eval_losses,
      peak_host_rss_bytes=self._figures.peak_host_rss_bytes(),
      planning=self._figures.planning_lines(),
      median_step_seconds=self._figures.run_stats()['median_step_seconds'],
      step_floor=self._figures.step_floor,
    )
