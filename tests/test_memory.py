"""Tests for trax_revplus.memory (probes, memory log) and memory_plot."""

import collections
import gc
import glob
import json
import os
import subprocess
import sys
import textwrap
import time
from unittest import mock

import jax
import numpy as np
import psutil
import pytest

from trax_revplus import memory
from trax_revplus import memory_plot
from trax_revplus.memory import log as log_lib
from trax_revplus.memory import writers as writers_lib


def _lines(path):
  with open(path, encoding='utf-8') as f:
    return f.read().split('\n')


def _warnings_naming(warning_mock, name):
  return [c for c in warning_mock.call_args_list
          if any(name in str(a) for a in c.args)]


# Probes.


def test_host_rss_matches_psutil():
  direct = psutil.Process(os.getpid()).memory_info().rss
  probed = memory.host_rss_bytes()
  assert isinstance(probed, int)
  assert abs(probed - direct) <= 0.1 * direct


def test_device_bytes_grow_by_array_nbytes():
  device = jax.local_devices()[0]
  gc.collect()  # Garbage from earlier tests must not be freed mid-count.
  before = memory.device_memory([device])
  host = np.arange(512 * 1024, dtype=np.float32)  # 2 MiB
  x = jax.device_put(host, device)
  after = memory.device_memory([device])
  grown = after['device_bytes_in_use'] - before['device_bytes_in_use']
  assert after['device_bytes_in_use'] > 0
  # Allocator slack only where the backend reports its own figures.
  slack = 1 << 20 if after['device_bytes_source'] == 'memory_stats' else 0
  assert abs(grown - host.nbytes) <= slack
  assert after['device_bytes_in_use_per_device'] == [
      after['device_bytes_in_use']]
  if device.memory_stats() is None:
    assert after['device_bytes_source'] == 'live_arrays'
    assert after['device_peak_bytes'] is None
  x.delete()
  freed = memory.device_memory([device])
  assert (after['device_bytes_in_use'] - freed['device_bytes_in_use']
          >= host.nbytes - slack)


def test_device_bytes_count_each_shard_on_its_device():
  # The memory package imports JAX only, not trax: the subprocess starts fast.
  script = textwrap.dedent("""
      import json
      import jax, numpy as np
      from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
      from trax_revplus import memory
      devices = jax.local_devices()
      mesh = Mesh(np.array(devices), ('batch',))
      before = memory.device_memory(devices)['device_bytes_in_use_per_device']
      sharded = jax.device_put(np.ones((8, 1024), np.float32),
                               NamedSharding(mesh, P('batch')))
      replicated = jax.device_put(np.ones((256,), np.float32),
                                  NamedSharding(mesh, P()))
      after = memory.device_memory(devices)
      first = memory.device_memory(devices[:1])
      print(json.dumps({'before': before, 'after': after, 'first': first}))
  """)
  env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=4',
             JAX_PLATFORMS='cpu')
  out = subprocess.run([sys.executable, '-c', script], env=env, check=True,
                       capture_output=True, text=True)
  result = json.loads(out.stdout.strip().splitlines()[-1])
  before = result['before']
  after = result['after']['device_bytes_in_use_per_device']
  # Each device holds 2 of the 8 rows (2 * 1024 * 4 bytes) and a full copy of
  # the replicated 256 floats (1024 bytes).
  expected = 2 * 1024 * 4 + 256 * 4
  assert [a - b for a, b in zip(after, before)] == [expected] * 4
  assert result['after']['device_bytes_in_use'] == sum(after)
  assert result['first']['device_bytes_in_use_per_device'] == after[:1]


class _FakeAccelerator:
  """Stands for a GPU/TPU device, whose runtime reports memory_stats()."""

  def __init__(self, in_use, peak):
    self._stats = {'bytes_in_use': in_use, 'peak_bytes_in_use': peak,
                   'bytes_limit': 1 << 34}

  def memory_stats(self):
    return self._stats


def test_device_bytes_use_memory_stats_where_reported():
  devices = [_FakeAccelerator(100, 300), _FakeAccelerator(50, 70)]
  assert memory.device_memory(devices) == {
      'device_bytes_in_use': 150, 'device_peak_bytes': 370,
      'device_bytes_source': 'memory_stats',
      'device_bytes_in_use_per_device': [100, 50]}
  # One device without stats sends all to the live-array count, so the
  # figures of one record always share one source.
  local = jax.local_devices()[0]
  if local.memory_stats() is None:
    mixed = memory.device_memory([devices[0], local])
    assert mixed['device_bytes_source'] == 'live_arrays'
    assert mixed['device_bytes_in_use_per_device'][0] == 0


def test_array_bytes_sums_leaves():
  leaves = [np.zeros((3, 4), np.float32), np.zeros((5,), np.int8),
            np.float64(1.0)]
  tree = {'a': (leaves[0], ()), 'b': [leaves[1], {'c': leaves[2]}],
          'd': None, 'e': 3}
  assert memory.array_bytes(tree) == sum(x.nbytes for x in leaves)
  assert memory.array_bytes(()) == 0
  assert memory.array_bytes(((), ((),))) == 0
  abstract = [jax.ShapeDtypeStruct((4, 6), np.float32),
              jax.ShapeDtypeStruct((), np.int16)]
  assert memory.array_bytes(abstract) == 4 * 6 * 4 + 2
  x = jax.numpy.ones((7, 3), jax.numpy.bfloat16)
  assert memory.array_bytes((x, leaves[0])) == 7 * 3 * 2 + leaves[0].nbytes


def test_transfer_counter():
  counter = memory.TransferCounter()
  assert counter.snapshot() == (0, 0)
  counter.add_h2d(np.int64(100))
  counter.add_d2h(30)
  snap = counter.snapshot()
  counter.add_h2d(5)
  counter.add_d2h(7)
  assert (counter.h2d_bytes, counter.d2h_bytes) == (105, 37)
  assert counter.since(snap) == (5, 7)
  assert isinstance(counter.h2d_bytes, int)


# The log.


@pytest.mark.parametrize('n, steps, expected', [
    (100, [1, 2, 100, 101, 102, 201], [1, 101, 201]),
    (100, [0, 1, 2, 101], [0, 1, 101]),
    (100, [501, 502, 601], [501, 601]),
    (1, [0, 1, 2, 3], [0, 1, 2, 3]),
    (3, [1, 2, 3, 4, 7], [1, 4, 7]),
])
def test_should_record_first_step_and_every_nth(n, steps, expected):
  log = memory.MemoryLog(every_n_steps=n, tensorboard=False, first_steps=1)
  assert [s for s in steps if log.should_record(s)] == expected


@pytest.mark.parametrize('n, steps, expected', [
    (100, range(1, 302), list(range(1, 11)) + [101, 201, 301]),
    # A resumed process records its own first ten steps.
    (100, range(501, 702), list(range(501, 511)) + [601, 701]),
    (7, range(1, 30), list(range(1, 11)) + [15, 22, 29]),
    (1, range(0, 30), list(range(0, 30))),
])
def test_by_default_the_first_ten_steps_then_every_nth(n, steps, expected):
  log = memory.MemoryLog(every_n_steps=n, tensorboard=False)
  assert [s for s in steps if log.should_record(s)] == expected


@pytest.mark.parametrize('bad', [0, -1, 2.5, True, None])
def test_every_n_steps_must_be_positive_int(bad):
  with pytest.raises(ValueError, match='every_n_steps'):
    memory.MemoryLog(every_n_steps=bad)


def test_record_writes_parsable_jsonl(tmp_path):
  log = memory.MemoryLog(every_n_steps=1, output_dir=str(tmp_path),
                         tensorboard=False)
  for step, phase in [(0, 'init'), (1, 'forward'), (1, 'loss'),
                      (1, 'backward'), (1, 'free')]:
    returned = log.record(step, phase, seconds=np.float32(0.25),
                          h2d_bytes=np.int64(1024),
                          d2h_bytes=jax.numpy.int32(512),
                          layer=np.int32(2), layer_name='Dense_2',
                          grad_norm=float('nan'), shape=np.array([2, 3]))
  log.close()
  lines = _lines(tmp_path / 'memory.jsonl')
  assert lines[-1] == ''  # Every record ends its line.
  records = [json.loads(line) for line in lines[:-1]]
  assert [(r['step'], r['phase']) for r in records] == [
      (0, 'init'), (1, 'forward'), (1, 'loss'), (1, 'backward'), (1, 'free')]
  for r in records:
    assert r['host_rss_bytes'] > 0
    assert r['device_bytes_source'] in ('memory_stats', 'live_arrays')
    assert isinstance(r['device_bytes_in_use'], int)
    assert r['seconds'] == pytest.approx(0.25)
    assert (r['h2d_bytes'], r['d2h_bytes']) == (1024, 512)
    assert (r['layer'], r['layer_name']) == (2, 'Dense_2')
    assert r['grad_norm'] is None
    assert r['shape'] == [2, 3]
  assert returned == records[-1]
  assert memory.read_memory_log(tmp_path / 'memory.jsonl') == records


def test_record_host_rss_matches_psutil_and_device_bytes_positive(tmp_path):
  x = jax.device_put(np.ones((1024,), np.float32))
  log = memory.MemoryLog(output_dir=str(tmp_path), tensorboard=False)
  record = log.record(1, 'forward')
  direct = psutil.Process(os.getpid()).memory_info().rss
  log.close()
  assert abs(record['host_rss_bytes'] - direct) <= 0.1 * direct
  assert record['device_bytes_in_use'] >= x.nbytes


def test_log_line_is_readable():
  record = {'step': 101, 'phase': 'backward', 'host_rss_bytes': 1532.4 * 2**20,
            'device_bytes_in_use': 210.3 * 2**20,
            'device_bytes_source': 'live_arrays', 'h2d_bytes': 12.1 * 2**20,
            'd2h_bytes': 12.1 * 2**20, 'seconds': 0.4123}
  assert memory.format_record(record) == (
      'memory step 101 backward: host 1532.4 MiB, device 210.3 MiB '
      '(live arrays), H2D 12.1 MiB, D2H 12.1 MiB, 0.412 s')
  record.update(layer=3, layer_name='ReversibleHalfResidual',
                device_peak_bytes=300 * 2**20,
                device_bytes_source='memory_stats')
  line = memory.format_record(record)
  assert line.startswith(
      'memory step 101 backward layer 3 (ReversibleHalfResidual): ')
  assert 'device 210.3 MiB, peak 300.0 MiB,' in line


def test_record_logs_absl_line():
  log = memory.MemoryLog(tensorboard=False)
  with mock.patch.object(memory.logging, 'info') as info:
    log.record(7, 'loss', seconds=1.5)
  (fmt, line), = [c.args for c in info.call_args_list]
  assert fmt == '%s'
  assert line.startswith('memory step 7 loss: host ') and line.endswith(
      '1.500 s')


def test_restart_appends(tmp_path):
  first = memory.MemoryLog(output_dir=str(tmp_path), tensorboard=False)
  first.record(1, 'forward')
  first.record(1, 'backward')
  first.close()
  second = memory.MemoryLog(tensorboard=False)
  second.set_output_dir(str(tmp_path))
  second.record(2, 'forward')
  second.close()
  records = [json.loads(line) for line in _lines(tmp_path / 'memory.jsonl')
             if line]
  assert [(r['step'], r['phase']) for r in records] == [
      (1, 'forward'), (1, 'backward'), (2, 'forward')]


def test_line_cut_by_kill_is_skipped_and_later_records_parse(tmp_path):
  path = tmp_path / 'memory.jsonl'
  log = memory.MemoryLog(output_dir=str(tmp_path), tensorboard=False)
  log.record(1, 'forward')
  log.close()
  with open(path, 'a', encoding='utf-8') as f:
    f.write('{"step": 1, "phase": "backw')  # A writer killed mid-record.
  restarted = memory.MemoryLog(output_dir=str(tmp_path), tensorboard=False)
  restarted.record(2, 'forward')
  restarted.record(2, 'loss')
  restarted.close()
  lines = [line for line in _lines(path) if line]
  assert lines[1] == '{"step": 1, "phase": "backw'
  with pytest.raises(ValueError):
    json.loads(lines[1])
  for line in lines[:1] + lines[2:]:
    json.loads(line)
  assert [(r['step'], r['phase']) for r in memory.read_memory_log(path)] == [
      (1, 'forward'), (2, 'forward'), (2, 'loss')]


def test_killed_writer_leaves_parsable_lines(tmp_path):
  # A writer process recording as fast as it can is killed (SIGKILL) at an
  # arbitrary moment; the memory package imports no trax, so it starts fast.
  script = textwrap.dedent("""
      import sys
      from trax_revplus import memory
      log = memory.MemoryLog(every_n_steps=1, output_dir=sys.argv[1],
                             tensorboard=False)
      step = 0
      while True:
        step += 1
        log.record(step, 'forward', layer_name='x' * 2000)
  """)
  path = tmp_path / 'memory.jsonl'
  proc = subprocess.Popen([sys.executable, '-c', script, str(tmp_path)],
                          env=dict(os.environ, JAX_PLATFORMS='cpu'))
  try:
    # As long as the writer takes to get there, however busy the machine.
    while proc.poll() is None and (
        not path.exists() or path.stat().st_size < 200_000):
      time.sleep(0.05)
  finally:
    proc.kill()
    proc.wait()
  assert path.stat().st_size >= 200_000
  restarted = memory.MemoryLog(output_dir=str(tmp_path), tensorboard=False)
  restarted.record(10**6, 'forward')
  restarted.close()
  lines = [line for line in _lines(path) if line]
  parsed = []
  for i, line in enumerate(lines):
    try:
      parsed.append(json.loads(line))
    except ValueError:
      # Only the line being written at the kill may be cut short.
      assert i == len(lines) - 2
  assert [r['step'] for r in parsed[:-1]] == list(range(1, len(parsed)))
  assert parsed[-1]['step'] == 10**6


def test_failing_probe_reported_once_and_skipped(tmp_path):
  log = memory.MemoryLog(output_dir=str(tmp_path), tensorboard=False)
  calls = []

  def broken():
    calls.append(1)
    raise OSError('procfs unavailable')

  with mock.patch.object(log_lib, 'host_rss_bytes', broken), \
       mock.patch.object(memory.logging, 'warning') as warning:
    records = [log.record(s, 'forward', seconds=0.1) for s in (1, 2, 3)]
  log.close()
  reports = _warnings_naming(warning, 'host_rss_bytes')
  assert len(reports) == 1
  assert 'procfs unavailable' in str(reports[0].args)
  assert len(calls) == 1
  for r in records:
    assert 'host_rss_bytes' not in r
    assert r['seconds'] == 0.1 and 'device_bytes_in_use' in r
  assert len(memory.read_memory_log(tmp_path / 'memory.jsonl')) == 3


def test_failing_device_probe_keeps_host_figures():
  log = memory.MemoryLog(tensorboard=False)
  with mock.patch.object(log_lib, 'device_memory',
                         side_effect=RuntimeError('device lost')), \
       mock.patch.object(memory.logging, 'warning') as warning:
    first = log.record(1, 'forward')
    second = log.record(2, 'forward')
  assert len(_warnings_naming(warning, 'device_memory')) == 1
  assert 'device_bytes_in_use' not in first and 'device_bytes_in_use' not in (
      second)
  assert second['host_rss_bytes'] > 0


def test_failing_writers_reported_once_and_record_returns(tmp_path):
  with mock.patch.object(writers_lib, '_summary_writer',
                         side_effect=RuntimeError('no tensorboard')), \
       mock.patch.object(memory.logging, 'warning') as warning:
    log = memory.MemoryLog(output_dir=str(tmp_path))
    log.record(1, 'forward')
    os.close(log._fd)  # The descriptor goes bad under the log.
    for step in (2, 3):
      assert log.record(step, 'forward')['step'] == step
    log.close()
  assert len(_warnings_naming(warning, 'tensorboard writer')) == 1
  assert len(_warnings_naming(warning, 'memory.jsonl writer')) == 1
  assert len(warning.call_args_list) == 2
  assert len(memory.read_memory_log(tmp_path / 'memory.jsonl')) == 1


def test_set_output_dir_none_stops_file_output(tmp_path):
  log = memory.MemoryLog(output_dir=str(tmp_path), tensorboard=False)
  log.record(1, 'forward')
  log.set_output_dir(None)
  log.record(2, 'forward')
  log.close()
  assert len(memory.read_memory_log(tmp_path / 'memory.jsonl')) == 1


def test_tensorboard_scalars_written(tmp_path):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  log = memory.MemoryLog(output_dir=str(tmp_path))
  log.record(7, 'forward', h2d_bytes=4096, layer_name='Dense')
  log.record(0, 'init', layer=2, weights_bytes=64)
  log.close()
  events = glob.glob(str(tmp_path / 'memory' / 'events.out.tfevents.*'))
  assert len(events) == 1
  scalars = {}
  for event in tf.compat.v1.train.summary_iterator(events[0]):
    for value in event.summary.value:
      scalars[(value.tag, event.step)] = value.simple_value
  assert scalars[('memory/forward/h2d_bytes', 7)] == 4096
  assert scalars[('memory/forward/host_rss_bytes', 7)] > 0
  assert ('memory/forward/device_bytes_in_use', 7) in scalars
  assert scalars[('memory/init/layer_2/weights_bytes', 0)] == 64
  assert not any('layer_name' in tag or tag.endswith('/step')
                 for tag, _ in scalars)


# Plot.


def _write_small_log(run_dir):
  log = memory.MemoryLog(every_n_steps=1, output_dir=str(run_dir),
                         tensorboard=False)
  for layer in range(2):
    log.record(0, 'init', layer=layer, layer_name=f'Dense_{layer}',
               weights_bytes=4096, slots_bytes=8192)
  for step in (1, 2):
    for phase in ('forward', 'loss', 'backward', 'free'):
      log.record(step, phase, seconds=0.01, h2d_bytes=2 << 20,
                 d2h_bytes=1 << 20)
  log.close()


def test_plot_renders_png(tmp_path):
  _write_small_log(tmp_path)
  png = memory_plot.plot_memory(str(tmp_path))
  assert png == str(tmp_path / 'memory.png')
  with open(png, 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  other = memory_plot.plot_memory(str(tmp_path / 'memory.jsonl'),
                                  str(tmp_path / 'out' / 'm.png'))
  assert os.path.getsize(other) > 10_000


def test_plot_sums_transfers_per_step(tmp_path):
  _write_small_log(tmp_path)
  records = memory.read_memory_log(tmp_path / 'memory.jsonl')
  assert memory_plot._transfers_per_step(records) == {
      1: (8 << 20, 4 << 20), 2: (8 << 20, 4 << 20)}


def test_plot_errors_clearly(tmp_path):
  with pytest.raises(FileNotFoundError, match='No memory log at'):
    memory_plot.plot_memory(str(tmp_path))
  (tmp_path / 'memory.jsonl').write_text('{"step": 1, "pha')
  with pytest.raises(ValueError, match='holds no memory records'):
    memory_plot.plot_memory(str(tmp_path))
  assert memory_plot.main([str(tmp_path / 'missing')]) == 2


# Step records: the true host peak of each step.


_SPIKE_BYTES = 96 << 20


def _spike():
  """Touches _SPIKE_BYTES of fresh memory and frees it again."""
  buffer = np.ones(_SPIKE_BYTES // 8, np.float64)
  assert buffer.nbytes == _SPIKE_BYTES
  del buffer


needs_peak_reset = pytest.mark.skipif(
    not memory.host_peak.supported(),
    reason='the kernel peak RSS mark cannot be reset here')


@needs_peak_reset
def test_step_record_carries_the_peak_inside_the_step(tmp_path):
  log = memory.MemoryLog(output_dir=str(tmp_path), tensorboard=False)
  counter = memory.TransferCounter()
  log.begin_step(1, counter)
  rss_before = psutil.Process().memory_info().rss
  _spike()
  counter.add_h2d(300)
  record = log.end_step(1)
  quiet = (log.begin_step(2, counter), log.end_step(2))[1]
  log.close()
  assert record['phase'] == 'step' and record['host_peak_source'] == (
      'kernel_hwm')
  # Gone by the end of the step, so no sample at its boundaries sees it.
  assert record['host_rss_bytes'] < rss_before + _SPIKE_BYTES / 2
  assert record['host_peak_bytes'] >= rss_before + 0.9 * _SPIKE_BYTES
  assert quiet['host_peak_bytes'] < rss_before + _SPIKE_BYTES / 2
  assert (record['h2d_bytes'], record['d2h_bytes']) == (300, 0)
  phases = [r['phase'] for r in memory.read_memory_log(
      tmp_path / 'memory.jsonl')]
  assert phases == ['start', 'step', 'step', 'end']


@needs_peak_reset
def test_peaks_stay_true_across_the_log_s_resets(tmp_path):
  from trax_revplus import progress  # pylint: disable=g-import-not-at-top
  window = memory.host_peak.PeakWindow()
  rss_before = psutil.Process().memory_info().rss
  log = memory.MemoryLog(output_dir=str(tmp_path), tensorboard=False)
  log.begin_step(1)
  _spike()
  log.end_step(1)
  log.begin_step(2)
  log.end_step(2)
  log.close()
  assert window.peak_bytes() >= rss_before + 0.9 * _SPIKE_BYTES
  assert progress.peak_host_rss_bytes() >= rss_before + 0.9 * _SPIKE_BYTES


def test_without_an_output_dir_the_kernel_mark_is_left_alone():
  log = memory.MemoryLog(tensorboard=False)
  with mock.patch.object(memory.host_peak, 'reset') as reset:
    log.begin_step(1)
    record = log.end_step(1)
    log.close()
  reset.assert_not_called()
  assert record['host_peak_source'] == 'sampled'
  assert record['host_peak_bytes'] >= record['host_rss_bytes'] > 0


def test_steps_without_phase_records_get_a_step_record(tmp_path):
  log = memory.MemoryLog(every_n_steps=5, output_dir=str(tmp_path),
                         tensorboard=False, first_steps=2)
  for step in range(1, 8):
    log.begin_step(step)
    if log.should_record(step):
      log.record(step, 'forward')
    log.end_step(step)
  log.close()
  records = memory.read_memory_log(tmp_path / 'memory.jsonl')
  steps = [r for r in records if r['phase'] == 'step']
  assert [r['step'] for r in steps] == list(range(1, 8))
  assert [r['recorded'] for r in steps] == [
      s in (1, 2, 6) for s in range(1, 8)]
  assert [r['step'] for r in records if r['phase'] == 'forward'] == [1, 2, 6]
  # Steps without phase records skip the device probe.
  assert all(('device_bytes_in_use' in r) == r['recorded'] for r in steps)
  assert (records[0]['phase'], records[0]['step']) == ('start', 0)
  assert (records[-1]['phase'], records[-1]['step']) == ('end', 7)
  assert records[0]['pid'] == os.getpid()
  assert records[0]['process_index'] == jax.process_index()


# Plot.


def _write_resumed_log(run_dir):
  """Two processes: steps 1-3, then (resumed) steps 4-5, each with init."""
  for steps in ((1, 2, 3), (4, 5)):
    log = memory.MemoryLog(every_n_steps=1, output_dir=str(run_dir),
                           tensorboard=False)
    log.record(0, 'init', layer=0, weights_bytes=4096)
    log.record(0, 'init', layer=1, weights_bytes=4096)
    for step in steps:
      log.begin_step(step)
      for phase in ('forward', 'loss', 'backward'):
        log.record(step, phase, h2d_bytes=1 << 20)
      log.end_step(step)
    log.close()


def test_plot_draws_one_segment_per_process(tmp_path):
  _write_resumed_log(tmp_path)
  records = memory.read_memory_log(tmp_path / 'memory.jsonl')
  segs = memory_plot.segments(records)
  assert [len(s) for s in segs] == [2 + 1 + 3 * 4 + 1, 2 + 1 + 2 * 4 + 1]
  assert sum(segs, []) == records
  second = segs[1]
  xs = memory_plot.x_positions(second)
  by_phase = collections.defaultdict(list)
  for x, r in zip(xs, second):
    by_phase[r['phase']].append((r['step'], x))
  # The resumed process's init records sit just before step 4, not at 0.
  assert by_phase['start'] == [(3, 3.0)]
  assert all(2.5 < x <= 3 for _, x in by_phase['init'])
  # Step k spans (k - 1, k]: phases inside, the step record on the tick.
  assert by_phase['step'] == [(4, 4.0), (5, 5.0)]
  for phase in ('forward', 'loss', 'backward'):
    assert all(step - 1 < x < step for step, x in by_phase[phase])
  png = memory_plot.plot_memory(str(tmp_path))
  assert os.path.getsize(png) > 10_000


def test_plot_of_an_empty_log_says_so_in_a_figure(tmp_path):
  (tmp_path / 'memory.jsonl').write_text('')
  with pytest.raises(ValueError, match='holds no memory records'):
    memory_plot.plot_memory(str(tmp_path))
  with open(tmp_path / 'memory.png', 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'


def test_peaks_of_records():
  records = [{'step': 1, 'phase': 'step', 'host_peak_bytes': 70,
              'host_rss_bytes': 50, 'device_bytes_in_use': 5},
             {'step': 1, 'phase': 'forward', 'host_rss_bytes': 60,
              'device_bytes_in_use': 9, 'device_peak_bytes': None},
             {'step': 2, 'phase': 'step', 'host_peak_between_steps_bytes': 80,
              'peak_device_bytes': 12}]
  assert memory.peaks(records) == {'host_peak_bytes': 80,
                                   'device_bytes_peak': 9,
                                   'peak_device_bytes': 12}
  assert memory.peaks([]) == {'host_peak_bytes': None,
                              'device_bytes_peak': None,
                              'peak_device_bytes': None}


# The main job: every step of a run in the log, its peak the summary's.


def test_train_logs_every_step_and_the_summary_s_peak(tmp_path):
  from cli_cases import cli_command, MAIN, REPO, TINY_MODEL  # pylint: disable=g-import-not-at-top,g-multiple-import
  bindings = ['train.steps = 12', 'train.eval_frequency = 6',
              'sequence_length = 32'] + TINY_MODEL
  # No time limit: a busy machine makes the run slow, not wrong.
  result = subprocess.run(
      cli_command() + ['train', f'--config_file={MAIN}',
                       f'--output_dir={tmp_path}',
                       '--memory_log_every_n_steps=5'] +
      [f'--config={b}' for b in bindings],
      capture_output=True, text=True, cwd=REPO, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  records = memory.read_memory_log(tmp_path / 'memory.jsonl')
  phases = [r['phase'] for r in records]
  assert phases.index('start') < phases.index('step')
  assert phases[-1] == 'end'
  steps = [r for r in records if r['phase'] == 'step']
  assert [r['step'] for r in steps] == list(range(1, 13))
  # Phase records: the first 10 steps, then 1 + 5k.
  assert sorted({r['step'] for r in records if r['phase'] == 'backward'}) == (
      list(range(1, 11)) + [11])
  assert [r['recorded'] for r in steps] == [s <= 11 for s in range(1, 13)]
  if memory.host_peak.supported():
    assert {r['host_peak_source'] for r in steps} == {'kernel_hwm'}
  # The summary's peak (the process's, from the kernel) is the log's.
  summary = result.stdout.split('== summary ==', 1)[1]
  line = next(l for l in summary.splitlines()
              if l.startswith('peak host memory'))
  summary_mib = float(line.split()[3])
  log_mib = memory.peaks(records)['host_peak_bytes'] / memory.BYTES_PER_MIB
  assert abs(log_mib - summary_mib) <= 0.05 * summary_mib, (log_mib, line)
  png = memory_plot.plot_memory(str(tmp_path))
  assert os.path.getsize(png) > 10_000
