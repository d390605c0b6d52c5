"""The fields of `memory.jsonl`'s records: what each means, and the types
readers check.

A record is one JSON object on one line. Every figure carries its unit in its
name; sizes are in bytes, durations in seconds, times in Unix seconds.

  Always present:
    step (int): training step the record belongs to; trax's Loop numbers the
      first training step 1; records made while initializing use 0.
    phase (str): what the record measures. The trainer writes
      'init' (a layer's weights and slots placed on the host),
      'start' (the process began training: one per process, before its
        first step's records; its step is the last step done before this
        process, 0 for a fresh run),
      'forward', 'loss', 'backward' and 'free' (device buffers released):
        phases of a recorded step,
      'step' (one per step, after its phases),
      'end' (the log was closed: after the process's last step);
      any other string is accepted.
    time (float): Unix time when the record was made, seconds.

  From the probes (omitted when a probe failed earlier in the run, and in
  'step' records of steps without phase records):
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

  'start', 'step' and 'end' records (`host_peak`):
    host_peak_bytes (int): the true peak RSS of the interval the record
      closes: for 'step', from the step's begin to its end; for 'start',
      from process start to the first step's begin (imports, building and
      initializing the model); for 'end', from the last step's end to the
      log's closing (evals, checkpoints).
    host_peak_source (str): 'kernel_hwm' where the kernel's high-water mark
      is reset around each step (Linux), so the figure is exact;
      'sampled' elsewhere, and while the log writes no `memory.jsonl`
      (the kernel's mark is then left to the process): the largest RSS read
      at the step's boundaries and phase records, a lower bound.
    process_index (int): `jax.process_index()` of the writing process.
    pid (int): its operating-system process id.
  'start' also: process_start_time (float, Unix seconds, when the process
    was created); trainer and reversible_layers (str or None, where the
    trainer names them: the classes the run trains with, as the summary
    and run_stats.json name them, `trax_revplus.run_classes`).
  'step' also: seconds, h2d_bytes, d2h_bytes of the whole step;
    host_peak_between_steps_bytes (int, the peak RSS from the previous
    step's end to this step's begin: evals and checkpoints run there;
    absent for the first step of a process); recorded (bool, whether the
    step has phase records).

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
      (`host_release.HostMemoryReleaser`).
    n_layers (int): layers the call ran (per-layer records only).
    peak_device_bytes, peak_host_bytes (int): the step's accounted peak
      device bytes (per device) and host bytes, from XLA's figures of the
      planned programs (phase records of an accounted step; 'step' records
      carry peak_host_bytes).
    phase_peak_device_bytes, phase_peak_host_bytes (int): the same, within
      the phase alone (phase records of an accounted step).
    host_rss_backend_open_bytes (int): the process's RSS when its trainer
      was made, after the backend opened ('step' records): what a step's
      measured host peak is compared with.
  Other caller fields are written as given (numpy and JAX scalars and arrays
  become JSON numbers and lists; non-finite floats become null).

Readers skip a line that is not a valid record, e.g. one cut short by a
killed writer (`reading`).

A new figure of the log is a keyword field of the call that records it
(`MemoryLog.record`, `MemoryLog.end_step`, `PhaseRecorder.end_phase`),
described here, and, where readers use it, typed in `FIELD_TYPES`.
"""

NUMBER = 'a number'
INT = 'an int'
STR = 'a string'

# The fields readers use, and the type each must have when present and not
# null (JSON null means the figure is unknown).
FIELD_TYPES = {
  'step': NUMBER,
  'host_rss_bytes': NUMBER,
  'host_peak_bytes': NUMBER,
  'host_peak_between_steps_bytes': NUMBER,
  'device_bytes_in_use': NUMBER,
  'device_peak_bytes': NUMBER,
  'peak_device_bytes': NUMBER,
  'phase_peak_device_bytes': NUMBER,
  'h2d_bytes': NUMBER,
  'd2h_bytes': NUMBER,
  'seconds': NUMBER,
  'time': NUMBER,
  'layer': INT,
  'process_index': INT,
  'pid': INT,
  'phase': STR,
  'layer_name': STR,
  'trainer': STR,
  'reversible_layers': STR,
  'device_bytes_source': STR,
  'host_peak_source': STR,
}
REQUIRED = ('step', 'phase')
