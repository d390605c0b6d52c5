"""tools/bench.py: bad flags fail early; timing and memory processes work."""

import functools
import importlib.util
import json
import os
import shlex
import subprocess
import sys

import numpy as np
import pytest

_BENCH = os.path.join(os.path.dirname(os.path.dirname(__file__)), 'tools',
                      'bench.py')


@pytest.mark.parametrize('flag,message', [
    ('--configs=l6,l7', "unknown configs ['l7']; choose from"),
    ('--trainers=ours,stok', "unknown trainer 'stok'; choose from"),
    ('--trainers=ours+donat=True', "takes no argument 'donat'"),
    ('--trainers=ours+GLIBC_TUNABLES=1', 'GLIBC_TUNABLES must be a quoted'),
])
def test_unknown_names_are_usage_errors(flag, message, tmp_path):
  out_dir = tmp_path / 'bench_results'
  proc = subprocess.run(
      # Nothing to measure either way: a missing check ends the run quickly
      # with bench.json written, instead of starting a benchmark.
      [sys.executable, _BENCH, flag, '--notiming', '--nomemory',
       f'--out_dir={out_dir}'],
      # No time limit: on a busy machine the run takes what it takes.
      capture_output=True, text=True, check=False)
  assert proc.returncode != 0
  assert message in proc.stderr + proc.stdout
  assert not out_dir.exists()  # nothing measured, nothing written


def _run_quick_bench(args, out_dir):
  """Runs `python *args` (bench.py, `--quick`, `--out_dir=out_dir`, ...).

  Returns the run's `bench_quick.json`, parsed; fails the test if the run
  exits non-zero.
  """
  # No time limit: a slow or busy machine must not fail the test.
  proc = subprocess.run([sys.executable] + args, capture_output=True,
                        text=True, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(out_dir / 'bench_quick.json') as f:
    return json.load(f)


def test_timing_steps_each_trainer_in_its_own_process(tmp_path):
  # Ours runs with an environment argument, which its processes must see.
  ours = "ours+GLIBC_TUNABLES='glibc.malloc.arena_max=1'"
  args = [_BENCH, '--quick', '--configs=l6', f'--trainers=stock,{ours}',
          '--steps=1', '--nomemory', f'--out_dir={tmp_path}']
  results = _run_quick_bench(args, tmp_path)
  # The recorded command, split as a shell would, gives the same arguments.
  assert shlex.split(results['command']) == ['python'] + args
  timing = results['configs']['l6']['timing']
  for t in ('stock', ours):
    assert timing[t]['first_step_s'] > 0 and timing[t]['second_step_s'] > 0
    assert len(timing[t]['step_s']) == 1
    assert timing[t]['weights_bytes'] > 0 and timing[t]['slots_bytes'] > 0
  assert timing[ours]['glibc_tunables'] == 'glibc.malloc.arena_max=1'
  assert timing['stock']['glibc_tunables'] == os.environ.get('GLIBC_TUNABLES')
  # Same model, seed and batches in two processes: the same losses.
  np.testing.assert_allclose(timing[ours]['losses'],
                             timing['stock']['losses'], rtol=1e-5)
  assert len(timing[ours]['losses']) == 3


def test_memory_process_reports_its_peak_after_each_step(tmp_path):
  args = [_BENCH, '--quick', '--configs=l6', '--trainers=ours',
          '--memory_steps=3', '--notiming', f'--out_dir={tmp_path}']
  results = _run_quick_bench(args, tmp_path)
  mem = results['configs']['l6']['memory']['ours']
  peaks = mem['peak_above_baseline_after_step_bytes']
  assert len(peaks) == len(mem['step_s']) == 3
  assert peaks == sorted(peaks)  # a running peak never falls
  assert peaks[0] > 0
  # The process's peak is read after its last step.
  assert peaks[-1] <= mem['peak_above_baseline_bytes']
  assert mem['weights_bytes'] > 0 and mem['slots_bytes'] > 0


@functools.lru_cache(maxsize=None)  # its absl flags may be defined once
def _bench_module():
  spec = importlib.util.spec_from_file_location('bench', _BENCH)
  bench = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(bench)
  return bench


def test_trainer_variants_parse_and_get_their_own_table_rows():
  bench = _bench_module()
  assert bench.parse_trainer('ours') == ('ours', {})
  with pytest.raises(ValueError, match='only ours takes constructor'):
    bench.parse_trainer('stock+donate=False')
  with pytest.raises(ValueError, match="'donate=no' is not NAME=VALUE"):
    bench.parse_trainer('ours+donate=no')
  assert bench.parse_trainer('ours+host_mmap_threshold=None+n_async_layers=2'
                            ) == ('ours', {'host_mmap_threshold': None,
                                           'n_async_layers': 2})
  # An environment argument goes to the trainer's processes, not to its
  # constructor.
  lean = "ours+GLIBC_TUNABLES='glibc.malloc.arena_max=1'+n_async_layers=2"
  assert bench.parse_trainer(lean) == (
      'ours', {'GLIBC_TUNABLES': 'glibc.malloc.arena_max=1',
               'n_async_layers': 2})
  assert bench.split_trainer(lean) == (
      'ours', {'n_async_layers': 2},
      {'GLIBC_TUNABLES': 'glibc.malloc.arena_max=1'})
  assert bench.child_env(lean)['GLIBC_TUNABLES'] == 'glibc.malloc.arena_max=1'
  assert bench.child_env(lean)['PATH'] == os.environ['PATH']
  assert bench.child_env('ours+n_async_layers=2') is None
  with pytest.raises(ValueError, match='GLIBC_TUNABLES must be a quoted str'):
    bench.child_env('ours+GLIBC_TUNABLES=1')
  timing = {t: dict(median_step_s=s, first_step_s=10.0, second_step_s=3.0)
            for t, s in (('default', 2.0), ('stock', 4.0), ('ours', 3.0),
                         ('ours+donate=False', 3.3))}
  results = dict(configs={'l6': dict(config=bench.config('l6'),
                                     timing=timing)})
  text = bench.markdown(bench.summarize(results))
  # The main table keeps the three trainers; the variant gets its own row
  # with its ratios to stock and default.
  assert '| 2.000 | 4.000 | 3.000 | 0.75 | 1.50 |' in text
  assert ('| l6 | `ours+donate=False` | 3.300 | 0.82 | 1.65 | 10.0 | - |'
          in text)


def test_memory_median_keeps_every_process_s_running_peaks(monkeypatch):
  bench = _bench_module()
  runs = iter([
      dict(peak_above_baseline_bytes=p, step_s=[1.0, 1.0],
           peak_above_baseline_after_step_bytes=[p - 5, p])
      for p in (30, 10, 20)])
  monkeypatch.setattr(bench, 'run_memory', lambda name, t: next(runs))
  result = bench.run_memory_median('l6', 'ours', 3)
  assert result['peak_above_baseline_bytes'] == 20
  assert result['peak_above_baseline_after_step_bytes'] == [15, 20]
  assert result['peak_above_baseline_bytes_runs'] == [30, 10, 20]
  assert result['peak_above_baseline_after_step_bytes_runs'] == [
      [25, 30], [5, 10], [15, 20]]
