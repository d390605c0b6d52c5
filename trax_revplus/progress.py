"""Progress lines and an end-of-run summary for a trax `training.Loop`.

`ProgressPrinter` is a `trax.supervised.callbacks.TrainingStepCallback`. Every
`every_n_steps` steps (and on the first and last step) it prints one line::

    step 120/300  loss 2.912  3.1 steps/s  host 1530 MB

loss: mean training loss (nats per token for cross-entropy) of the steps since
the previous line; steps/s: training steps per second of time spent inside
those steps (evals and checkpoints excluded); host: resident set size of this
process in MiB. `summary()` returns the figures of the whole run.

Add it from gin with::

    train.callbacks = [@trax_revplus.progress.ProgressPrinter]

`trax-revplus train` adds one itself unless the config already does.
"""

import sys
import time

import gin
import numpy as np
import psutil

from trax.supervised import callbacks

try:
  import resource  # pylint: disable=g-import-not-at-top
except ImportError:  # Windows has no getrusage.
  resource = None

_MIB = 1024 * 1024


def host_rss_bytes():
  """Returns the resident set size of this process (int, bytes)."""
  return psutil.Process().memory_info().rss


def peak_host_rss_bytes():
  """Returns the peak resident set size of this process so far (int, bytes).

  Uses getrusage's ru_maxrss (the kernel's high-water mark, so short peaks
  between samples count); falls back to the current RSS without it.
  """
  if resource is None:
    return host_rss_bytes()
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  # ru_maxrss is in KiB on Linux and in bytes on macOS.
  return peak if sys.platform == 'darwin' else peak * 1024


def _mean_loss(losses):
  """Mean of a list of scalar (possibly device, possibly replicated) losses."""
  if not losses:
    return None
  return float(np.mean([np.mean(np.asarray(loss)) for loss in losses]))


@gin.configurable(module='trax_revplus.progress')
class ProgressPrinter(callbacks.TrainingStepCallback):
  """Prints step, loss, steps/s and host memory while a Loop trains.

  Attributes:
    lines: The progress lines printed so far (list of str).
  """

  def __init__(self, loop, total_steps=None, every_n_steps=10,
               stream=None):
    """Attaches to `loop`; trax's Loop calls this as `ProgressPrinter(loop)`.

    Args:
      loop: The `trax.supervised.training.Loop` being run.
      total_steps: Step number the run ends at (int), shown as "step k/N";
        None shows "step k".
      every_n_steps: Print a line every this many steps (int >= 1).
      stream: File-like object to print to; sys.stdout if None.

    Raises:
      ValueError: If every_n_steps < 1.
    """
    super().__init__(loop)
    if every_n_steps < 1:
      raise ValueError(f'every_n_steps must be >= 1, got {every_n_steps}.')
    self._total_steps = total_steps
    self._every_n_steps = every_n_steps
    self._stream = stream
    self.lines = []
    self._first_step = None
    self._last_step = None
    self._step_start = None
    self._window_losses = []
    self._window_seconds = 0.0
    self._window_steps = 0
    self._last_window = (None, None)  # (first step, mean loss) of a window.
    self._train_seconds = 0.0
    self._steps_run = 0
    self._peak_sampled_rss = 0
    self._wrap_trainers(loop)

  def _wrap_trainers(self, loop):
    """Records the loss each trainer's `one_step` returns.

    trax's Loop passes a callback only the step number; the loss is what
    `trainer.one_step` returns. The Loop keeps its trainers in
    `_trainer_per_task` (trax 1.4.1), so wrap them there; without that
    attribute the lines show no loss.
    """
    for trainer in getattr(loop, '_trainer_per_task', ()):
      one_step = trainer.one_step

      def recording_one_step(*args, _one_step=one_step, **kwargs):
        loss, stats = _one_step(*args, **kwargs)
        self._window_losses.append(loss)
        return loss, stats

      trainer.one_step = recording_one_step

  def call_at(self, step):
    del step
    return True

  def on_step_begin(self, step):
    if self._first_step is None:
      self._first_step = step
    self._step_start = time.perf_counter()

  def on_step_end(self, step):
    self._window_seconds += time.perf_counter() - self._step_start
    self._window_steps += 1
    self._steps_run += 1
    self._last_step = step
    is_last = self._total_steps is not None and step >= self._total_steps
    if (step == self._first_step or step % self._every_n_steps == 0 or
        is_last):
      self._print_line(step)

  def _print_line(self, step):
    """Prints one progress line and starts a new window."""
    sync_start = time.perf_counter()
    loss = _mean_loss(self._window_losses)  # Waits for pending steps.
    self._window_seconds += time.perf_counter() - sync_start
    rss = host_rss_bytes()
    self._peak_sampled_rss = max(self._peak_sampled_rss, rss)
    steps_per_second = self._window_steps / max(self._window_seconds, 1e-9)
    self._train_seconds += self._window_seconds
    if loss is not None:
      self._last_window = (step - self._window_steps + 1, loss)
    total = f'/{self._total_steps}' if self._total_steps is not None else ''
    loss_text = 'n/a' if loss is None else f'{loss:.3f}'
    line = (f'step {step}{total}  loss {loss_text}  '
            f'{steps_per_second:.2f} steps/s  host {rss / _MIB:.0f} MB')
    self.lines.append(line)
    print(line, file=self._stream or sys.stdout, flush=True)
    self._window_losses = []
    self._window_seconds = 0.0
    self._window_steps = 0

  def summary(self):
    """Returns the figures of the run so far.

    Returns:
      dict with keys:
        'last_step' (int or None): the Loop's step when last seen.
        'steps_run' (int): steps run under this callback.
        'train_seconds' (float): seconds spent inside training steps.
        'steps_per_second' (float or None): steps_run / train_seconds.
        'final_train_loss' (float or None): mean loss of the last printed
          window, which spans steps 'final_train_loss_from_step' ..
          'last_step'.
        'final_train_loss_from_step' (int or None).
        'eval_losses' (list of (step, float)): trax's eval 'loss' metric at
          each eval, from `loop.history`.
        'peak_host_rss_bytes' (int): peak resident set size of the process.
    """
    if self._window_steps:  # Steps after the last line, if any.
      self._print_line(self._last_step)
    eval_losses = []
    history = getattr(self._loop, 'history', None)
    if history is not None:
      eval_losses = [(int(step), float(value))
                     for step, value in history.get('eval', 'metrics/loss')]
    from_step, train_loss = self._last_window
    return {
        'last_step': self._last_step,
        'steps_run': self._steps_run,
        'train_seconds': self._train_seconds,
        'steps_per_second': (self._steps_run / self._train_seconds
                             if self._train_seconds > 0 else None),
        'final_train_loss': train_loss,
        'final_train_loss_from_step': from_step,
        'eval_losses': eval_losses,
        'peak_host_rss_bytes': max(peak_host_rss_bytes(),
                                   self._peak_sampled_rss),
    }
