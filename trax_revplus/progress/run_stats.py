"""`StepFigures`: the figures of each training step, and `run_stats.json`.

`StepFigures.write` saves them to `<output_dir>/run_stats.json`
(`RUN_STATS_FILENAME`), one JSON object whose keys are:


  trainer (str or null): class of the Loop's first trainer, e.g.
    'trax.optimizers.trainer.ReversibleSerialTrainer'
    (`run_classes.trainer_name`).
  trainer_fix (str or null): what of stock's trainer was changed for
    current JAX (`run_classes.RunClasses.trainer_fix`), e.g. "its Loop's
    RNG on the step's device"; null for a trainer as its library ships it.
  reversible_layers (str or null): the reversible layers of the Loop's
    model, by class and count (`run_classes.reversible_layers`), e.g.
    'trax_revplus.layers.ReversibleHalfResidual x8, ...'; 'none' for a
    model without any; null when no model was given.
  steps (list of int): the Loop's step numbers run in this process.
  loss (list of float or null): training loss each step returned (nats per
    token for cross-entropy; the mean over devices); null where not finite.
  step_seconds (list of float): wall time of each step, from the Loop's
    `on_step_begin` to `on_step_end`, plus the wait for the step's loss to
    reach the host; the first step of a process includes compilation.
  compiled_programs (list of int): programs JAX compiled during each step.
  host_rss_bytes (list of int): resident set size after each step.
  device_bytes_in_use (list of int or null): bytes in use on the local
    devices after each step (`trax_revplus.memory.device_bytes_in_use`: device
    `memory_stats()` where reported, bytes of live JAX arrays on CPU).
  device_bytes_source (str or null): 'memory_stats' or 'live_arrays'.
  h2d_bytes, d2h_bytes (list of int, or null): bytes the trainer copied
    host-to-device / device-to-host during each step, where the trainer
    counts them (trax_revplus's `ReversibleSerialTrainer`, through
    `placement.transfers`); null for trainers that do not count (stock trax).
  first_step_seconds (float or null): step_seconds of the first step.
  median_step_seconds (float or null): median step_seconds over the later
    steps (all but the first) that compiled nothing and ran on the plan
    the run settled on (not in steps_on_ready_plan), as the summary's
    steps/s leaves compiling steps out; over every later step where none
    is such; null with fewer than 2 steps.
  steps_on_ready_plan (list of int): the steps that ran on a plan ready
    first while the fused program compiled (trax_revplus's
    `ReversibleSerialTrainer.steps_on_ready_plan`; empty for trax's).
  peak_host_rss_bytes (int): peak resident set size of the process (the
    kernel's high-water mark, which includes imports and initialization;
    `memory.host_peak.process_peak_bytes`).
  peak_device_bytes (int or null): the larger of the highest sampled
    device_bytes_in_use and the devices' reported peak
    (`memory_stats()['peak_bytes_in_use']`, GPU/TPU only).
  total_h2d_bytes, total_d2h_bytes (int or null): sums of h2d_bytes and
    d2h_bytes.
  planning (list of objects, or null): what planning each batch's shapes
    cost this process, where the trainer plans (trax_revplus's
    `ReversibleSerialTrainer.planning_costs`; null for trax's): `seconds`
    from the start of planning to the plan chosen, `programs_compiled`,
    `plan_programs` (the chosen plan's), `plan_compile_seconds` (seconds
    of the planning tracing and compiling the chosen plan's own programs),
    `plan_compiled_before_seconds` (the same before the planning began:
    beside the steps on a plan ready first, or for another batch's
    shapes),
    `search_seconds` (the rest) and `plan` (the chosen plan in words).
  step_floor (object or null): the step's floor where the run measured it
    (`trax-revplus train --step_floor`; `step_floor.StepFloor.as_json`):
    `flops_per_step` (XLA's count of the model's forward and gradient, one
    device), `step_floor_seconds` (the least of `layer_floor_seconds`,
    each distinct layer's forward and gradient timed alone at
    `rows_per_call` rows times its layers and `calls_per_step`, and
    `whole_program_seconds`, the model's as one program, null with
    `whole_program_note` where not timed), both at the plan's attention
    pairs at once (`parallel_heads`, null: as configured, [[kind, n], ...]:
    by kind of attention layer);
    `configured_step_floor_seconds` (`configured_layer_floor_seconds`, or
    the whole program's where `plan_is_configured`) with the pairs at once
    the config sets, and `best_step_floor_seconds`
    (`best_layer_floor_seconds` or the whole program's) with each
    attention kind at its fastest setting timed, each null where not
    measured; `kinds` (each layer kind's `name`, `count`, `flops`,
    `seconds`, `temp_bytes`, `configured_seconds`, `best_seconds`,
    `best_parallel_heads`, `configured_parallel_heads`, `attention`, and
    `parallel_heads_seconds`: [pairs at once, seconds or null where
    refused for memory] of each setting timed) and `shares` (each timed
    kind with arithmetic, largest first: `share_of_floor`,
    `tflops_per_second`, `seconds_per_step`; an attention kind's also
    `configured_tflops_per_second`, `best_tflops_per_second`,
    `best_parallel_heads`). A run before the settings were timed has none
    of the configured or best figures; readers take them as absent.

Both trax's and trax_revplus's trainers are measured by this same code, so
`trax-revplus compare` can set their figures side by side.
"""

import json
import os
import statistics
from typing import Any, Sequence

from absl import logging
import numpy as np

from trax_revplus import compat
from trax_revplus import memory
from trax_revplus import run_classes

RUN_STATS_FILENAME = 'run_stats.json'


def peak_host_rss_bytes() -> int:
  """Returns the peak resident set size of this process so far, in bytes.

  The kernel's high-water mark, so short peaks between samples count, kept
  true across the memory log's resets of it (`memory.host_peak`); the
  current RSS where the kernel keeps no mark.
  """
  return memory.host_peak.process_peak_bytes()


def _transfer_counter(trainer: Any) -> memory.TransferCounter | None:
  """The trainer's `memory.TransferCounter`, or None if it keeps none."""
  try:
    counter = trainer.placement.transfers
  except AttributeError:
    return None
  return counter if hasattr(counter, 'snapshot') else None


def _median_later_step(
  seconds: list[float],
  compiled_programs: list[int],
  settled: list[bool] | None = None,
) -> float | None:
  """Median seconds of the steps after the first that compiled nothing
  and ran on the settled plan (`settled`, by step; None: all did); of
  every step after the first where none is such; None with fewer than 2
  steps."""
  if settled is None:
    settled = [True] * len(seconds)
  later = list(zip(seconds[1:], compiled_programs[1:], settled[1:]))
  if not later:
    return None
  quiet = [s for s, compiled, on in later if not compiled and on]
  return statistics.median(quiet or [s for s, _, _ in later])


def _finite(loss: float | None) -> float | None:
  """`loss`, or None where it is None or not finite."""
  return loss if loss is not None and np.isfinite(loss) else None


class StepFigures:
  """Loss, time, compilations, memory and transfers of each step.

  Memory and transfers are sampled after each step, outside its time.
  """

  def __init__(self, trainers: Sequence[Any], model: Any = None):
    """Measures the steps of `trainers` (the Loop's, one per task), which
    train `model` (the Loop's; None: `reversible_layers` is null)."""
    trainers = list(trainers)
    self._trainers = trainers
    self._classes = run_classes.of_trainers_and_model(trainers, model)
    self._counters = [
      c for c in map(_transfer_counter, trainers) if c is not None
    ]
    self._transfers_at_step_begin: tuple[int, int] | None = None
    self._peak_sampled_rss = 0
    self._device_probe_failed = False
    self._device_peak_reported = None
    self._device_bytes_source = None
    self._peak_at_steps_end: int | None = None
    # Set by `ProgressPrinter.set_step_floor` (`train --step_floor`).
    self.step_floor: dict[str, Any] | None = None
    self._stats: dict[str, list[Any]] = {
      key: []
      for key in (
        'steps',
        'loss',
        'step_seconds',
        'compiled_programs',
        'host_rss_bytes',
        'device_bytes_in_use',
        'h2d_bytes',
        'd2h_bytes',
      )
    }

  def _transfers(self) -> tuple[int, int] | None:
    """(h2d_bytes, d2h_bytes) summed over the trainers' counters, or None."""
    if not self._counters:
      return None
    snapshots = [c.snapshot() for c in self._counters]
    return (sum(s[0] for s in snapshots), sum(s[1] for s in snapshots))

  def begin_step(self) -> None:
    """Notes the transfers so far, as a step begins."""
    self._transfers_at_step_begin = self._transfers()

  def sample_rss(self) -> int:
    """Reads the host RSS now (bytes, int); it counts towards the peak."""
    rss = memory.host_rss_bytes()
    self._peak_sampled_rss = max(self._peak_sampled_rss, rss)
    return rss

  def peak_host_rss_bytes(self) -> int:
    """The process's peak RSS, bytes: the kernel's mark or a sample; as
    `end_steps` kept it once the steps ended."""
    if self._peak_at_steps_end is not None:
      return self._peak_at_steps_end
    return max(peak_host_rss_bytes(), self._peak_sampled_rss)

  def end_steps(self) -> None:
    """Keeps the peak RSS as it is now: what runs after the steps (the step
    floor's programs) does not count towards the run's peak."""
    self._peak_at_steps_end = self.peak_host_rss_bytes()

  def end_step(
    self, step: int, loss: float | None, seconds: float, programs: int
  ) -> None:
    """Records a step that ended: its loss, seconds, programs compiled."""
    stats = self._stats
    stats['steps'].append(int(step))
    stats['loss'].append(loss)
    stats['step_seconds'].append(seconds)
    stats['compiled_programs'].append(int(programs))
    stats['host_rss_bytes'].append(self.sample_rss())
    device = None
    if not self._device_probe_failed:
      try:
        device = memory.device_bytes_in_use()
      except Exception as e:  # pylint: disable=broad-except
        self._device_probe_failed = True
        logging.warning(
          'ProgressPrinter: device memory probe failed (%s: %s);'
          ' device bytes are not recorded for the rest of this '
          'run.',
          type(e).__name__,
          e,
        )
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

  def last_loss(self) -> tuple[int | None, float | None]:
    """(step, loss) of the last step recorded, the loss as run_stats.json
    has it (None where not finite); (None, None) before any step."""
    steps, losses = self._stats['steps'], self._stats['loss']
    if not steps:
      return None, None
    return steps[-1], _finite(losses[-1])

  def run_stats(self) -> dict[str, Any]:
    """Returns the per-step figures of this process's steps.

    Returns:
      dict with the keys of `run_stats.json` (see the module docstring);
      plain JSON types.
    """
    stats = self._stats
    seconds = stats['step_seconds']
    on_ready = {
      step
      for t in self._trainers
      for step in getattr(t, 'steps_on_ready_plan', ())
    }
    sampled_device = [b for b in stats['device_bytes_in_use'] if b is not None]
    device_peaks = sampled_device + (
      [self._device_peak_reported]
      if self._device_peak_reported is not None
      else []
    )
    counted = bool(stats['h2d_bytes']) and (
      len(stats['h2d_bytes']) == len(stats['steps'])
    )
    return {
      'trainer': self._classes.trainer,
      # Known once a step ran, not when the trainers were built.
      'trainer_fix': compat.stock_baseline_fix(self._trainers),
      'reversible_layers': self._classes.reversible_layers,
      'steps': list(stats['steps']),
      'loss': [_finite(v) for v in stats['loss']],
      'step_seconds': list(seconds),
      'compiled_programs': list(stats['compiled_programs']),
      'host_rss_bytes': list(stats['host_rss_bytes']),
      'device_bytes_in_use': list(stats['device_bytes_in_use']),
      'device_bytes_source': self._device_bytes_source,
      'h2d_bytes': list(stats['h2d_bytes']) if counted else None,
      'd2h_bytes': list(stats['d2h_bytes']) if counted else None,
      'first_step_seconds': seconds[0] if seconds else None,
      'median_step_seconds': _median_later_step(
        seconds,
        stats['compiled_programs'],
        [step not in on_ready for step in stats['steps']],
      ),
      'steps_on_ready_plan': sorted(on_ready),
      'peak_host_rss_bytes': self.peak_host_rss_bytes(),
      'peak_device_bytes': max(device_peaks) if device_peaks else None,
      'total_h2d_bytes': sum(stats['h2d_bytes']) if counted else None,
      'total_d2h_bytes': sum(stats['d2h_bytes']) if counted else None,
      'planning': self.planning(),
      'step_floor': self.step_floor,
    }

  def planning(self) -> list[dict] | None:
    """What planning cost the trainers that plan (`planning` in
    run_stats.json), or None where none does."""
    costs = self._planning_costs()
    return None if costs is None else [c.to_json() for c in costs]

  def planning_lines(self) -> list[str] | None:
    """The same, one line each (`PlanningCost.describe`)."""
    costs = self._planning_costs()
    return None if costs is None else [c.describe() for c in costs]

  def _planning_costs(self) -> list[Any] | None:
    """The `planning_log.PlanningCost`s of the trainers that plan, or None
    where none does."""
    planners = [t for t in self._trainers if hasattr(t, 'planning_costs')]
    if not planners:
      return None
    return [c for t in planners for c in t.planning_costs]

  def write(self, output_dir: str | None) -> str | None:
    """Writes `run_stats()` to `<output_dir>/run_stats.json`.

    Written to a temporary file and renamed, so a reader never sees half a
    file. Does nothing without an output dir; a write that fails is logged
    as a warning, never raised, so it cannot end a training run.

    Returns:
      The path written, or None.
    """
    if not output_dir:
      return None
    path = os.path.join(output_dir, RUN_STATS_FILENAME)
    tmp_path = path + '.tmp'
    try:
      with open(tmp_path, 'w', encoding='utf-8') as f:
        json.dump(self.run_stats(), f, indent=1)
      os.replace(tmp_path, path)
    except (OSError, TypeError, ValueError) as e:
      logging.warning(
        'ProgressPrinter: cannot write %s (%s: %s).', path, type(e).__name__, e
      )
      try:
        os.remove(tmp_path)
      except OSError:
        pass
      return None
    return path
