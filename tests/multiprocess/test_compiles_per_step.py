"""A step of a 2-process run compiles nothing after the first two steps.

As on one process: the programs of a step are compiled once (the first
step, and the second's few of trax's own), then reused. Two real processes
on loopback (tests/multiprocess/compiles_worker.py, through
`trax_revplus.multiprocess.launcher`) train a tiny reversible model and
count, per step, the programs JAX compiled (`progress.CompileCounter`).
"""

import json
import os
import subprocess
import sys

from conftest import start_seconds

_WORKER = os.path.join(
  os.path.dirname(os.path.abspath(__file__)), 'compiles_worker.py'
)
_REPO = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
_STEPS = 4


def test_steps_after_the_second_compile_nothing_under_two_processes():
  proc = subprocess.run(
    [
      sys.executable,
      '-m',
      'trax_revplus.multiprocess.launcher',
      '--num_processes=2',
      '--',
      sys.executable,
      _WORKER,
      str(_STEPS),
    ],
    cwd=_REPO,
    capture_output=True,
    text=True,
    timeout=2 * start_seconds(),
    env=dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=1'),
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  for i in range(2):
    prefix = f'[process {i}] {{"compiles_per_step": '
    [line] = [l for l in proc.stdout.splitlines() if l.startswith(prefix)]
    counts = json.loads(line[len(f'[process {i}] ') :])['compiles_per_step']
    assert len(counts) == _STEPS
    assert counts[0][0] > 0  # The counter sees the first step's programs.
    assert [n for n, _ in counts[2:]] == [0] * (_STEPS - 2), counts
