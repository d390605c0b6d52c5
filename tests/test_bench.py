"""tools/bench.py: bad flags fail early; the timing processes work."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

_BENCH = os.path.join(os.path.dirname(os.path.dirname(__file__)), 'tools',
                      'bench.py')


@pytest.mark.parametrize('flag,message', [
    ('--configs=l6,l7', "unknown configs ['l7']; choose from"),
    ('--trainers=ours,stok', "unknown trainers ['stok']; choose from"),
])
def test_unknown_names_are_usage_errors(flag, message, tmp_path):
  out_dir = tmp_path / 'bench_results'
  proc = subprocess.run(
      # Nothing to measure either way: a missing check ends the run quickly
      # with bench.json written, instead of starting a benchmark.
      [sys.executable, _BENCH, flag, '--notiming', '--nomemory',
       f'--out_dir={out_dir}'],
      capture_output=True, text=True, timeout=300, check=False)
  assert proc.returncode != 0
  assert message in proc.stderr + proc.stdout
  assert not out_dir.exists()  # nothing measured, nothing written


def test_timing_steps_each_trainer_in_its_own_process(tmp_path):
  proc = subprocess.run(
      [sys.executable, _BENCH, '--quick', '--configs=l64',
       '--trainers=stock,ours', '--steps=1', '--nomemory',
       f'--out_dir={tmp_path}'],
      capture_output=True, text=True, timeout=600, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(tmp_path / 'bench_quick.json') as f:
    timing = json.load(f)['configs']['l64']['timing']
  for t in ('stock', 'ours'):
    assert timing[t]['first_step_s'] > 0 and timing[t]['second_step_s'] > 0
    assert len(timing[t]['step_s']) == 1
    assert timing[t]['weights_bytes'] > 0 and timing[t]['slots_bytes'] > 0
  # Same model, seed and batches in two processes: the same losses.
  np.testing.assert_allclose(timing['ours']['losses'],
                             timing['stock']['losses'], rtol=1e-5)
  assert len(timing['ours']['losses']) == 3
