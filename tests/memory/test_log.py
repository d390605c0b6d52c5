"""trax_revplus.memory's log: schedule, records, writers, step peaks."""

import glob
import json
import mmap
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
from trax_revplus.memory import log as log_lib
from trax_revplus.memory import writers as writers_lib


def _lines(path):
  with open(path, encoding='utf-8') as f:
    return f.read().split('\n')


def _warnings_naming(warning_mock, name):
  return [
    c
    for c in warning_mock.call_args_list
    if any(name in str(a) for a in c.args)
  ]


@pytest.mark.parametrize(
  'n, steps, expected',
  [
    (100, [1, 2, 100, 101, 102, 201], [1, 101, 201]),
    (100, [0, 1, 2, 101], [0, 1, 101]),
    (100, [501, 502, 601], [501, 601]),
    (1, [0, 1, 2, 3], [0, 1, 2, 3]),
    (3, [1, 2, 3, 4, 7], [1, 4, 7]),
  ],
)
def test_should_record_first_step_and_every_nth(n, steps, expected):
  log = memory.MemoryLog(every_n_steps=n, tensorboard=False, first_steps=1)
  assert [s for s in steps if log.should_record(s)] == expected


@pytest.mark.parametrize(
  'n, steps, expected',
  [
    (100, range(1, 302), list(range(1, 11)) + [101, 201, 301]),
    # A resumed process records its own first ten steps.
    (100, range(501, 702), list(range(501, 511)) + [601, 701]),
    (7, range(1, 30), list(range(1, 11)) + [15, 22, 29]),
    (1, range(0, 30), list(range(0, 30))),
  ],
)
def test_by_default_the_first_ten_steps_then_every_nth(n, steps, expected):
  log = memory.MemoryLog(every_n_steps=n, tensorboard=False)
  assert [s for s in steps if log.should_record(s)] == expected


@pytest.mark.parametrize('bad', [0, -1, 2.5, True, None])
def test_every_n_steps_must_be_positive_int(bad):
  with pytest.raises(ValueError, match='every_n_steps'):
    memory.MemoryLog(every_n_steps=bad)


def test_record_writes_parsable_jsonl(tmp_path):
  log = memory.MemoryLog(
    every_n_steps=1, output_dir=str(tmp_path), tensorboard=False
  )
  for step, phase in [
    (0, 'init'),
    (1, 'forward'),
    (1, 'loss'),
    (1, 'backward'),
    (1, 'free'),
  ]:
    returned = log.record(
      step,
      phase,
      seconds=np.float32(0.25),
      h2d_bytes=np.int64(1024),
      d2h_bytes=jax.numpy.int32(512),
      layer=np.int32(2),
      layer_name='Dense_2',
      grad_norm=float('nan'),
      shape=np.array([2, 3]),
    )
  log.close()
  lines = _lines(tmp_path / 'memory.jsonl')
  assert lines[-1] == ''  # Every record ends its line.
  records = [json.loads(line) for line in lines[:-1]]
  assert [(r['step'], r['phase']) for r in records] == [
    (0, 'init'),
    (1, 'forward'),
    (1, 'loss'),
    (1, 'backward'),
    (1, 'free'),
  ]
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
  record = {
    'step': 101,
    'phase': 'backward',
    'host_rss_bytes': 1532.4 * 2**20,
    'device_bytes_in_use': 210.3 * 2**20,
    'device_bytes_source': 'live_arrays',
    'h2d_bytes': 12.1 * 2**20,
    'd2h_bytes': 12.1 * 2**20,
    'seconds': 0.4123,
  }
  assert memory.format_record(record) == (
    'memory step 101 backward: host 1532.4 MiB, device 210.3 MiB '
    '(live arrays), H2D 12.1 MiB, D2H 12.1 MiB, 0.412 s'
  )
  record.update(
    layer=3,
    layer_name='ReversibleHalfResidual',
    device_peak_bytes=300 * 2**20,
    device_bytes_source='memory_stats',
  )
  line = memory.format_record(record)
  assert line.startswith(
    'memory step 101 backward layer 3 (ReversibleHalfResidual): '
  )
  assert 'device 210.3 MiB, peak 300.0 MiB,' in line


def test_record_logs_absl_line():
  log = memory.MemoryLog(tensorboard=False)
  with mock.patch.object(memory.logging, 'info') as info:
    log.record(7, 'loss', seconds=1.5)
  ((fmt, line),) = [c.args for c in info.call_args_list]
  assert fmt == '%s'
  assert line.startswith('memory step 7 loss: host ') and line.endswith(
    '1.500 s'
  )


def test_restart_appends(tmp_path):
  first = memory.MemoryLog(output_dir=str(tmp_path), tensorboard=False)
  first.record(1, 'forward')
  first.record(1, 'backward')
  first.close()
  second = memory.MemoryLog(tensorboard=False)
  second.set_output_dir(str(tmp_path))
  second.record(2, 'forward')
  second.close()
  records = [
    json.loads(line) for line in _lines(tmp_path / 'memory.jsonl') if line
  ]
  assert [(r['step'], r['phase']) for r in records] == [
    (1, 'forward'),
    (1, 'backward'),
    (2, 'forward'),
  ]


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
    (1, 'forward'),
    (2, 'forward'),
    (2, 'loss'),
  ]


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
  proc = subprocess.Popen(
    [sys.executable, '-c', script, str(tmp_path)],
    env=dict(os.environ, JAX_PLATFORMS='cpu'),
  )
  try:
    # As long as the writer takes to get there, however busy the machine.
    while proc.poll() is None and (
      not path.exists() or path.stat().st_size < 200_000
    ):
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

  with (
    mock.patch.object(log_lib, 'host_rss_bytes', broken),
    mock.patch.object(memory.logging, 'warning') as warning,
  ):
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
  with (
    mock.patch.object(
      log_lib, 'device_bytes_in_use', side_effect=RuntimeError('device lost')
    ),
    mock.patch.object(memory.logging, 'warning') as warning,
  ):
    first = log.record(1, 'forward')
    second = log.record(2, 'forward')
  assert len(_warnings_naming(warning, 'device_bytes_in_use')) == 1
  assert 'device_bytes_in_use' not in first and 'device_bytes_in_use' not in (
    second
  )
  assert second['host_rss_bytes'] > 0


def test_failing_writers_reported_once_and_record_returns(tmp_path):
  with (
    mock.patch.object(
      writers_lib, '_summary_writer', side_effect=RuntimeError('no tensorboard')
    ),
    mock.patch.object(memory.logging, 'warning') as warning,
  ):
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
  assert not any(
    'layer_name' in tag or tag.endswith('/step') for tag, _ in scalars
  )


# Step records: the true host peak of each step.


_SPIKE_BYTES = 96 << 20


def _spike():
  """Touches _SPIKE_BYTES of fresh memory and frees it again.

  Mapped directly rather than through malloc: an earlier test of the
  process may have raised glibc's mmap threshold (`host_mmap_threshold`),
  after which a freed numpy buffer stays in the heap and in the RSS.
  """
  mapped = mmap.mmap(-1, _SPIKE_BYTES)
  touched = np.frombuffer(mapped, np.uint8)
  touched[:] = 1
  assert touched.nbytes == _SPIKE_BYTES
  del touched
  mapped.close()


needs_peak_reset = pytest.mark.skipif(
  not memory.host_peak.supported(),
  reason='the kernel peak RSS mark cannot be reset here',
)


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
    'kernel_hwm'
  )
  # Gone by the end of the step, so no sample at its boundaries sees it.
  assert record['host_rss_bytes'] < rss_before + _SPIKE_BYTES / 2
  assert record['host_peak_bytes'] >= rss_before + 0.9 * _SPIKE_BYTES
  assert quiet['host_peak_bytes'] < rss_before + _SPIKE_BYTES / 2
  assert (record['h2d_bytes'], record['d2h_bytes']) == (300, 0)
  phases = [
    r['phase'] for r in memory.read_memory_log(tmp_path / 'memory.jsonl')
  ]
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
  log = memory.MemoryLog(
    every_n_steps=5, output_dir=str(tmp_path), tensorboard=False, first_steps=2
  )
  for step in range(1, 8):
    log.begin_step(step)
    if log.should_record(step):
      log.record(step, 'forward')
    log.end_step(step)
  log.close()
  records = memory.read_memory_log(tmp_path / 'memory.jsonl')
  steps = [r for r in records if r['phase'] == 'step']
  assert [r['step'] for r in steps] == list(range(1, 8))
  assert [r['recorded'] for r in steps] == [s in (1, 2, 6) for s in range(1, 8)]
  assert [r['step'] for r in records if r['phase'] == 'forward'] == [1, 2, 6]
  # Steps without phase records skip the device probe.
  assert all(('device_bytes_in_use' in r) == r['recorded'] for r in steps)
  assert (records[0]['phase'], records[0]['step']) == ('start', 0)
  assert (records[-1]['phase'], records[-1]['step']) == ('end', 7)
  assert records[0]['pid'] == os.getpid()
  assert records[0]['process_index'] == jax.process_index()


def test_peaks_of_records():
  records = [
    {
      'step': 1,
      'phase': 'step',
      'host_peak_bytes': 70,
      'host_rss_bytes': 50,
      'device_bytes_in_use': 5,
    },
    {
      'step': 1,
      'phase': 'forward',
      'host_rss_bytes': 60,
      'device_bytes_in_use': 9,
      'device_peak_bytes': None,
    },
    {
      'step': 2,
      'phase': 'step',
      'host_peak_between_steps_bytes': 80,
      'peak_device_bytes': 12,
    },
  ]
  assert memory.peaks(records) == {
    'host_peak_bytes': 80,
    'device_bytes_peak': 9,
    'peak_device_bytes': 12,
  }
  assert memory.peaks([]) == {
    'host_peak_bytes': None,
    'device_bytes_peak': None,
    'peak_device_bytes': None,
  }


def test_the_start_record_names_the_run_s_classes(tmp_path):
  log = memory.MemoryLog(output_dir=str(tmp_path), tensorboard=False)
  trainer = 'trax_revplus.trainer.ReversibleSerialTrainer'
  layers = 'trax_revplus.layers.ReversibleHalfResidual x2'
  log.set_run_classes(trainer, layers)
  log.begin_step(1)
  log.end_step(1)
  log.close()
  records = memory.read_memory_log(tmp_path / 'memory.jsonl')
  assert records[0]['phase'] == 'start'
  assert (records[0]['trainer'], records[0]['reversible_layers']) == (
    trainer,
    layers,
  )
  # Only the start record carries them.
  assert not [r for r in records[1:] if 'trainer' in r]
