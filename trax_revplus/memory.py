"""Memory probes and the memory log of the reversible trainer.

Probes:

  host_rss_bytes() -> int: resident set size of this process (psutil).
  device_memory(devices=None) -> dict: bytes in use on accelerators.
  array_bytes(tree) -> int: bytes of all array leaves of a pytree.
  TransferCounter: cumulative host-to-device (H2D) and device-to-host (D2H)
    bytes, counted by the code that moves them.

The log, `MemoryLog`, turns one call `record(step, phase, **fields)` into

  * one absl INFO line a person can read, e.g.
    `memory step 101 backward: host 1532.4 MiB, device 210.3 MiB (live
    arrays), H2D 12.1 MiB, D2H 12.1 MiB, 0.412 s`
    (1 MiB = 2**20 bytes);
  * one JSON object on one line of `<output_dir>/memory.jsonl`, once an
    output directory is known (trax's `training.Loop` passes its own through
    `ReversibleSerialTrainer.set_output_dir`);
  * TensorBoard scalars, via `trax.jaxboard.SummaryWriter`, under
    `<output_dir>/memory/`, tagged `memory/<phase>/<field>` (per-layer records:
    `memory/<phase>/layer_<index>/<field>`), with the training step as x-axis.

Fields of a record (JSON object in `memory.jsonl`, dict returned by
`MemoryLog.record`). Every figure carries its unit in its name; sizes are in
bytes, durations in seconds, times in Unix seconds.

  Always present:
    step (int): training step the record belongs to; trax's Loop numbers the
      first training step 1; records made while initializing use 0.
    phase (str): part of the step measured. The trainer uses 'init' (layer
      weights and slots placed on the host), 'forward', 'loss', 'backward' and
      'free' (device buffers released); any other string is accepted.
    time (float): Unix time when the record was made, seconds.

  From the probes (omitted when a probe failed earlier in the run):
    host_rss_bytes (int): resident set size of this process.
    device_bytes_in_use (int): bytes in use, summed over the probed devices.
    device_peak_bytes (int or None): sum over devices of each device's peak
      bytes in use, where the backend reports it (`Device.memory_stats()`
      'peak_bytes_in_use'); None for the live-array fallback.
    device_bytes_source (str): 'memory_stats' when every probed device
      reports `Device.memory_stats()` (GPU, TPU); 'live_arrays' otherwise
      (CPU), where the bytes are those of `jax.live_arrays()` resident on each
      device, each array's shards counted on the devices that hold them.
    device_bytes_in_use_per_device (list of int): the same, per device, in
      the order of the probed devices.

  From the caller (present when passed; the trainer's fields):
    seconds (float): wall time of the phase.
    layer (int): index of the layer in the trainer's `all_layers` order
      (per-layer records only).
    layer_name (str): the layer's name (per-layer records only).
    h2d_bytes, d2h_bytes (int): bytes copied host-to-device and
      device-to-host during the phase.
    weights_bytes, slots_bytes (int): bytes of the layer's weights and
      optimizer slots.
    host_rss_added_bytes (int): growth of host RSS while the layer was
      initialized.
    freed_arrays (int), freed_bytes (int): device arrays released and their
      bytes.
    host_released_bytes (int): decrease of host RSS when free C-allocator
      memory was given back to the system during the phase
      (`host_memory.HostMemoryReleaser`).
  Other caller fields are written as given (numpy and JAX scalars and arrays
  become JSON numbers and lists; non-finite floats become null).

Robustness: a probe or writer that raises is reported once with an absl
warning naming it and the error, and skipped for the rest of the run;
`record` itself never raises. `memory.jsonl` is opened for appending, so a
restarted run adds to the same file, and every record is written as one
complete line in a single write to an O_APPEND descriptor: a killed process
can at worst leave its last line cut short. Rule for readers
(`read_memory_log`): a line that is not a complete JSON object is a record
lost to a kill and is skipped; a writer that finds the file not ending in a
newline starts its first record on a new line, so records written later
still parse.
"""

import json
import math
import os
import threading
import time

from absl import logging
import jax
import numpy as np
import psutil

MEMORY_LOG_FILENAME = 'memory.jsonl'
TENSORBOARD_SUBDIR = 'memory'
# Bytes in one MiB, the unit every figure printed in MiB is divided by.
BYTES_PER_MIB = 1 << 20

_PROCESS = psutil.Process(os.getpid())


def host_rss_bytes():
  """Returns the resident set size of this process.

  Mirrors the psutil reading that trax's `ReversibleSerialTrainer.one_step`
  logs ("cpu memory use (MB)").

  Returns:
    int, bytes.
  """
  return int(_PROCESS.memory_info().rss)


def _live_array_bytes_per_device(devices):
  """Bytes of live JAX arrays resident on each of `devices` (list of int)."""
  index = {d: i for i, d in enumerate(devices)}
  totals = [0] * len(devices)
  for arr in jax.live_arrays():
    try:
      if arr.is_deleted():
        continue
      sharding = arr.sharding
      held = [d for d in sharding.device_set if d in index]
      if not held:
        continue
      # The shard shape is the same for every device of a sharding; reading
      # it from the sharding avoids touching shard data, which would create
      # new arrays while we count.
      shard_shape = sharding.shard_shape(arr.shape)
      nbytes = int(math.prod(shard_shape)) * np.dtype(arr.dtype).itemsize
    except Exception:  # pylint: disable=broad-except
      # Arrays of extended dtypes (e.g. typed PRNG keys) have no numpy
      # itemsize; they are tiny, so leaving them out keeps the figure useful.
      continue
    for d in held:
      totals[index[d]] += nbytes
  return totals


def device_memory(devices=None):
  """Reads how many bytes are in use on accelerator devices.

  Uses `Device.memory_stats()` where every device reports it (GPU, TPU); else
  (CPU, where it returns None) sums the bytes of `jax.live_arrays()` resident
  on each device.

  Args:
    devices: sequence of `jax.Device`; default `jax.local_devices()`.

  Returns:
    dict with
      'device_bytes_in_use': int, bytes summed over `devices`;
      'device_peak_bytes': int (sum of per-device peaks, bytes) or None where
        the backend reports no peak;
      'device_bytes_source': 'memory_stats' or 'live_arrays';
      'device_bytes_in_use_per_device': list of int, bytes, one per device.

  Raises:
    Whatever the JAX runtime raises when a device cannot be queried;
    `MemoryLog` catches it.
  """
  devices = list(jax.local_devices() if devices is None else devices)
  stats = [d.memory_stats() for d in devices]
  if stats and all(s and 'bytes_in_use' in s for s in stats):
    per_device = [int(s['bytes_in_use']) for s in stats]
    if all('peak_bytes_in_use' in s for s in stats):
      peak = sum(int(s['peak_bytes_in_use']) for s in stats)
    else:
      peak = None
    source = 'memory_stats'
  else:
    per_device = _live_array_bytes_per_device(devices)
    peak = None
    source = 'live_arrays'
  return {
      'device_bytes_in_use': sum(per_device),
      'device_peak_bytes': peak,
      'device_bytes_source': source,
      'device_bytes_in_use_per_device': per_device,
  }


def array_bytes(tree):
  """Returns the bytes of all array leaves of a pytree.

  Args:
    tree: pytree (nested tuples, lists, dicts) whose leaves are numpy arrays,
      numpy scalars, `jax.Array`s or `jax.ShapeDtypeStruct`s (the bytes an
      array of that shape and dtype would hold); other leaves (Python
      numbers, None) and empty tuples count 0.

  Returns:
    int, bytes; a sharded or replicated `jax.Array` counts its logical size
    once.
  """
  total = 0
  for leaf in jax.tree_util.tree_leaves(tree):
    if isinstance(leaf, jax.ShapeDtypeStruct):
      total += math.prod(leaf.shape) * np.dtype(leaf.dtype).itemsize
      continue
    nbytes = getattr(leaf, 'nbytes', None)
    if nbytes is not None:
      total += int(nbytes)
  return total


class TransferCounter:
  """Counts bytes moved between host and devices.

  The code that issues a copy adds its size; counting at the call site is
  exact and free, where probing the runtime is neither. Thread-safe, so
  copies completed on a background thread may count themselves.

  Attributes:
    h2d_bytes: int, bytes copied host-to-device since creation.
    d2h_bytes: int, bytes copied device-to-host since creation.
  """

  def __init__(self):
    self._lock = threading.Lock()
    self.h2d_bytes = 0
    self.d2h_bytes = 0

  def add_h2d(self, nbytes):
    """Counts `nbytes` (int, bytes) copied host-to-device."""
    with self._lock:
      self.h2d_bytes += int(nbytes)

  def add_d2h(self, nbytes):
    """Counts `nbytes` (int, bytes) copied device-to-host."""
    with self._lock:
      self.d2h_bytes += int(nbytes)

  def snapshot(self):
    """Returns (h2d_bytes, d2h_bytes), both int bytes, read together."""
    with self._lock:
      return (self.h2d_bytes, self.d2h_bytes)

  def since(self, snapshot):
    """Returns (h2d_bytes, d2h_bytes) moved since an earlier `snapshot()`."""
    h2d, d2h = self.snapshot()
    return (h2d - snapshot[0], d2h - snapshot[1])


def _to_json_value(value):
  """Converts a field value to plain JSON types (numbers, str, lists, dicts)."""
  if value is None or isinstance(value, (bool, int, str)):
    return value
  if isinstance(value, float):
    return value if math.isfinite(value) else None
  if isinstance(value, np.generic):
    return _to_json_value(value.item())
  if isinstance(value, dict):
    return {str(k): _to_json_value(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_to_json_value(v) for v in value]
  if isinstance(value, (np.ndarray, jax.Array)):
    value = np.asarray(value)
    return _to_json_value(value.item() if value.ndim == 0 else value.tolist())
  return str(value)


def _mib(nbytes):
  return f'{nbytes / BYTES_PER_MIB:.1f} MiB'


def format_record(record):
  """Returns the one-line, human-readable form of a record (str).

  E.g. 'memory step 101 backward layer 3 (ReversibleHalfResidual): host
  1532.4 MiB, device 210.3 MiB (live arrays), H2D 12.1 MiB, D2H 12.1 MiB,
  0.412 s'.
  """
  head = f'memory step {record.get("step")} {record.get("phase")}'
  if record.get('layer') is not None:
    head += f' layer {record["layer"]}'
    if record.get('layer_name'):
      head += f' ({record["layer_name"]})'
  parts = []
  if record.get('host_rss_bytes') is not None:
    parts.append('host ' + _mib(record['host_rss_bytes']))
  if record.get('device_bytes_in_use') is not None:
    device = 'device ' + _mib(record['device_bytes_in_use'])
    if record.get('device_peak_bytes') is not None:
      device += ', peak ' + _mib(record['device_peak_bytes'])
    if record.get('device_bytes_source') == 'live_arrays':
      device += ' (live arrays)'
    parts.append(device)
  labelled = [('weights_bytes', 'weights'), ('slots_bytes', 'slots'),
              ('host_rss_added_bytes', 'host added'),
              ('h2d_bytes', 'H2D'), ('d2h_bytes', 'D2H')]
  for key, label in labelled:
    if isinstance(record.get(key), (int, float)):
      parts.append(f'{label} {_mib(record[key])}')
  if isinstance(record.get('freed_bytes'), (int, float)):
    freed = 'freed '
    if record.get('freed_arrays') is not None:
      freed += f'{record["freed_arrays"]} arrays, '
    parts.append(freed + _mib(record['freed_bytes']))
  if isinstance(record.get('seconds'), (int, float)):
    parts.append(f'{record["seconds"]:.3f} s')
  return head + ': ' + ', '.join(parts)


def read_memory_log(path):
  """Reads the records of a `memory.jsonl` file.

  Lines that are not a complete JSON object (a record cut short when its
  writer was killed) are skipped, following the rule in the module docstring.

  Args:
    path: str, a `memory.jsonl` file.

  Returns:
    list of dict, the records in file order.

  Raises:
    FileNotFoundError: `path` does not exist.
  """
  records = []
  skipped = 0
  with open(path, 'r', encoding='utf-8', errors='replace') as f:
    for line in f:
      line = line.strip()
      if not line:
        continue
      try:
        record = json.loads(line)
      except ValueError:
        skipped += 1
        continue
      if isinstance(record, dict):
        records.append(record)
      else:
        skipped += 1
  if skipped:
    logging.info('%s: skipped %d incomplete line(s), records cut short by a '
                 'killed writer.', path, skipped)
  return records


def _summary_writer(log_dir):
  # trax imports take seconds; only runs that write TensorBoard pay for them.
  from trax import jaxboard  # pylint: disable=g-import-not-at-top
  return jaxboard.SummaryWriter(log_dir)


# Fields that identify a record rather than measure something; not plotted.
_NON_SCALAR_FIELDS = frozenset(['step', 'time', 'layer'])


class MemoryLog:
  """Records host and device memory at phase boundaries of training steps.

  Replaces the psutil "cpu memory use (MB)" lines that trax's
  `ReversibleSerialTrainer.one_step` logs every 100 steps. The fields of a
  record and the files written are described in the module docstring.

  Usage:
    log = MemoryLog(every_n_steps=100)
    log.set_output_dir(output_dir)
    if log.should_record(step):
      log.record(step, 'forward', seconds=0.41, h2d_bytes=...)
    log.close()
  """

  def __init__(self, every_n_steps=100, per_layer=False, output_dir=None,
               tensorboard=True, devices=None):
    """Creates a memory log.

    Args:
      every_n_steps: int >= 1, record steps 1, 1 + n, 1 + 2n, ... (see
        `should_record`); 1 records every step.
      per_layer: bool, whether the trainer should also make one record per
        layer; read by the trainer through the `per_layer` attribute.
      output_dir: str or None; directory for `memory.jsonl` and TensorBoard
        events; None writes absl lines only until `set_output_dir`.
      tensorboard: bool, whether to write TensorBoard scalars.
      devices: sequence of `jax.Device` to probe; default
        `jax.local_devices()` at each record.

    Raises:
      ValueError: `every_n_steps` is not an int >= 1.
    """
    if (isinstance(every_n_steps, bool) or
        not isinstance(every_n_steps, (int, np.integer)) or every_n_steps < 1):
      raise ValueError(
          f'every_n_steps must be an int >= 1 (1 records every step), got '
          f'{every_n_steps!r}.')
    self.every_n_steps = int(every_n_steps)
    self.per_layer = bool(per_layer)
    self.tensorboard = bool(tensorboard)
    self.devices = None if devices is None else list(devices)
    self.output_dir = None
    self._lock = threading.RLock()
    self._first_step = None
    self._failed = set()
    self._fd = None
    self._needs_newline = False
    self._writer = None
    if output_dir is not None:
      self.set_output_dir(output_dir)

  @property
  def jsonl_path(self):
    """str path of `memory.jsonl`, or None while there is no output dir."""
    if self.output_dir is None:
      return None
    return os.path.join(self.output_dir, MEMORY_LOG_FILENAME)

  def set_output_dir(self, output_dir):
    """Writes `<output_dir>/memory.jsonl` and TensorBoard events from now on.

    Appends to an existing `memory.jsonl` (a restarted run continues it).
    Failing to open the file is reported once and disables file output; it
    never raises.

    Args:
      output_dir: str, directory (created if missing); None stops file and
        TensorBoard output.
    """
    with self._lock:
      self._set_output_dir(output_dir)

  def _set_output_dir(self, output_dir):
    output_dir = None if output_dir is None else os.fspath(output_dir)
    if output_dir == self.output_dir and (
        output_dir is None or self._fd is not None):
      return
    self._close_outputs()
    self.output_dir = output_dir
    if output_dir is None:
      return
    try:
      os.makedirs(output_dir, exist_ok=True)
      path = self.jsonl_path
      self._needs_newline = _ends_without_newline(path)
      self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except Exception as e:  # pylint: disable=broad-except
      self._fd = None
      self._report_failure('memory.jsonl writer', e)
    if self.tensorboard and 'tensorboard writer' not in self._failed:
      try:
        self._writer = _summary_writer(
            os.path.join(output_dir, TENSORBOARD_SUBDIR))
      except Exception as e:  # pylint: disable=broad-except
        self._writer = None
        self._report_failure('tensorboard writer', e)

  def should_record(self, step):
    """Returns whether step `step` (int) gets memory records (bool).

    The rule mirrors trax's `step % 100 == 1`: steps with
    `step % every_n_steps == 1 % every_n_steps` (1, 1 + n, 1 + 2n, ...), plus
    the first step this log is asked about, so a run starting at step 0, or
    restarted at any step, is recorded from its first step.
    """
    step = int(step)
    if self._first_step is None:
      self._first_step = step
    return (step == self._first_step or
            step % self.every_n_steps == 1 % self.every_n_steps)

  def record(self, step, phase, *, devices=None, **fields):
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
    record = {'step': _to_json_value(step), 'phase': str(phase),
              'time': time.time()}
    try:
      with self._lock:
        rss = self._probe('host_rss_bytes', host_rss_bytes)
        if rss is not None:
          record['host_rss_bytes'] = rss
        devices = self.devices if devices is None else devices
        device = self._probe('device_memory', lambda: device_memory(devices))
        if device is not None:
          record.update(device)
        for key, value in fields.items():
          if key not in ('step', 'phase'):
            record[key] = value
        record = _to_json_value(record)
        self._log_line(record)
        self._write_jsonl(record)
        self._write_tensorboard(record)
    except Exception as e:  # pylint: disable=broad-except
      self._report_failure('memory record', e)
    return record

  def close(self):
    """Flushes and closes `memory.jsonl` and the TensorBoard writer.

    Later records are logged with absl only, until `set_output_dir`.
    """
    with self._lock:
      self._close_outputs()
      self.output_dir = None

  def __enter__(self):
    return self

  def __exit__(self, *unused_exc_info):
    self.close()

  def _report_failure(self, name, error):
    if name in self._failed:
      return
    self._failed.add(name)
    logging.warning('memory log: %s failed (%s: %s); it is skipped for the '
                    'rest of this run.', name, type(error).__name__, error)

  def _probe(self, name, fn):
    if name in self._failed:
      return None
    try:
      return fn()
    except Exception as e:  # pylint: disable=broad-except
      self._report_failure(name, e)
      return None

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


def _ends_without_newline(path):
  """Whether `path` exists, is non-empty and its last byte is not a newline."""
  try:
    with open(path, 'rb') as f:
      f.seek(0, os.SEEK_END)
      if f.tell() == 0:
        return False
      f.seek(-1, os.SEEK_END)
      return f.read(1) != b'\n'
  except FileNotFoundError:
    return False
