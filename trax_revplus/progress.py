"""Progress lines, an end-of-run summary and per-step figures for a trax Loop.

`ProgressPrinter` is a `trax.supervised.callbacks.TrainingStepCallback`. Every
`every_n_steps` steps (and on the first and last step) it prints one line::

    step 120/300  loss 2.912  3.1 steps/s  host 1530 MB

loss: mean training loss (nats per token for cross-entropy) of the steps since
the previous line; steps/s: training steps per second of time spent inside
those steps (evals and checkpoints excluded); host: resident set size of this
process in MiB. `summary()` returns the figures of the whole run.

It also records figures of every step and writes them, at the last step and
again when `summary()` is called, to `<output_dir>/run_stats.json`
(`RUN_STATS_FILENAME`), one JSON object whose keys are:

  trainer (str or null): class of the Loop's first trainer, e.g.
    'trax.optimizers.trainer.ReversibleSerialTrainer'.
  steps (list of int): the Loop's step numbers run in this process.
  loss (list of float or null): training loss each step returned (nats per
    token for cross-entropy; the mean over devices); null where not finite.
  step_seconds (list of float): wall time of each step, from the Loop's
    `on_step_begin` to `on_step_end`, waiting for the step's loss to reach
    the host; the first step of a process includes compilation.
  host_rss_bytes (list of int): resident set size after each step.
  device_bytes_in_use (list of int or null): bytes in use on the local
    devices after each step (`trax_revplus.memory.device_memory`: device
    `memory_stats()` where reported, bytes of live JAX arrays on CPU).
  device_bytes_source (str or null): 'memory_stats' or 'live_arrays'.
  h2d_bytes, d2h_bytes (list of int, or null): bytes the trainer copied
    host-to-device / device-to-host during each step, where the trainer
    counts them (trax_revplus's `ReversibleSerialTrainer`, through
    `placement.transfers`); null for trainers that do not count (stock trax).
  first_step_seconds (float or null): step_seconds of the first step.
  median_step_seconds (float or null): median step_seconds over the later
    steps (all but the first); null with fewer than 2 steps.
  peak_host_rss_bytes (int): peak resident set size of the process (the
    kernel's high-water mark, which includes imports and initialization).
  peak_device_bytes (int or null): the larger of the highest sampled
    device_bytes_in_use and the devices' reported peak
    (`memory_stats()['peak_bytes_in_use']`, GPU/TPU only).
  total_h2d_bytes, total_d2h_bytes (int or null): sums of h2d_bytes and
    d2h_bytes.

Both trax's and trax_revplus's trainers are measured by this same code, so
`trax-revplus compare` can set their figures side by side.

Add it from gin with::

    train.callbacks = [@trax_revplus.progress.ProgressPrinter]

`trax-revplus train` adds one itself unless the config already does.
"""

import json
import os
import statistics
import sys
import time

from absl import logging
import gin
import numpy as np
import psutil

from trax.supervised import callbacks
from trax_revplus import memory

try:
  import resource  # pylint: disable=g-import-not-at-top
except ImportError:  # Windows has no getrusage.
  resource = None

_MIB = 1024 * 1024
RUN_STATS_FILENAME = 'run_stats.json'


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


def _qualified_name(cls):
  return f'{cls.__module__}.{cls.__qualname__}'


def _transfer_counter(trainer):
  """The trainer's `memory.TransferCounter`, or None if it keeps none."""
  try:
    counter = trainer.placement.transfers
  except AttributeError:
    return None
  return counter if hasattr(counter, 'snapshot') else None


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
    self._step_loss = None
    self._window_losses = []
    self._window_seconds = 0.0
    self._window_steps = 0
    self._last_window = (None, None)  # (first step, mean loss) of a window.
    self._train_seconds = 0.0
    self._steps_run = 0
    self._peak_sampled_rss = 0
    self._device_probe_failed = False
    self._device_peak_reported = None
    self._stats = {key: [] for key in (
        'steps', 'loss', 'step_seconds', 'host_rss_bytes',
        'device_bytes_in_use', 'h2d_bytes', 'd2h_bytes')}
    self._device_bytes_source = None
    trainers = list(getattr(loop, '_trainer_per_task', ()))
    self._trainer_name = (_qualified_name(type(trainers[0])) if trainers
                          else None)
    self._counters = [c for c in map(_transfer_counter, trainers)
                      if c is not None]
    self._transfers_at_step_begin = None
    self._wrap_trainers(trainers)

  def _wrap_trainers(self, trainers):
    """Records the loss each trainer's `one_step` returns.

    trax's Loop passes a callback only the step number; the loss is what
    `trainer.one_step` returns. The Loop keeps its trainers in
    `_trainer_per_task` (trax 1.4.1); without that attribute the lines show
    no loss.
    """
    for trainer in trainers:
      one_step = trainer.one_step

      def recording_one_step(*args, _one_step=one_step, **kwargs):
        loss, stats = _one_step(*args, **kwargs)
        self._step_loss = loss
        return loss, stats

      trainer.one_step = recording_one_step

  def call_at(self, step):
    del step
    return True

  def _transfers(self):
    """(h2d_bytes, d2h_bytes) summed over the trainers' counters, or None."""
    if not self._counters:
      return None
    snapshots = [c.snapshot() for c in self._counters]
    return (sum(s[0] for s in snapshots), sum(s[1] for s in snapshots))

  def on_step_begin(self, step):
    if self._first_step is None:
      self._first_step = step
    self._step_loss = None
    self._transfers_at_step_begin = self._transfers()
    self._step_start = time.perf_counter()

  def on_step_end(self, step):
    # Waiting for the loss makes the step's time that of its computation,
    # not of its dispatch; trax's Loop reads the loss right after anyway.
    loss = None if self._step_loss is None else _mean_loss([self._step_loss])
    seconds = time.perf_counter() - self._step_start
    self._step_loss = None
    if loss is not None:
      self._window_losses.append(loss)
    self._window_seconds += seconds
    self._window_steps += 1
    self._steps_run += 1
    self._last_step = step
    self._record_step(step, loss, seconds)
    is_last = self._total_steps is not None and step >= self._total_steps
    if (step == self._first_step or step % self._every_n_steps == 0 or
        is_last):
      self._print_line(step)
    if is_last:
      self.write_run_stats()

  def _record_step(self, step, loss, seconds):
    """Samples memory and transfers after a step; outside the step's time."""
    stats = self._stats
    stats['steps'].append(int(step))
    stats['loss'].append(loss)
    stats['step_seconds'].append(seconds)
    rss = host_rss_bytes()
    self._peak_sampled_rss = max(self._peak_sampled_rss, rss)
    stats['host_rss_bytes'].append(rss)
    device = None
    if not self._device_probe_failed:
      try:
        device = memory.device_memory()
      except Exception as e:  # pylint: disable=broad-except
        self._device_probe_failed = True
        logging.warning('ProgressPrinter: device memory probe failed (%s: %s);'
                        ' device bytes are not recorded for the rest of this '
                        'run.', type(e).__name__, e)
    if device is None:
      stats['device_bytes_in_use'].append(None)
    else:
      stats['device_bytes_in_use'].append(device['device_bytes_in_use'])
      self._device_bytes_source = device['device_bytes_source']
      if device['device_peak_bytes'] is not None:
        self._device_peak_reported = device['device_peak_bytes']
    begin, end = self._transfers_at_step_begin, self._transfers()
    if begin is not None and end is not None:
      stats['h2d_bytes'].append(end[0] - begin[0])
      stats['d2h_bytes'].append(end[1] - begin[1])

  def _print_line(self, step):
    """Prints one progress line and starts a new window."""
    loss = _mean_loss(self._window_losses)
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

  def run_stats(self):
    """Returns the per-step figures of this process's steps.

    Returns:
      dict with the keys of `run_stats.json` (see the module docstring);
      plain JSON types.
    """
    stats = self._stats
    seconds = stats['step_seconds']
    sampled_device = [b for b in stats['device_bytes_in_use'] if b is not None]
    device_peaks = sampled_device + (
        [self._device_peak_reported]
        if self._device_peak_reported is not None else [])
    counted = bool(stats['h2d_bytes']) and (
        len(stats['h2d_bytes']) == len(stats['steps']))
    return {
        'trainer': self._trainer_name,
        'steps': list(stats['steps']),
        'loss': [v if v is not None and np.isfinite(v) else None
                 for v in stats['loss']],
        'step_seconds': list(seconds),
        'host_rss_bytes': list(stats['host_rss_bytes']),
        'device_bytes_in_use': list(stats['device_bytes_in_use']),
        'device_bytes_source': self._device_bytes_source,
        'h2d_bytes': list(stats['h2d_bytes']) if counted else None,
        'd2h_bytes': list(stats['d2h_bytes']) if counted else None,
        'first_step_seconds': seconds[0] if seconds else None,
        'median_step_seconds': (statistics.median(seconds[1:])
                                if len(seconds) >= 2 else None),
        'peak_host_rss_bytes': max(peak_host_rss_bytes(),
                                   self._peak_sampled_rss),
        'peak_device_bytes': max(device_peaks) if device_peaks else None,
        'total_h2d_bytes': sum(stats['h2d_bytes']) if counted else None,
        'total_d2h_bytes': sum(stats['d2h_bytes']) if counted else None,
    }

  def write_run_stats(self):
    """Writes `run_stats()` to `<loop output_dir>/run_stats.json`.

    Written to a temporary file and renamed, so a reader never sees half a
    file. Does nothing when the Loop has no output dir; a write that fails
    is logged as a warning, never raised, so it cannot end a training run.

    Returns:
      The path written (str), or None.
    """
    output_dir = getattr(self._loop, 'output_dir', None)
    if not output_dir:
      return None
    path = os.path.join(output_dir, RUN_STATS_FILENAME)
    try:
      tmp_path = path + '.tmp'
      with open(tmp_path, 'w', encoding='utf-8') as f:
        json.dump(self.run_stats(), f, indent=1)
      os.replace(tmp_path, path)
    except (OSError, TypeError, ValueError) as e:
      logging.warning('ProgressPrinter: cannot write %s (%s: %s).', path,
                      type(e).__name__, e)
      return None
    return path

  def summary(self):
    """Returns the figures of the run so far; rewrites run_stats.json.

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
    if self._steps_run:
      self.write_run_stats()
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
