"""Trains trax's own reversible configs with stock trax and trax_revplus.

  python tools/trax_configs_smoke.py [--output_dir=DIR] [--steps=N]
      [--config=NAME ...]

For each CPU override in `gin_configs/trax/` (trax 1.4.1's copy and
Terraformer configs, which need no download, shrunk for a CPU; see
docs/compatibility.md), runs `trax-revplus compare`: the config trained with
stock trax, then with trax_revplus, in fresh processes with the same seed.
Prints one line per config: whether each run finished (and stock's error
when it did not), trax_revplus's first and last losses, and, where stock
ran, the largest loss and weight differences between the two.

Exit status 0 when, for every config, trax_revplus trained (its loss over
the last quarter of the steps below that over the first quarter, its
last eval loss below its first) and did not hit stock's step-1 donation
failure ("Attempt to donate the same buffer twice"); 1 otherwise. Expect a
few minutes per config on 2 CPU cores; the suite trains the cheapest one
(tests/gin_configs/test_trax_configs.py).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_DIR = os.path.join(ROOT, 'gin_configs', 'trax')
CONFIGS = ('reformer_copy', 'terraformer_copy', 'terraformer_copy_self_attn',
           'terraformer_purelsh_copy')
DONATION_FAILURE = 'Attempt to donate the same buffer twice'


def _compare(name, output_dir, steps):
  """Runs `trax-revplus compare` on `<name>_cpu.gin`; returns compare.json."""
  config = os.path.join(CONFIG_DIR, f'{name}_cpu.gin')
  run_dir = os.path.join(output_dir, name)
  command = [sys.executable, '-m', 'trax_revplus.cli', 'compare',
             f'--config_file={config}', f'--output_dir={run_dir}']
  if steps is not None:
    command.append(f'--steps={steps}')
  with open(os.path.join(output_dir, f'{name}.out'), 'w') as out:
    subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=False)
  path = os.path.join(run_dir, 'compare.json')
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def _eval_losses(run_dir):
  """Eval losses of a run, from trax's `Step N: eval loss | X` log lines."""
  losses = []
  path = os.path.join(run_dir, 'train.log')
  if os.path.exists(path):
    with open(path, errors='replace') as f:
      for line in f:
        if ': eval ' in line and ' loss |' in line:
          losses.append(float(line.rsplit('|', 1)[1]))
  return losses


def _log_text(run):
  try:
    with open(run['log'], errors='replace') as f:
      return f.read()
  except (OSError, KeyError, TypeError):
    return ''


def _check(name, result):
  """(ok, summary line) for one config's compare.json."""
  if result is None:
    return False, f'{name}: compare wrote no compare.json'
  ours, stock = result['runs']['revplus'], result['runs']['stock']
  problems = []
  if ours['status'] != 'ok':
    problems.append(f"trax_revplus failed: {ours['error']}")
  if DONATION_FAILURE in _log_text(ours):
    problems.append('trax_revplus hit the donation failure')
  losses = ((ours.get('stats') or {}).get('loss')) or []
  evals = _eval_losses(ours['output_dir'])
  quarter = max(1, len(losses) // 4)
  first, last = (float(np.mean(losses[:quarter])),
                 float(np.mean(losses[-quarter:]))) if losses else (None, None)
  if not losses or not last < first:
    problems.append(f'loss did not fall: {losses}')
  if len(evals) < 2 or not evals[-1] < evals[0]:
    problems.append(f'eval loss did not fall: {evals}')
  stock_part = (f"stock ok, max |loss diff| {result['loss_max_abs_diff']}, "
                f"max |weight diff| "
                f"{result['final_weights']['max_abs_diff']}"
                if stock['status'] == 'ok' else
                f"stock failed: {stock['error']}")
  loss_part = (f'trax_revplus loss {first:.3f} -> {last:.3f}, eval '
               f'{evals[0]:.3f} -> {evals[-1]:.3f}'
               if losses and len(evals) >= 2 else 'trax_revplus: no losses')
  line = f'{name}: {loss_part}; {stock_part}'
  if problems:
    line += '; PROBLEMS: ' + '; '.join(problems)
  return not problems, line


def main(argv):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--output_dir', default=None,
                      help='where the compare runs go (default: a new '
                      'temporary directory)')
  parser.add_argument('--steps', type=int, default=None,
                      help="steps per run (default: the configs' 20)")
  parser.add_argument('--config', action='append', choices=CONFIGS,
                      help='a config to run (repeatable; default: all)')
  args = parser.parse_args(argv)
  output_dir = args.output_dir or tempfile.mkdtemp(prefix='trax_configs_')
  os.makedirs(output_dir, exist_ok=True)
  ok = True
  for name in args.config or CONFIGS:
    config_ok, line = _check(name, _compare(name, output_dir, args.steps))
    ok = ok and config_ok
    print(line, flush=True)
  print(f'runs in {output_dir}')
  return 0 if ok else 1


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
