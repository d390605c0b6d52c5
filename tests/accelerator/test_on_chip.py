"""Checks that need a real accelerator: trax's enwik8 Reformer planned on
the chip, `compare` and the benchmark on a one-chip host.

Marked `accelerator`: the README's test command and CI leave them out (they
have no accelerator). On a TPU or GPU host run them in one process, which
opens no backend itself (every check starts the processes that need the
chip, one after another):

    python -m pytest -m accelerator tests/accelerator

Where the only backend is the CPU they are skipped.
"""

import json
import os
import subprocess
import sys

import pytest

from trax_revplus import backend

pytestmark = pytest.mark.accelerator

REPO = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
ENWIK8 = os.path.join(REPO, 'gin_configs', 'reformer_enwik8_full.gin')
MAIN = os.path.join(REPO, 'gin_configs', 'reformer_char_lm.gin')


@pytest.fixture(scope='module', autouse=True)
def _on_an_accelerator():
  """Skips the module where the backend is the CPU (asked of a child
  process: this one must not hold the chip)."""
  if backend.probe()['platform'] == 'cpu':
    pytest.skip('no accelerator: the backend is the CPU')


def _cli(*args, timeout=1800):
  return subprocess.run(
    [sys.executable, '-m', 'trax_revplus.cli', *args],
    capture_output=True,
    text=True,
    cwd=REPO,
    timeout=timeout,
    check=False,
  )


def _records(run_dir):
  with open(os.path.join(run_dir, 'memory.jsonl')) as f:
    return [json.loads(line) for line in f if line.startswith('{')]


def test_enwik8_plans_and_trains_on_the_chip(tmp_path):
  run_dir = str(tmp_path / 'run')
  done = _cli(
    'train',
    f'--config_file={ENWIK8}',
    f'--output_dir={run_dir}',
    '--config=local_text_inputs.paths = None',
    '--config=train.steps = 2',
    '--config=train.eval_frequency = 2',
    '--config=train.eval_steps = 1',
    '--config=train.checkpoints_at = [2]',
  )
  assert done.returncode == 0, done.stderr[-2000:]
  records = _records(run_dir)
  steps = [r for r in records if r['phase'] == 'step']
  assert len(steps) == 2
  accounted = steps[-1]['peak_device_bytes']
  # The chip's peak leaves out a program's temporaries, which the
  # accounting counts (docs/accelerators.md): never above the accounted.
  chip_peak = max(r['device_peak_bytes'] for r in steps)
  assert chip_peak <= accounted * 1.05


def test_stock_and_the_default_trainer_end_in_one_line_on_enwik8(tmp_path):
  for name, extra in (
    ('stock', ['--implementation=stock']),
    ('default', ['--config=train.use_memory_efficient_trainer = False']),
  ):
    done = _cli(
      'train',
      f'--config_file={ENWIK8}',
      f'--output_dir={tmp_path / name}',
      *extra,
      '--config=local_text_inputs.paths = None',
      '--config=train.steps = 1',
    )
    assert done.returncode == 1, done.stdout[-2000:]
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith(
      'trax-revplus train: error: out of device memory'
    ), lines[-3:]
    assert 'Traceback' not in done.stderr


def test_compare_runs_both_sides_on_a_one_chip_host(tmp_path):
  """Both sides train on the chip, stock as the baseline (its Loop's RNG
  on the step's device), each with its step floor measured there."""
  done = _cli(
    'compare',
    f'--config_file={MAIN}',
    '--steps=20',
    '--step_floor',
    '--nodevice_accounting',
    f'--output_dir={tmp_path / "compare"}',
  )
  assert done.returncode == 0, done.stderr[-2000:]
  with open(tmp_path / 'compare' / 'compare.json') as f:
    data = json.load(f)
  runs = data['runs']
  assert runs['stock']['status'] == 'ok' and runs['revplus']['status'] == 'ok'
  assert runs['stock']['trainer_fix'] == "its Loop's RNG on the step's device"
  for run in runs.values():
    floor = run['stats']['step_floor']
    assert floor['step_floor_seconds'] > 0 and floor['flops_per_step'] > 0


def test_a_profile_shows_the_chip_and_its_copies(tmp_path):
  """--profile on the chip: the trace has the chip's programs, and
  tools/profile_summary.py finds the chip busy and the copies."""
  run_dir = str(tmp_path / 'run')
  done = _cli(
    'train',
    f'--config_file={MAIN}',
    f'--output_dir={run_dir}',
    '--profile=3-4',
    '--config=train.steps = 5',
    '--config=train.eval_frequency = 1000',
  )
  assert done.returncode == 0, done.stderr[-2000:]
  sys.path.insert(0, REPO)
  from tools import profile_summary  # pylint: disable=g-import-not-at-top

  figures = profile_summary.summarize(run_dir)
  assert figures['device'] != ['host CPU']
  assert 0 < figures['device_busy_fraction'] <= 1
  assert figures['transfer_seconds'] > 0


def test_the_benchmark_times_each_trainer_alone_with_its_chip_peak(tmp_path):
  done = subprocess.run(
    [
      sys.executable,
      os.path.join(REPO, 'tools', 'bench.py'),
      '--configs=char',
      '--trainers=stock,ours',
      '--nomemory',
      '--steps=2',
      f'--out_dir={tmp_path}',
    ],
    capture_output=True,
    text=True,
    cwd=REPO,
    timeout=1800,
    check=False,
  )
  assert done.returncode == 0, done.stderr[-2000:]
  with open(tmp_path / 'bench.json') as f:
    text = f.read()
  # Each trainer's own process reports the chip's peak (None on a CPU).
  assert '"chip_peak_bytes": null' not in text
  assert '"chip_peak_bytes"' in text
