"""tools/bench.py as a user runs it: the entry script, from any directory.

Its child processes (each trainer timed in a process of its own, with its
environment argument; the memory process) take minutes to start and train:
tools/bench_smoke.py runs them end to end, and CI runs it after the tests.
"""

import os
import subprocess
import sys

_BENCH = os.path.join(
  os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
  'tools',
  'bench.py',
)


def test_a_flag_error_exits_non_zero_from_any_directory(tmp_path):
  out_dir = tmp_path / 'bench_results'
  proc = subprocess.run(
    [
      sys.executable,
      _BENCH,
      '--configs=l6,l7',
      '--notiming',
      '--nomemory',
      f'--out_dir={out_dir}',
    ],
    cwd=tmp_path,
    capture_output=True,
    text=True,
    check=False,
  )
  assert proc.returncode != 0
  assert "unknown configs ['l7']; choose from" in proc.stderr + proc.stdout
  assert not out_dir.exists()
