"""What planning costs, measured by the planner itself: one command, one table.

Every measurement runs in a process of its own, one after another (a TPU
chip belongs to one process; this process opens no JAX backend), with no
compilation cache, and reads the planner's own figures
(`ReversibleSerialTrainer.planning_costs`: seconds from the start of
planning to the plan chosen, programs compiled, seconds tracing and
compiling the chosen plan's own programs). Parts:

  bench     each of the benchmark's configs (`tools/bench`), and 'l12',
            'lm12' four times as deep ('l48', 'lm48'): ours built as the
            benchmark builds it, its first step planned under the device's
            own budget.
  configs   the main job and trax's configs shrunk to CPU size
            (gin_configs/trax/*_cpu.gin): `trax-revplus estimate --json`,
            then `trax-revplus train` of 20 steps with its evals, each
            timed from start to exit.
  enwik8    trax's enwik8 Reformer at 8 x 65536 (gin_configs/
            reformer_enwik8_full.gin): `estimate --device_memory=16GiB`
            (a TPU v5e's memory: the CPU's accounting of the chip's search).

The targets (`TARGETS`) sit in the table beside the figures: the search's
overhead (`search_seconds`, planning beyond tracing and compiling the
chosen plan's programs) at most half of those; 48 layers planning in at
most 1.3 times 12's; `estimate` quicker than a 20-step `train`.

Usage:
  python tools/planning_cost.py --out_dir=DIR [--parts=bench,configs,enwik8]
  python tools/planning_cost.py --out_dir=DIR --render
"""

import argparse
import glob
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

PARTS = ('bench', 'configs', 'enwik8')
BENCH_CONFIGS = ('char', 'l6', 'l24', 'l64', 'ende', 'l12', 'l48')
# On an accelerator, the benchmark's chip sizes.
CHIP_BENCH_CONFIGS = ('char', 'l6', 'ende', 'lm12', 'lm48')
MAIN = os.path.join(REPO, 'gin_configs', 'reformer_char_lm.gin')
ENWIK8 = os.path.join(REPO, 'gin_configs', 'reformer_enwik8_full.gin')
TRAX_CONFIGS = sorted(
  glob.glob(os.path.join(REPO, 'gin_configs', 'trax', '*_cpu.gin'))
)
TARGETS = {
  'search_over_plan': 0.5,  # search_seconds / plan_compile_seconds
  'depth': 1.3,  # planning seconds, 48 layers / 12 layers
}
_DEPTHS = (('l12', 'l48'), ('lm12', 'lm48'))


def _cli(*args):
  return [sys.executable, '-m', 'trax_revplus.cli', *args]


def _run(argv, log, timeout):
  """Runs `argv`, its output to `log`: (exit status, wall seconds)."""
  start = time.monotonic()
  with open(log, 'w') as f:
    f.write(' '.join(argv) + '\n')
    f.flush()
    try:
      code = subprocess.run(
        argv,
        stdout=f,
        stderr=subprocess.STDOUT,
        cwd=REPO,
        timeout=timeout,
        check=False,
      ).returncode
    except subprocess.TimeoutExpired:
      code = 'timeout'
  seconds = round(time.monotonic() - start, 1)
  print(f'{os.path.basename(log)}: exit {code}, {seconds} s', flush=True)
  return code, seconds


def child(name):
  """In a fresh process: ours on the benchmark's config `name`, its first
  step planned; prints the planning's cost as JSON."""
  from tools.bench import configs  # pylint: disable=g-import-not-at-top
  from tools.bench import model  # pylint: disable=g-import-not-at-top

  cfg = configs.config(name)
  trainer, _, _ = model.build('ours', cfg)
  start = time.monotonic()
  plan = trainer.planned(configs.batch(cfg)).plan
  seconds = time.monotonic() - start
  print(
    json.dumps(
      {
        'planned_seconds': round(seconds, 2),
        'plan': plan.describe(),
        'costs': [c.to_json() for c in trainer.planning_costs],
      }
    )
  )


def bench(folder, timeout, chip):
  out = {}
  for name in CHIP_BENCH_CONFIGS if chip else BENCH_CONFIGS:
    log = os.path.join(folder, f'{name}.log')
    code, seconds = _run(
      [sys.executable, os.path.abspath(__file__), f'--child={name}'],
      log,
      timeout,
    )
    found = {'exit': code, 'seconds': seconds}
    with open(log) as f:
      for line in f:
        if line.startswith('{"planned_seconds"'):
          found.update(json.loads(line))
    out[name] = found
  return out


def _estimate_planning(json_path):
  if not os.path.exists(json_path):
    return None
  with open(json_path) as f:
    data = json.load(f)
  revplus = data.get('trainers', {}).get('revplus', {})
  return revplus.get('planning')


def configs(folder, timeout):
  out = {}
  for config in [MAIN] + TRAX_CONFIGS:
    name = os.path.basename(config)[: -len('.gin')]
    bindings = ['--config=train.steps = 20'] if config == MAIN else []
    json_path = os.path.join(folder, f'{name}.estimate.json')
    estimate = _run(
      _cli(
        'estimate',
        f'--config_file={config}',
        f'--json={json_path}',
        '--nocompilation_cache',
        *bindings,
      ),
      os.path.join(folder, f'{name}.estimate.log'),
      timeout,
    )
    run_dir = os.path.join(folder, f'{name}.run')
    train = _run(
      _cli(
        'train',
        f'--config_file={config}',
        f'--output_dir={run_dir}',
        '--nocompilation_cache',
        *bindings,
      ),
      os.path.join(folder, f'{name}.train.log'),
      timeout,
    )
    planning = None
    stats = os.path.join(run_dir, 'run_stats.json')
    if os.path.exists(stats):
      with open(stats) as f:
        planning = (json.load(f).get('planning') or [None])[0]
    out[name] = {
      'estimate_exit': estimate[0],
      'estimate_seconds': estimate[1],
      'estimate_planning': _estimate_planning(json_path),
      'train_exit': train[0],
      'train_seconds': train[1],
      'train_planning': planning,
    }
  return out


def enwik8(folder, timeout):
  json_path = os.path.join(folder, 'estimate.json')
  code, seconds = _run(
    _cli(
      'estimate',
      f'--config_file={ENWIK8}',
      '--config=local_text_inputs.paths = None',
      '--device_memory=16GiB',
      f'--json={json_path}',
      '--nocompilation_cache',
    ),
    os.path.join(folder, 'estimate.log'),
    timeout,
  )
  return {
    'exit': code,
    'seconds': seconds,
    'planning': _estimate_planning(json_path),
  }


def _ratio(cost):
  if not cost or not cost.get('plan_compile_seconds'):
    return None
  return cost['search_seconds'] / cost['plan_compile_seconds']


def _row(name, cost, extra=''):
  if not cost:
    return f'| {name} | - | - | - | - | - | {extra} |'
  ratio = _ratio(cost)
  mark = (
    ''
    if ratio is None
    else (' (met)' if ratio <= TARGETS['search_over_plan'] else ' (missed)')
  )
  return (
    f'| {name} | {cost["seconds"]:.1f} | {cost["plan_compile_seconds"]:.1f} |'
    f' {cost["search_seconds"]:.1f} | {ratio:.2f}{mark} |'
    f' {cost["programs_compiled"]} / {cost["plan_programs"]} | {extra} |'
  )


def render(out_dir):
  """The Markdown tables of the parts measured in `out_dir`."""
  parts = {}
  for part in PARTS:
    path = os.path.join(out_dir, f'{part}.json')
    if os.path.exists(path):
      with open(path) as f:
        parts[part] = json.load(f)
  lines = [
    "| config | planning s | chosen plan's tracing and compiling s | "
    'search s | search / plan (target <= 0.5) | programs compiled / the '
    "plan's | plan |",
    '|---|---|---|---|---|---|---|',
  ]
  for name, found in parts.get('bench', {}).items():
    cost = (found.get('costs') or [None])[0]
    lines.append(_row(f'bench {name}', cost, (cost or {}).get('plan', '')))
  for name, found in parts.get('configs', {}).items():
    cost = found.get('train_planning') or found.get('estimate_planning')
    lines.append(_row(name, cost, (cost or {}).get('plan', '')))
  if 'enwik8' in parts:
    cost = parts['enwik8'].get('planning')
    lines.append(
      _row('enwik8 8 x 65536, 16 GiB', cost, (cost or {}).get('plan', ''))
    )
  bench_found = parts.get('bench', {})
  depth_lines = []
  for shallow, deep in _DEPTHS:
    a = (bench_found.get(shallow, {}).get('costs') or [None])[0]
    b = (bench_found.get(deep, {}).get('costs') or [None])[0]
    if a and b:
      ratio = b['seconds'] / a['seconds']
      mark = 'met' if ratio <= TARGETS['depth'] else 'missed'
      depth_lines.append(
        f'| {deep} / {shallow} | {b["seconds"]:.1f} / {a["seconds"]:.1f} s |'
        f' {ratio:.2f} ({mark}, target <= {TARGETS["depth"]}) |'
      )
  if depth_lines:
    lines += ['', '| depth | planning | ratio |', '|---|---|---|']
    lines += depth_lines
  config_found = parts.get('configs', {})
  if config_found:
    lines += [
      '',
      '| config | estimate s | 20-step train s | estimate < train |',
      '|---|---|---|---|',
    ]
    for name, found in config_found.items():
      e, t = found.get('estimate_seconds'), found.get('train_seconds')
      met = None if not (e and t) else ('met' if e < t else 'missed')
      lines.append(f'| {name} | {e} | {t} | {met} |')
  return '\n'.join(lines) + '\n'


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--parts', default=','.join(PARTS))
  parser.add_argument('--out_dir')
  parser.add_argument('--timeout_seconds', type=float, default=1200)
  parser.add_argument(
    '--chip',
    action='store_true',
    help="the benchmark's chip sizes (lm12, lm48) instead of the CPU's",
  )
  parser.add_argument('--render', action='store_true')
  parser.add_argument('--child', help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    child(args.child)
    return
  if not args.out_dir:
    parser.error('--out_dir is required')
  os.makedirs(args.out_dir, exist_ok=True)
  if not args.render:
    functions = {
      'bench': lambda folder: bench(folder, args.timeout_seconds, args.chip),
      'configs': lambda folder: configs(folder, args.timeout_seconds),
      'enwik8': lambda folder: enwik8(folder, args.timeout_seconds),
    }
    for part in args.parts.split(','):
      if part not in functions:
        parser.error(f'--parts: unknown part {part!r}; one of {PARTS}')
      folder = os.path.join(args.out_dir, part)
      os.makedirs(folder, exist_ok=True)
      figures = functions[part](folder)
      with open(os.path.join(args.out_dir, f'{part}.json'), 'w') as f:
        json.dump(figures, f, indent=1, default=str)
  table = render(args.out_dir)
  with open(os.path.join(args.out_dir, 'planning.md'), 'w') as f:
    f.write(table)
  print(table)


if __name__ == '__main__':
  main()
