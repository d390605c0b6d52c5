"""Step time of 2 processes x 1 device against 1 process x 2 devices.

Trains the l6 benchmark model (tools/bench.py: ReformerLM, 6 layers, length
1024, d_model 128, global batch 4, full attention, dropout 0.1) on the main
job's data (gin_configs/reformer_char_lm.gin with overrides) with
`trax-revplus`, as

  2x1  `trax-revplus launch --num_processes=2 -- train ...`, one CPU device
       per process (collectives over gloo on loopback);
  1x2  `trax-revplus train ...` with
       `XLA_FLAGS=--xla_force_host_platform_device_count=2`.

Runs cannot be interleaved step by step across processes, so whole runs
alternate (2x1, 1x2, 1x2, 2x1, 2x1, 1x2 for --rounds=3); each run's step time
is the median of its `run_stats.json` `step_seconds` after the first step
(which compiles). Prints one line per run and a JSON summary with the
medians over runs and their ratio; `--json` writes the summary too.

Usage:
  python tools/multiprocess_step_time.py --work_dir=/tmp/mp_step_time
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

from multiprocess_smoke import cli
from multiprocess_smoke import CONFIG
from multiprocess_smoke import cpu_env

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# tools/bench.py's l6 on the main job's data.
L6 = [
  'sequence_length = 1024',
  'ReformerLM.n_layers = 6',
  'ReformerLM.d_model = 128',
  'ReformerLM.d_ff = 512',
  'ReformerLM.d_attention_key = 32',
  'ReformerLM.d_attention_value = 32',
  'ReformerLM.n_heads = 4',
  'ReformerLM.dropout = 0.1',
  'local_text_inputs.batch_size = 4',
  'local_text_inputs.eval_batch_size = 4',
  'eval_steps = 1',
]
LAYOUTS = {'2x1': (2, 1), '1x2': (1, 2)}


def _command(layout, output_dir, steps):
  processes, _ = LAYOUTS[layout]
  train = [
    f'--config_file={CONFIG}',
    f'--output_dir={output_dir}',
    f'--progress_every_n_steps={steps}',
  ] + [
    f'--config={b}'
    for b in L6 + [f'train.steps = {steps}', f'train.eval_frequency = {steps}']
  ]
  if processes > 1:
    return cli() + ['launch', f'--num_processes={processes}', '--'] + train
  return cli() + ['train'] + train


def run_once(layout, work_dir, index, steps):
  """One run; returns its figures (dict) or raises RuntimeError."""
  output_dir = os.path.join(work_dir, f'{index}_{layout}')
  shutil.rmtree(output_dir, ignore_errors=True)
  log = os.path.join(work_dir, f'{index}_{layout}.log')
  started = time.monotonic()
  with open(log, 'w') as f:
    rc = subprocess.call(
      _command(layout, output_dir, steps),
      cwd=_REPO,
      env=cpu_env(LAYOUTS[layout][1]),
      stdout=f,
      stderr=subprocess.STDOUT,
    )
  wall_seconds = time.monotonic() - started
  if rc != 0:
    raise RuntimeError(f'{layout} run {index} exited {rc}; see {log}')
  with open(os.path.join(output_dir, 'run_stats.json')) as f:
    stats = json.load(f)
  later = stats['step_seconds'][1:]
  return {
    'layout': layout,
    'run': index,
    'median_step_seconds': statistics.median(later),
    'first_step_seconds': stats['step_seconds'][0],
    'steps_timed': len(later),
    'wall_seconds': wall_seconds,
    'final_loss': stats['loss'][-1],
  }


def order(rounds):
  """2x1, 1x2, 1x2, 2x1, ...: each layout first in every other round."""
  pairs = [('2x1', '1x2'), ('1x2', '2x1')]
  return [layout for r in range(rounds) for layout in pairs[r % 2]]


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--work_dir', default='/tmp/mp_step_time')
  parser.add_argument('--rounds', type=int, default=3)
  parser.add_argument(
    '--steps',
    type=int,
    default=8,
    help='steps per run; the first compiles and is not timed',
  )
  parser.add_argument('--json', default=None, help='write the summary here')
  args = parser.parse_args()
  if args.rounds < 1 or args.steps < 2:
    parser.error('--rounds must be >= 1 and --steps >= 2')
  os.makedirs(args.work_dir, exist_ok=True)
  runs = []
  for index, layout in enumerate(order(args.rounds)):
    try:
      figures = run_once(layout, args.work_dir, index, args.steps)
    except RuntimeError as e:
      print(f'error: {e}', file=sys.stderr)
      return 1
    runs.append(figures)
    print(
      f'run {index} {layout}: median step '
      f'{figures["median_step_seconds"]:.3f} s over '
      f'{figures["steps_timed"]} steps (first '
      f'{figures["first_step_seconds"]:.1f} s, run '
      f'{figures["wall_seconds"]:.0f} s, loss '
      f'{figures["final_loss"]:.4f})',
      flush=True,
    )
  medians = {
    layout: statistics.median(
      r['median_step_seconds'] for r in runs if r['layout'] == layout
    )
    for layout in LAYOUTS
  }
  summary = {
    'config': 'l6 (tools/bench.py) on reformer_char_lm.gin data',
    'load_average': os.getloadavg(),
    'runs': runs,
    'median_step_seconds': medians,
    'ratio_2x1_over_1x2': medians['2x1'] / medians['1x2'],
  }
  print(json.dumps(summary))
  if args.json:
    with open(args.json, 'w') as f:
      json.dump(summary, f, indent=1)
  return 0


if __name__ == '__main__':
  sys.exit(main())
