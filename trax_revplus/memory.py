"""Memory probes and the memory log (interface; being implemented).

Public interface the trainer codes against:

  host_rss_bytes() -> int
  device_memory(devices) -> dict with keys
      'device_bytes_in_use' (int, summed over `devices`),
      'device_peak_bytes' (int or None where the backend has no peak),
      'device_bytes_source' ('memory_stats' or 'live_arrays').
  array_bytes(tree) -> int: bytes of all array leaves of a pytree.

  class TransferCounter:
      add_h2d(nbytes), add_d2h(nbytes); attributes h2d_bytes, d2h_bytes
      (cumulative ints, bytes).

  class MemoryLog(every_n_steps=100, per_layer=False, output_dir=None,
                  tensorboard=True):
      set_output_dir(output_dir)
      should_record(step) -> bool
      record(step, phase, *, seconds=None, layer=None, h2d_bytes=None,
             d2h_bytes=None, devices=None, **fields) -> dict
      close()
"""
