"""`StepProfiler`: a JAX profiler trace of chosen training steps.

A `trax.supervised.callbacks.TrainingStepCallback` that starts JAX's
profiler (`jax.profiler.start_trace`) as the first chosen step begins and
stops it once the last chosen step's work has finished on the device, so
the trace holds those steps whole: every program, H2D and D2H copy and the
host's Python between them, for any trainer (trax's default `Trainer`,
stock's `ReversibleSerialTrainer`, trax_revplus's). The trace is written
under `log_dir` as JAX writes it:

  log_dir/plugins/profile/<time>/<host>.xplane.pb       TensorBoard's
                                                       profile plugin
  log_dir/plugins/profile/<time>/perfetto_trace.json.gz  ui.perfetto.dev

`trax-revplus train --profile=STEPS` adds one (docs/accelerators.md, "A
profile of chosen steps"). From gin::

    train.callbacks = [@trax_revplus.progress.StepProfiler]
    trax_revplus.progress.StepProfiler.first_step = 3
    trax_revplus.progress.StepProfiler.last_step = 4
"""

import os
import sys
from typing import TextIO

import gin
import jax

from trax.supervised import callbacks
from trax.supervised import training

# Where the trace goes, under the Loop's output dir.
PROFILE_DIRNAME = 'profile'


@gin.configurable(module='trax_revplus.progress')
class StepProfiler(callbacks.TrainingStepCallback):
  """Traces steps `first_step` to `last_step` (1-based, inclusive).

  A run resumed inside the range traces from its first step on; one
  resumed past it traces nothing.

  Attributes:
    log_dir: str, where the trace is written.
    traced: bool, whether a trace was written.
  """

  def __init__(
    self,
    loop: training.Loop,
    first_step: int = 2,
    last_step: int | None = None,
    log_dir: str | None = None,
    stream: TextIO | None = None,
  ):
    """Attaches to `loop`; trax's Loop calls this as `StepProfiler(loop)`.

    Args:
      loop: The `trax.supervised.training.Loop` being run.
      first_step: int >= 1, the first step traced.
      last_step: int >= first_step, the last step traced; None: first_step.
      log_dir: str, the trace's directory; None: `<output_dir>/profile`
        (with the process index appended in a run of several processes).
      stream: where the line naming the trace is printed; sys.stdout if
        None.

    Raises:
      ValueError: the steps are not 1 <= first_step <= last_step, or
        log_dir is None and the Loop has no output dir.
    """
    super().__init__(loop)
    # Ours, not trax's copy (`TrainingStepCallback._loop`).
    self._trained_loop = loop
    last_step = first_step if last_step is None else last_step
    if not 1 <= first_step <= last_step:
      raise ValueError(
        f'profile steps {first_step}-{last_step}: give 1 <= first <= last.'
      )
    if log_dir is None:
      if loop.output_dir is None:
        raise ValueError(
          'StepProfiler needs a log_dir, or a Loop with an output_dir.'
        )
      log_dir = os.path.join(loop.output_dir, PROFILE_DIRNAME)
      if jax.process_count() > 1:
        log_dir = os.path.join(log_dir, f'process_{jax.process_index()}')
    self.log_dir = log_dir
    self.traced = False
    self._first_step = first_step
    self._last_step = last_step
    self._stream = stream
    self._tracing = False
    self._traced_from = first_step
    self._passed = False

  def call_at(self, step: int) -> bool:
    if step > self._last_step and not (self.traced or self._passed):
      # A run resumed past the steps named: say so once, trace nothing.
      self._passed = True
      print(
        f'profile of steps {self._first_step}-{self._last_step}: nothing '
        f'traced, the run resumed at step {step}, past them',
        file=self._stream or sys.stdout,
        flush=True,
      )
    return self._first_step <= step <= self._last_step

  def on_step_begin(self, step: int) -> None:
    del step
    if not self._tracing:
      options = jax.profiler.ProfileOptions()
      # Every Python call traced would slow the host's side of a step
      # several times over and hide its gaps; trax's and JAX's own
      # annotations (programs, copies, waits) stay.
      options.python_tracer_level = 0
      jax.profiler.start_trace(
        self.log_dir, create_perfetto_trace=True, profiler_options=options
      )
      self._tracing = True
      self._traced_from = self._trained_loop.step

  def on_step_end(self, step: int) -> None:
    if not self._tracing or step < self._last_step:
      return
    # The step returns with work still queued (its loss, copies back to the
    # host): the trace ends once all of it is done.
    jax.block_until_ready(jax.live_arrays())
    jax.profiler.stop_trace()
    self._tracing = False
    self.traced = True
    steps = (
      f'step {step}'
      if self._traced_from == step
      else f'steps {self._traced_from}-{step}'
    )
    print(
      f'profile of {steps} in {self.log_dir} (TensorBoard, or '
      'perfetto_trace.json.gz in ui.perfetto.dev)',
      file=self._stream or sys.stdout,
      flush=True,
    )
