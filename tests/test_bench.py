"""tools/bench.py rejects bad flags before measuring anything."""

import os
import subprocess
import sys

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
