"""Trains trax's own reversible configs with stock trax and trax_revplus.

  python tools/trax_configs_smoke.py [--output_dir=DIR] [--steps=N]
      [--config=NAME ...]

For each CPU override in `gin_configs/trax/` (trax 1.4.1's copy and
Terraformer configs, which need no download, shrunk in size only, trax's
attention settings kept; see docs/compatibility.md), runs

1. `trax-revplus compare`: the config trained with stock trax, then with
   trax_revplus with no settings, in fresh processes with the same seed,
   and both trainers' XLA step peaks (`estimate`); each run with the
   config's own `train.checkpoints_at` (trax's WMT config names steps from
   100000 on), so each must end with its final checkpoint at its last
   step; then trax_revplus's run resumed with the same command, which
   loads that checkpoint (verified) and has no step left to run, and its
   Loop built again in a fresh process, whose model must hold the layers'
   state the checkpoint holds, every array (shape, dtype, values);
2. `trax-revplus train` with trax_revplus under a device memory budget of
   stock's own XLA peak from 1 (the planner's path);
3. `trax-revplus train` with trax_revplus on 2 forced CPU devices.

Prints one line per config: whether each run finished (and stock's error
when it did not), trax_revplus's first and last losses, and, where stock
ran, the largest loss and weight differences between the two; then one line
per further run.

Exit status 0 when, for every config, each trax_revplus run trained (its
loss over the last quarter of the steps below that over the first quarter,
its last eval loss below its first), each run of compare that finished
trained with its own memory-efficient trainer (trax_revplus's, stock
trax's), each run that finished saved its
final checkpoint and trax_revplus's loads, did not hit stock's step-1 donation
failure ("Attempt to donate the same buffer twice"), gave stock's losses
and final weights within `STOCK_ATOL` where stock ran (the plan chosen
with no settings gives stock's results on the same RNGs: batch slices
draw the unsliced dropout masks, attention pairs at a time change only
float32 summation order), and the budget run planned within stock's peak;
1 otherwise. Expect a few minutes per config
on 2 CPU cores; the suite parses each of them
(tests/gin_configs/test_trax_configs.py).
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

from trax_revplus.cli.summary import summary_rows

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_DIR = os.path.join(ROOT, 'gin_configs', 'trax')
BUDGET_SETTING = (
  'trax_revplus.ReversibleSerialTrainer.device_memory_budget_bytes'
)
N_DEVICES = 2
CONFIGS = (
  'reformer_copy',
  'reformer_wmt_ende',
  'terraformer_copy',
  'terraformer_copy_self_attn',
  'terraformer_purelsh_copy',
)
DONATION_FAILURE = 'Attempt to donate the same buffer twice'
# The memory-efficient trainer each run of compare must have trained with.
TRAINERS = {
  'trax_revplus': 'trax_revplus.trainer.ReversibleSerialTrainer',
  'stock': 'trax.optimizers.trainer.ReversibleSerialTrainer',
}
# Largest loss and final weight difference from stock after a config's
# steps: float32 rounding of the same computation in another order stays
# near 1e-5 (reformer_wmt_ende: 2.8e-5 after 20 steps); the shared
# embedding updated from the step's weights instead of stock's order gave
# 0.06 after 12.
STOCK_ATOL = 1e-3


def _compare(name, output_dir, steps):
  """Runs `trax-revplus compare` on `<name>_cpu.gin`; returns compare.json."""
  config = os.path.join(CONFIG_DIR, f'{name}_cpu.gin')
  run_dir = os.path.join(output_dir, name)
  command = [
    sys.executable,
    '-m',
    'trax_revplus.cli',
    'compare',
    f'--config_file={config}',
    f'--output_dir={run_dir}',
  ]
  if steps is not None:
    command.append(f'--steps={steps}')
  with open(os.path.join(output_dir, f'{name}.out'), 'w') as out:
    subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=False)
  path = os.path.join(run_dir, 'compare.json')
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def _train(name, run_dir, bindings, env=None, out_path=None):
  """Runs `trax-revplus train` on `<name>_cpu.gin`; returns its exit status
  and the path of what it printed (`out_path`, else `<run_dir>.out`)."""
  config = os.path.join(CONFIG_DIR, f'{name}_cpu.gin')
  command = [
    sys.executable,
    '-m',
    'trax_revplus.cli',
    'train',
    f'--config_file={config}',
    f'--output_dir={run_dir}',
  ]
  command += [f'--config={b}' for b in bindings]
  out_path = out_path or run_dir + '.out'
  with open(out_path, 'w') as out:
    proc = subprocess.run(
      command, stdout=out, stderr=subprocess.STDOUT, check=False, env=env
    )
  return proc.returncode, out_path


def _losses(run_dir):
  """Training losses of a run (run_stats.json), or []."""
  try:
    with open(os.path.join(run_dir, 'run_stats.json')) as f:
      return json.load(f).get('loss') or []
  except (OSError, ValueError):
    return []


def _trained(losses, evals):
  """Problems with a run's losses: [] where it trained."""
  problems = []
  quarter = max(1, len(losses) // 4)
  if not losses or not np.mean(losses[-quarter:]) < np.mean(losses[:quarter]):
    problems.append(f'loss did not fall: {losses}')
  if len(evals) < 2 or not evals[-1] < evals[0]:
    problems.append(f'eval loss did not fall: {evals}')
  return problems


def _planned_bytes(run_dir):
  """The step's XLA peak device bytes from the run's memory log (the
  planned step's), or None."""
  peaks = []
  path = os.path.join(run_dir, 'memory.jsonl')
  if os.path.exists(path):
    with open(path, errors='replace') as f:
      for line in f:
        try:
          peak = json.loads(line).get('peak_device_bytes')
        except ValueError:
          continue
        if peak is not None:
          peaks.append(peak)
  return max(peaks) if peaks else None


def _check_run(what, run_dir, code, out_path, budget_bytes=None):
  """(ok, summary line) of a further trax_revplus run."""
  losses, evals = _losses(run_dir), _eval_losses(run_dir)
  problems = [] if code == 0 else [f'exit status {code} (see {out_path})']
  problems += _trained(losses, evals)
  with open(out_path, errors='replace') as f:
    if DONATION_FAILURE in f.read():
      problems.append('hit the donation failure')
  line = f'  {what}: '
  if losses and len(evals) >= 2:
    quarter = max(1, len(losses) // 4)
    line += (
      f'loss {np.mean(losses[:quarter]):.3f} -> '
      f'{np.mean(losses[-quarter:]):.3f}, eval {evals[0]:.3f} -> '
      f'{evals[-1]:.3f}'
    )
  if budget_bytes is not None:
    planned = _planned_bytes(run_dir)
    line += f'; planned peak {planned} bytes <= budget {budget_bytes}'
    if planned is None or planned > budget_bytes:
      problems.append(f'no plan within the budget: {planned}')
  if problems:
    line += '; PROBLEMS: ' + '; '.join(problems)
  return not problems, line


def _further_runs(name, output_dir, result):
  """Under stock's own peak, and on N_DEVICES devices: [(ok, line)]."""
  out = []
  stock = (
    ((result or {}).get('device_accounting') or {}).get('trainers') or {}
  ).get('stock') or {}
  budget = stock.get('peak_device_bytes')
  if budget is None:
    out.append(
      (
        False,
        f"  budget of stock's peak: no stock peak in "
        f'compare.json ({stock.get("error")})',
      )
    )
  else:
    run_dir = os.path.join(output_dir, name, 'revplus_stock_budget')
    code, out_path = _train(name, run_dir, [f'{BUDGET_SETTING} = {budget}'])
    out.append(
      _check_run(
        f"budget of stock's peak ({budget} bytes)",
        run_dir,
        code,
        out_path,
        budget_bytes=budget,
      )
    )
  env = dict(
    os.environ,
    JAX_PLATFORMS='cpu',
    XLA_FLAGS=(
      os.environ.get('XLA_FLAGS', '')
      + f' --xla_force_host_platform_device_count={N_DEVICES}'
    ),
  )
  run_dir = os.path.join(output_dir, name, f'revplus_{N_DEVICES}_devices')
  code, out_path = _train(name, run_dir, [], env=env)
  out.append(_check_run(f'{N_DEVICES} devices', run_dir, code, out_path))
  return out


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


def _final_checkpoint_problems(what, text):
  """[] where a run's summary names its checkpoint at its last step."""
  rows = summary_rows(text)
  last = re.match(r'(\d+) ', rows.get('steps', ''))
  saved = re.match(r'\S+ \(step (\d+)', rows.get('checkpoint', ''))
  if not (last and saved and saved.group(1) == last.group(1)):
    return [
      f"{what}'s final checkpoint is not at its last step: "
      f'steps {rows.get("steps")!r}, checkpoint '
      f'{rows.get("checkpoint")!r}'
    ]
  return []


def _resume_problems(name, result):
  """Resumes trax_revplus's run of compare with the command it ran: []
  where its final checkpoint loads and no step is left to run."""
  bindings = list(result['bindings'])
  if result['steps'] is not None:
    bindings.append(f'train.steps = {result["steps"]}')
  if not result['seed_from_config']:
    bindings.append(f'train.random_seed = {result["seed"]}')
  run_dir = result['runs']['revplus']['output_dir']
  code, out_path = _train(
    name, run_dir, bindings, out_path=run_dir + '.resumed.out'
  )
  with open(out_path, errors='replace') as f:
    rows = summary_rows(f.read())
  if code != 0 or 'nothing new to save' not in rows.get('checkpoint', ''):
    return [
      f'its final checkpoint did not load (exit status {code}, '
      f'checkpoint {rows.get("checkpoint")!r}; see {out_path})'
    ]
  return []


# Run in a fresh process by `_state_problems`: builds the config's Loop on a
# run's output dir (trax's `train` with no step left: it loads the final
# checkpoint) and compares the model's state, leaf by leaf, with the
# checkpoint's.
_STATE_CHECK = """
import json, sys
import numpy as np
from trax import fastmath
from trax.supervised import trainer_lib, training
from trax_revplus import cli
config, run_dir, bindings = json.loads(sys.argv[1])
cli.parse_configs([config], bindings)
saved = training.unpickle_from_file(run_dir + '/model.pkl.gz', gzip=True)
loop = trainer_lib.train(run_dir, steps=saved['step'])
loaded = fastmath.tree_flatten(loop.model.state)
problems = []
if len(loaded) != len(saved['flat_state']):
  n_saved = len(saved['flat_state'])
  problems.append(f'{len(loaded)} state arrays, {n_saved} saved')
for k, (x, y) in enumerate(zip(loaded, saved['flat_state'])):
  x, y = np.asarray(x), np.asarray(y)
  if x.shape != y.shape or x.dtype != y.dtype or not np.array_equal(x, y):
    problems.append(f'state array {k}: {x.dtype}{list(x.shape)} loaded, '
                    f'{y.dtype}{list(y.shape)} saved, equal values: '
                    f'{x.shape == y.shape and np.array_equal(x, y)}')
print(json.dumps({'state_arrays': len(loaded), 'problems': problems}))
"""


def _state_problems(name, result):
  """[] where trax_revplus's run of compare, resumed, has the layers'
  state its final checkpoint holds, every leaf (shape, dtype and values)."""
  bindings = list(result['bindings'])
  if not result['seed_from_config']:
    bindings.append(f'train.random_seed = {result["seed"]}')
  run_dir = result['runs']['revplus']['output_dir']
  config = os.path.join(CONFIG_DIR, f'{name}_cpu.gin')
  proc = subprocess.run(
    [
      sys.executable,
      '-c',
      _STATE_CHECK,
      json.dumps([config, run_dir, bindings]),
    ],
    capture_output=True,
    text=True,
    check=False,
  )
  lines = proc.stdout.strip().splitlines()
  try:
    found = json.loads(lines[-1])
  except (IndexError, ValueError):
    return [f'the state check failed: {proc.stderr[-1500:]}']
  if not found['state_arrays']:
    return ['the state check found no state arrays']
  return [f'resumed state: {p}' for p in found['problems']]


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
    problems.append(f'trax_revplus failed: {ours["error"]}')
  if DONATION_FAILURE in _log_text(ours):
    problems.append('trax_revplus hit the donation failure')
  losses = ((ours.get('stats') or {}).get('loss')) or []
  evals = _eval_losses(ours['output_dir'])
  quarter = max(1, len(losses) // 4)
  first, last = (
    (float(np.mean(losses[:quarter])), float(np.mean(losses[-quarter:])))
    if losses
    else (None, None)
  )
  if not losses or not last < first:
    problems.append(f'loss did not fall: {losses}')
  if len(evals) < 2 or not evals[-1] < evals[0]:
    problems.append(f'eval loss did not fall: {evals}')
  for what, run in (('trax_revplus', ours), ('stock', stock)):
    if run['status'] == 'ok':
      problems += _final_checkpoint_problems(what, _log_text(run))
      if run.get('trainer') != TRAINERS[what]:
        problems.append(f'{what} trained with {run.get("trainer")}')
  if ours['status'] == 'ok':
    problems += _resume_problems(name, result)
    problems += _state_problems(name, result)
  if stock['status'] == 'ok':
    for what, diff in (
      ('losses', result['loss_max_abs_diff']),
      ('final weights', result['final_weights']['max_abs_diff']),
    ):
      if diff is None or not diff <= STOCK_ATOL:
        problems.append(
          f"{what} differ from stock's by {diff} (> {STOCK_ATOL})"
        )
  stock_part = (
    f'stock ok, max |loss diff| {result["loss_max_abs_diff"]}, '
    f'max |weight diff| '
    f'{result["final_weights"]["max_abs_diff"]}'
    if stock['status'] == 'ok'
    else f'stock failed: {stock["error"]}'
  )
  loss_part = (
    f'trax_revplus loss {first:.3f} -> {last:.3f}, eval '
    f'{evals[0]:.3f} -> {evals[-1]:.3f}'
    if losses and len(evals) >= 2
    else 'trax_revplus: no losses'
  )
  line = f'{name}: {loss_part}; {stock_part}'
  if problems:
    line += '; PROBLEMS: ' + '; '.join(problems)
  return not problems, line


def main(argv):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument(
    '--output_dir',
    default=None,
    help='where the compare runs go (default: a new temporary directory)',
  )
  parser.add_argument(
    '--steps',
    type=int,
    default=None,
    help="steps per run (default: the configs' 20)",
  )
  parser.add_argument(
    '--config',
    action='append',
    choices=CONFIGS,
    help='a config to run (repeatable; default: all)',
  )
  args = parser.parse_args(argv)
  output_dir = args.output_dir or tempfile.mkdtemp(prefix='trax_configs_')
  os.makedirs(output_dir, exist_ok=True)
  ok = True
  for name in args.config or CONFIGS:
    result = _compare(name, output_dir, args.steps)
    config_ok, line = _check(name, result)
    ok = ok and config_ok
    print(line, flush=True)
    for run_ok, line in _further_runs(name, output_dir, result):
      ok = ok and run_ok
      print(line, flush=True)
  print(f'runs in {output_dir}')
  return 0 if ok else 1


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
