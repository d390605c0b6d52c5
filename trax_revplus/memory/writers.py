"""Where the memory log's records go: absl lines, `memory.jsonl`, TensorBoard.

`memory.jsonl` is opened for appending, so a restarted run adds to the same
file, and every record is written as one complete line in a single write to
an O_APPEND descriptor: a killed process can at worst leave its last line
cut short, which readers skip (`reading.read`); a writer that
finds the file not ending in a newline starts its first record on a new
line, so records written later still parse. A writer that raises is
reported once with an absl warning and skipped for the rest of the run.
"""

import json
import os
from typing import Any

from absl import logging

from trax_revplus import trax_import
from trax_revplus.memory.records import ends_without_newline
from trax_revplus.memory.records import format_record
from trax_revplus.memory.records import MEMORY_LOG_FILENAME
from trax_revplus.memory.records import TENSORBOARD_SUBDIR


def _summary_writer(log_dir):
  # trax imports take seconds; only runs that write TensorBoard pay for them.
  jaxboard = trax_import.module('trax.jaxboard')
  return jaxboard.SummaryWriter(log_dir)


# Fields that identify a record rather than measure something; not plotted.
_NON_SCALAR_FIELDS = frozenset(
  ['step', 'time', 'layer', 'pid', 'process_index', 'process_start_time']
)


class LogOutputs:
  """Where a memory log's records go: absl lines, `memory.jsonl`, TensorBoard.

  A base of `MemoryLog`, which sets `tensorboard`, `output_dir`, `_lock`,
  `_failed`, `_fd`, `_needs_newline` and `_writer` before use.
  """

  tensorboard: bool
  output_dir: str | None
  _lock: Any  # threading.RLock
  _failed: set[str]
  _fd: int | None
  _needs_newline: bool
  _writer: Any

  @property
  def jsonl_path(self) -> str | None:
    """str path of `memory.jsonl`, or None while there is no output dir."""
    if self.output_dir is None:
      return None
    return os.path.join(self.output_dir, MEMORY_LOG_FILENAME)

  def set_output_dir(self, output_dir: str | os.PathLike | None) -> None:
    """Writes `<output_dir>/memory.jsonl` and TensorBoard events from now on.

    Appends to an existing `memory.jsonl` (a restarted run continues it).
    Failing to open the file is reported once and disables file output; it
    never raises.

    Args:
      output_dir: str or path, directory (created if missing); None stops
        file and TensorBoard output.
    """
    with self._lock:
      self._set_output_dir(output_dir)

  def _set_output_dir(self, output_dir):
    output_dir = None if output_dir is None else os.fspath(output_dir)
    if output_dir == self.output_dir and (
      output_dir is None or self._fd is not None
    ):
      return
    self._close_outputs()
    self.output_dir = output_dir
    if output_dir is None:
      return
    try:
      os.makedirs(output_dir, exist_ok=True)
      path = self.jsonl_path
      assert path is not None  # output_dir was set just above.
      self._needs_newline = ends_without_newline(path)
      self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except Exception as e:  # pylint: disable=broad-except
      self._fd = None
      self._report_failure('memory.jsonl writer', e)
    if self.tensorboard and 'tensorboard writer' not in self._failed:
      try:
        self._writer = _summary_writer(
          os.path.join(output_dir, TENSORBOARD_SUBDIR)
        )
      except Exception as e:  # pylint: disable=broad-except
        self._writer = None
        self._report_failure('tensorboard writer', e)

  def _report_failure(self, name, error):
    if name in self._failed:
      return
    self._failed.add(name)
    logging.warning(
      'memory log: %s failed (%s: %s); it is skipped for the rest of this run.',
      name,
      type(error).__name__,
      error,
    )

  def _log_line(self, record):
    if 'absl line' in self._failed:
      return
    try:
      logging.info('%s', format_record(record))
    except Exception as e:  # pylint: disable=broad-except
      self._report_failure('absl line', e)

  def _write_jsonl(self, record):
    if self._fd is None:
      return
    try:
      line = json.dumps(record, allow_nan=False, separators=(',', ':')) + '\n'
      if self._needs_newline:
        line = '\n' + line
      data = line.encode('utf-8')
      # One write on an O_APPEND descriptor: concurrent or killed writers
      # cannot interleave or leave half a line followed by more records.
      written = os.write(self._fd, data)
      while written < len(data):
        written += os.write(self._fd, data[written:])
      self._needs_newline = False
    except Exception as e:  # pylint: disable=broad-except
      self._report_failure('memory.jsonl writer', e)
      self._close_fd()

  def _write_tensorboard(self, record):
    if self._writer is None:
      return
    try:
      prefix = f'{TENSORBOARD_SUBDIR}/{record["phase"]}'
      if record.get('layer') is not None:
        prefix += f'/layer_{record["layer"]}'
      step = int(record['step'])
      for key, value in record.items():
        if key in _NON_SCALAR_FIELDS or isinstance(value, bool):
          continue
        if isinstance(value, (int, float)):
          self._writer.scalar(f'{prefix}/{key}', value, step=step)
      self._writer.flush()
    except Exception as e:  # pylint: disable=broad-except
      self._report_failure('tensorboard writer', e)
      self._close_writer()

  def _close_fd(self):
    fd, self._fd = self._fd, None
    if fd is not None:
      # A descriptor that went bad was reported when its write failed;
      # closing must not raise a second time.
      for finish in (os.fsync, os.close):
        try:
          finish(fd)
        except OSError:
          pass

  def _close_writer(self):
    writer, self._writer = self._writer, None
    if writer is not None:
      try:
        writer.close()
      except Exception as e:  # pylint: disable=broad-except
        self._report_failure('tensorboard writer', e)

  def _close_outputs(self):
    self._close_fd()
    self._close_writer()
