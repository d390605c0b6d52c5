"""tools/eval_memory.py: an eval's figures per row parts, and its plan."""

import os
import subprocess
import sys

ROOT = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)


def test_figures_per_parts_and_the_plan_under_a_budget():
  proc = subprocess.run(
    [
      sys.executable,
      os.path.join(ROOT, 'tools', 'eval_memory.py'),
      '--config_file='
      + os.path.join(ROOT, 'gin_configs', 'reformer_char_lm.gin'),
      '--rows=4',
      '--length=64',
      '--budget_bytes=3000000',
    ],
    capture_output=True,
    text=True,
    check=False,
    cwd=ROOT,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = proc.stdout.strip().splitlines()
  assert lines[0] == '4 x 64 on cpu: parts | arguments | temporaries | peak'
  rows = [line.split(' | ') for line in lines[1:4]]
  assert [r[0] for r in rows] == ['1', '2', '4']
  peaks = [float(r[3].split()[0]) for r in rows]
  assert peaks[0] > peaks[1] > peaks[2]
  # The budget is below the weights (the arguments): the plan runs the
  # model's layers one program each.
  assert all(float(r[1].split()[0]) * 2**20 > 3000000 for r in rows)
  assert lines[4].startswith('plan: the model one layer at a time ('), lines
