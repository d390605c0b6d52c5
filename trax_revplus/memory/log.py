"""`MemoryLog`: the memory log of the reversible trainer.

One call `record(step, phase, **fields)` becomes

  * one absl INFO line a person can read, e.g.
    `memory step 101 backward: host 1532.4 MiB, device 210.3 MiB (live
    arrays), H2D 12.1 MiB, D2H 12.1 MiB, 0.412 s`
    (1 MiB = 2**20 bytes);
  * one JSON object on one line of `<output_dir>/memory.jsonl`, once an
    output directory is known (trax's `training.Loop` passes its own through
    `ReversibleSerialTrainer.set_output_dir`); the fields are listed in
    `fields`;
  * TensorBoard scalars, via `trax.jaxboard.SummaryWriter`, under
    `<output_dir>/memory/`, tagged `memory/<phase>/<field>` (per-layer records:
    `memory/<phase>/layer_<index>/<field>`), with the training step as x-axis.

Around each step the trainer calls `begin_step` and `end_step`: every step
gets a 'step' record carrying its true host peak (`host_peak`), and the
steps `RecordSchedule` picks (by default the first 10 of each
process, then every `every_n_steps`-th) also get phase records. The first
`begin_step` writes the process's 'start' record; `close` after a step
writes an 'end' record.

Robustness: a probe or writer that raises is reported once with an absl
warning naming it and the error, and skipped for the rest of the run;
`record` itself never raises. How records are written, and why a killed
writer cannot spoil the file: `writers`.

Which training steps get phase records (`RecordSchedule`): every step gets
one 'step' record (its true host peak, time and transfers); the steps
chosen there also get the records of their phases (forward, loss,
backward, free) and, with `memory_log_per_layer`, of each layer.
"""

import os
import threading
import time
from typing import Any, Sequence

import jax
import numpy as np
import psutil

from trax_revplus.memory import host_peak
from trax_revplus.memory.probes import device_bytes_in_use
from trax_revplus.memory.probes import host_rss_bytes
from trax_revplus.memory.records import Record
from trax_revplus.memory.records import to_json_value
from trax_revplus.memory.transfers import TransferCounter
from trax_revplus.memory.writers import LogOutputs

# Steps at the start of each process that are always recorded: the first
# steps compile, allocate and settle, so their memory differs most.
FIRST_STEPS_RECORDED = 10


class RecordSchedule:
  """Steps with phase records: the first steps of a process, then every n.

  A step is recorded when it is one of the first `first_steps` steps this
  schedule is asked about (counted from the first step asked, so a run
  resumed at step 501 records 501..510), or when
  `step % every_n_steps == 1 % every_n_steps` (1, 1 + n, 1 + 2n, ..., as
  trax's `step % 100 == 1`).
  """

  def __init__(
    self, every_n_steps: int = 100, first_steps: int = FIRST_STEPS_RECORDED
  ):
    """Creates the schedule.

    Args:
      every_n_steps: int >= 1; 1 records every step.
      first_steps: int >= 0, steps recorded at the start of each process.
    """
    self.every_n_steps = int(every_n_steps)
    self.first_steps = int(first_steps)
    self._first_step: int | None = None

  def should_record(self, step: int) -> bool:
    """Whether step `step` (int) gets phase records (bool)."""
    step = int(step)
    if self._first_step is None:
      self._first_step = step
    first = self._first_step
    if first <= step < first + max(self.first_steps, 1):
      return True
    return step % self.every_n_steps == 1 % self.every_n_steps


class MemoryLog(LogOutputs):
  """Records host and device memory of training steps.

  Replaces the psutil "cpu memory use (MB)" lines that trax's
  `ReversibleSerialTrainer.one_step` logs every 100 steps. The fields of a
  record are listed in `fields`, the files written in the module docstring.

  Usage:
    log = MemoryLog(every_n_steps=100)
    log.set_output_dir(output_dir)
    log.begin_step(step, transfers)
    if log.should_record(step):
      log.record(step, 'forward', seconds=0.41, h2d_bytes=...)
    log.end_step(step)
    log.close()
  """

  def __init__(
    self,
    every_n_steps: int = 100,
    per_layer: bool = False,
    output_dir: str | os.PathLike | None = None,
    tensorboard: bool = True,
    devices: Sequence[Any] | None = None,
    first_steps: int = FIRST_STEPS_RECORDED,
  ):
    """Creates a memory log.

    Args:
      every_n_steps: int >= 1; phase records for the first `first_steps`
        steps of the process, then steps 1, 1 + n, 1 + 2n, ... (see
        `should_record`); 1 records every step.
      per_layer: bool, whether the trainer should also make one record per
        layer; read by the trainer through the `per_layer` attribute.
      output_dir: str or None; directory for `memory.jsonl` and TensorBoard
        events; None writes absl lines only until `set_output_dir`.
      tensorboard: bool, whether to write TensorBoard scalars.
      devices: sequence of `jax.Device` to probe; default
        `jax.local_devices()` at each record.
      first_steps: int >= 0, steps with phase records at the start of each
        process.

    Raises:
      ValueError: `every_n_steps` is not an int >= 1.
    """
    if (
      isinstance(every_n_steps, bool)
      or not isinstance(every_n_steps, (int, np.integer))
      or every_n_steps < 1
    ):
      raise ValueError(
        f'every_n_steps must be an int >= 1 (1 records every step), got '
        f'{every_n_steps!r}.'
      )
    self.every_n_steps = int(every_n_steps)
    self.per_layer = bool(per_layer)
    self.tensorboard = bool(tensorboard)
    self.devices = None if devices is None else list(devices)
    self.output_dir = None
    self._lock = threading.RLock()
    self._schedule = RecordSchedule(self.every_n_steps, first_steps)
    # What `begin_step` noted of the step not yet ended.
    self._step: dict[str, Any] | None = None
    self._last_step: int | None = None
    self._steps_begun = 0
    self._ended = False
    # {'process_index', 'pid'}, read once.
    self._identity: dict[str, int] | None = None
    # {'trainer', 'reversible_layers'}: the 'start' record's names.
    self._run_classes: dict[str, str | None] = {}
    self._sampled_peak = 0  # Largest RSS read since the last step boundary.
    self._failed = set()
    self._fd = None
    self._needs_newline = False
    self._writer = None
    if output_dir is not None:
      self.set_output_dir(output_dir)

  def set_run_classes(
    self, trainer: str | None, reversible_layers: str | None
  ) -> None:
    """Names the classes the run trains with, in the 'start' record.

    Args:
      trainer: the trainer's class, as `trax_revplus.run_classes` names it
        (e.g. 'trax_revplus.trainer.ReversibleSerialTrainer'), or None.
      reversible_layers: the model's reversible layers, as
        `run_classes.reversible_layers` names them, or None.
    """
    self._run_classes = {
      'trainer': trainer,
      'reversible_layers': reversible_layers,
    }

  def should_record(self, step: int) -> bool:
    """Returns whether step `step` (int) gets phase records (bool).

    The first `first_steps` steps this log is asked about (10 by default:
    a run starting at step 1, or restarted at any step, is recorded from
    its first step on), then, as trax's `step % 100 == 1`, the steps with
    `step % every_n_steps == 1 % every_n_steps` (1, 1 + n, 1 + 2n, ...).
    """
    return self._schedule.should_record(step)

  def begin_step(
    self, step: int, transfers: TransferCounter | None = None
  ) -> bool:
    """Starts measuring step `step`; the first call records the process start.

    Resets the kernel's peak RSS mark (`host_peak.reset`), so the step's
    'step' record carries its true peak. Never raises.

    Args:
      step: int, the training step about to run.
      transfers: the trainer's `TransferCounter`, whose bytes the 'step'
        record reports; None leaves them out.

    Returns:
      bool, whether the step gets phase records (`should_record`).
    """
    recorded = self.should_record(step)
    try:
      with self._lock:
        between = self._reset_peak()
        if self._steps_begun == 0:
          self._record_start(int(step) - 1)
          between = None
        elif between is None:
          between = self._sampled_peak or None
        self._steps_begun += 1
        self._last_step = step
        self._ended = False
        self._sampled_peak = 0
        self._step = {
          'step': step,
          'recorded': recorded,
          'time': time.time(),
          'transfers': transfers,
          'transfers_at_begin': transfers.snapshot() if transfers else None,
          'between': between,
        }
        self._sample_rss()
    except Exception as e:  # pylint: disable=broad-except
      self._report_failure('step record', e)
    return recorded

  def end_step(self, step: int, **fields: Any) -> Record | None:
    """Writes the 'step' record of step `step` (begun by `begin_step`).

    Args:
      step: int, the step that ended.
      **fields: more record fields (units in their names).

    Returns:
      dict, the record written, or None when `begin_step` was not called for
      this step. Never raises.
    """
    started, self._step = self._step, None
    if started is None or started['step'] != step:
      return None
    try:
      peak, source = self._interval_peak()
      record = dict(
        self._identify(),
        host_peak_bytes=peak,
        host_peak_source=source,
        seconds=time.time() - started['time'],
        recorded=started['recorded'],
      )
      if started['transfers'] is not None:
        h2d, d2h = started['transfers'].since(started['transfers_at_begin'])
        record.update(h2d_bytes=h2d, d2h_bytes=d2h)
      if started['between'] is not None:
        record['host_peak_between_steps_bytes'] = started['between']
      record.update(fields)
      return self._record(
        step, 'step', record, probe_devices=started['recorded']
      )
    except Exception as e:  # pylint: disable=broad-except
      self._report_failure('step record', e)
      return None

  def _reset_peak(self):
    """The peak RSS since the last reset, resetting the kernel's mark.

    Only while `memory.jsonl` is written: a trainer used without an output
    dir (e.g. inside a benchmark that reads the mark itself) leaves the
    process's mark alone, and its step records carry sampled peaks.
    """
    if self._fd is None:
      return None
    return host_peak.reset()

  def _interval_peak(self):
    """(peak RSS bytes, source) since the last step boundary; starts anew."""
    peak = self._reset_peak()
    source = 'kernel_hwm'
    if peak is None:
      self._sample_rss()
      peak, source = self._sampled_peak, 'sampled'
    self._sampled_peak = 0
    return peak, source

  def _identify(self):
    if self._identity is None:
      try:
        index = int(jax.process_index())
      except Exception:  # pylint: disable=broad-except
        index = 0
      self._identity = {'process_index': index, 'pid': os.getpid()}
    return dict(self._identity)

  def _record_start(self, step):
    """The 'start' record: the process began training after step `step`."""
    try:
      started = psutil.Process(os.getpid()).create_time()
    except Exception:  # pylint: disable=broad-except
      started = None
    self._record(
      step,
      'start',
      dict(
        self._identify(),
        **self._run_classes,
        process_start_time=started,
        host_peak_bytes=host_peak.process_peak_bytes(),
        host_peak_source=(
          'kernel_hwm'
          if self._fd is not None and host_peak.supported()
          else 'sampled'
        ),
      ),
    )

  def _sample_rss(self):
    rss = self._probe('host_rss_bytes', host_rss_bytes)
    if rss is not None:
      self._sampled_peak = max(self._sampled_peak, rss)
    return rss

  def record(
    self,
    step: int,
    phase: str,
    *,
    devices: Sequence[Any] | None = None,
    **fields: Any,
  ) -> Record:
    """Probes memory and writes one record; never raises.

    Args:
      step: int, training step (0 while initializing).
      phase: str, e.g. 'init', 'forward', 'loss', 'backward', 'free'.
      devices: sequence of `jax.Device` to probe; default the log's devices.
      **fields: caller figures (seconds, layer, layer_name, h2d_bytes,
        d2h_bytes, weights_bytes, slots_bytes, host_rss_added_bytes,
        freed_arrays, freed_bytes, ...), units in their names; numpy and JAX
        scalars are accepted.

    Returns:
      dict, the record as written (plain JSON types): 'step', 'phase',
      'time', probe fields, then the caller's fields.
    """
    return self._record(step, phase, fields, devices=devices)

  def _record(self, step, phase, fields, devices=None, probe_devices=True):
    record = {
      'step': to_json_value(step),
      'phase': str(phase),
      'time': time.time(),
    }
    try:
      with self._lock:
        rss = self._sample_rss()
        if rss is not None:
          record['host_rss_bytes'] = rss
        if probe_devices:
          devices = self.devices if devices is None else devices
          device = self._probe(
            'device_bytes_in_use', lambda: device_bytes_in_use(devices)
          )
          if device is not None:
            record.update(device)
        for key, value in fields.items():
          if key not in ('step', 'phase'):
            record[key] = value
        record = to_json_value(record)
        self._log_line(record)
        self._write_jsonl(record)
        self._write_tensorboard(record)
    except Exception as e:  # pylint: disable=broad-except
      self._report_failure('memory record', e)
    return record

  def close(self) -> None:
    """Writes the 'end' record, closes `memory.jsonl` and TensorBoard.

    The 'end' record (after a step, once) carries the peak RSS since the
    last step ended (evals, checkpoints). Later records are logged with
    absl only, until `set_output_dir`.
    """
    with self._lock:
      if self._steps_begun and not self._ended:
        self._ended = True
        try:
          peak, source = self._interval_peak()
          last = self._last_step if self._last_step is not None else 0
          self._record(
            last,
            'end',
            dict(
              self._identify(), host_peak_bytes=peak, host_peak_source=source
            ),
          )
        except Exception as e:  # pylint: disable=broad-except
          self._report_failure('end record', e)
      self._close_outputs()
      self.output_dir = None

  def __enter__(self):
    return self

  def __exit__(self, *unused_exc_info):
    self.close()

  def _probe(self, name, fn):
    if name in self._failed:
      return None
    try:
      return fn()
    except Exception as e:  # pylint: disable=broad-except
      self._report_failure(name, e)
      return None
