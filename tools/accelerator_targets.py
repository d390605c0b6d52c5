"""The accelerator's targets, measured: one command, one table.

Runs, one process after another (a TPU chip belongs to one process; this
process opens no JAX backend), the measurements behind the accelerator
table of docs/performance.md, and writes each part's figures to
`<out_dir>/<part>.json` and the table to `<out_dir>/accelerator.md`:

  enwik8       trax's enwik8 Reformer (gin_configs/reformer_enwik8_full.gin,
               batch 8 x 65536) trained by trax_revplus with no settings,
               20 steps and its evals: the plan, its accounted device and
               host peaks against the chip's peak (`memory_stats()`) and
               the host's (RSS above the RSS when the trainer was made),
               steps/s.
  enwik8_more  the same at the sizes trax's file says need more memory
               (attn_kv = 128, d_ff = 4096).
  others       the same config with stock trax and with trax's default
               Trainer, 2 steps each: how each ends (one line), and what
               `estimate` says of all three.
  compare      `trax-revplus compare` on the main job, 300 steps: both
               runs' losses and eval.
  bench        tools/bench.py on l6, char, ende and lm12, each trainer in a
               process of its own (sequential on an accelerator), with each
               one's chip peak.
  floor        tools/step_floor.py on lm12: the model's own forward and
               gradient program.
  first_step   the first step of trax_revplus and of stock on lm12 through
               `train` without a compilation cache, then trax_revplus's
               again from a warm cache.
  arithmetic   each step against the chip's own arithmetic: lm12 (100
               steps with trax_revplus, 20 with stock's trainer as the
               baseline), and enwik8 with no settings (6 steps), each with
               `train --step_floor --profile`: the median step, its floor
               (`trax_revplus.step_floor`) as configured, at the plan's
               attention pairs at once and at each attention kind's
               fastest setting timed, the step's ratio to each, the
               TFLOP/s, the transfer wait in the profile
               (tools/profile_summary.py), and each layer kind's share of
               the floor with its TFLOP/s (an attention kind's also at
               its fastest setting).

Each part's commands and their output stay in `<out_dir>/<part>/`; a part
can be run alone (`--parts=enwik8`), and `--render` rebuilds the table from
the JSON files present (e.g. parts measured by separate commands).

Usage:
  python tools/accelerator_targets.py --parts=enwik8,others --out_dir=DIR
  python tools/accelerator_targets.py --parts=arithmetic \
      --runs=lm12_ours,lm12_stock --out_dir=DIR
  python tools/accelerator_targets.py --render --out_dir=DIR
"""

import argparse
import json
import os
import shlex
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
ENWIK8 = os.path.join(REPO, 'gin_configs', 'reformer_enwik8_full.gin')
MAIN = os.path.join(REPO, 'gin_configs', 'reformer_char_lm.gin')
# enwik8's config reads a local copy of enwik8: the standard library's
# sources stand in for it (the same byte-level task; no download).
ENWIK8_DATA = ['local_text_inputs.paths = None']
ENWIK8_RUN = [
  'train.steps = 20',
  'train.eval_frequency = 20',
  'train.eval_steps = 1',
  'train.checkpoints_at = [20]',
]
ENWIK8_MORE = ['attn_kv = 128', 'ReformerLM.d_ff = 4096']
# The benchmark's lm12 as a `train` config: the main job's model at its
# sizes.
LM12 = [
  'ReformerLM.n_layers = 12',
  'ReformerLM.d_model = 512',
  'ReformerLM.d_ff = 2048',
  'sequence_length = 2048',
  'local_text_inputs.batch_size = 8',
  'train.steps = 2',
  'train.eval_frequency = 1000',
]
PARTS = (
  'arithmetic',
  'enwik8',
  'enwik8_more',
  'others',
  'compare',
  'bench',
  'floor',
  'first_step',
)


def _cli(*args):
  return [sys.executable, '-m', 'trax_revplus.cli', *args]


def _bindings(bindings):
  return [f'--config={b}' for b in bindings]


def _run(name, argv, folder, timeout_seconds):
  """Runs `argv`, its output to `<folder>/<name>.log`, each line after the
  seconds since the start; the exit status, seconds, the seconds at which
  the first step's progress line came (`step 1/...`: what a user waits for
  the first step) and the last lines."""
  os.makedirs(folder, exist_ok=True)
  log = os.path.join(folder, f'{name}.log')
  start = time.time()
  first_step = None
  lines = []
  with open(log, 'w') as f:
    f.write(shlex.join(argv) + '\n')
    f.flush()
    process = subprocess.Popen(
      argv,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      cwd=REPO,
      text=True,
      errors='replace',
    )
    timer = threading.Timer(timeout_seconds, process.kill)
    timer.start()
    try:
      for line in process.stdout:
        seconds = time.time() - start
        if first_step is None and line.startswith('step 1/'):
          first_step = round(seconds, 1)
        f.write(f'[{seconds:7.1f}] {line}')
        f.flush()
        if line.strip():
          lines.append(line.rstrip())
          del lines[:-3]
      code = process.wait()
    finally:
      timed_out = not timer.is_alive() and process.returncode not in (0, None)
      timer.cancel()
  if timed_out:
    code = 'timeout'
  print(f'{name}: exit {code}, {time.time() - start:.0f} s', flush=True)
  return {
    'command': shlex.join(argv),
    'exit': code,
    'seconds': round(time.time() - start, 1),
    'first_step_seconds_from_start': first_step,
    'tail': lines[-3:],
  }


def _records(run_dir):
  path = os.path.join(run_dir, 'memory.jsonl')
  if not os.path.exists(path):
    return []
  out = []
  with open(path) as f:
    for line in f:
      try:
        out.append(json.loads(line))
      except ValueError:
        continue
  return out


def _run_stats(run_dir):
  path = os.path.join(run_dir, 'run_stats.json')
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return json.load(f)


def _train_figures(run_dir):
  """What a run of ours measured and accounted: device and host peaks,
  the plan line, eval losses, steps/s."""
  records = _records(run_dir)
  steps = [r for r in records if r.get('phase') == 'step']
  out = {}
  if steps:
    out['chip_peak_bytes'] = max(
      r.get('device_peak_bytes') or 0 for r in records
    )
    out['accounted_peak_device_bytes'] = next(
      (
        r['peak_device_bytes']
        for r in reversed(records)
        if r.get('peak_device_bytes')
      ),
      None,
    )
    out['accounted_peak_host_bytes'] = next(
      (
        r['peak_host_bytes']
        for r in reversed(steps)
        if r.get('peak_host_bytes') is not None
      ),
      None,
    )
    opened = next(
      (
        r['host_rss_backend_open_bytes']
        for r in steps
        if r.get('host_rss_backend_open_bytes')
      ),
      None,
    )
    host = max(r.get('host_peak_bytes') or 0 for r in steps)
    out['host_peak_in_steps_bytes'] = host
    out['host_rss_backend_open_bytes'] = opened
    if opened:
      out['host_peak_above_open_bytes'] = host - opened
  log = os.path.join(run_dir, 'train.log')
  if os.path.exists(log):
    with open(log, errors='replace') as f:
      text = f.read()
    for key, marker in (
      ('plan', '] device memory plan'),
      ('eval_plan', 'eval device memory plan'),
    ):
      found = [
        line.split(marker, 1)[1] for line in text.splitlines() if marker in line
      ]
      if found:
        out[key] = found[-1].strip(' :')[:600]
  stats = _run_stats(run_dir)
  for key in (
    'steps_per_second_without_compiling',
    'eval_losses',
    'first_step_seconds',
    'programs_from_cache',
    'planning',
  ):
    if key in stats:
      out[key] = stats[key]
  return out


# Bindings added to every enwik8 command (`--bindings`: a smaller model,
# to try the tool on a CPU).
_EXTRA = []
# The arithmetic part's runs to make (`--runs`; empty: all).
_RUNS = []


def enwik8(folder, timeout, more=False):
  run_dir = os.path.join(folder, 'run')
  bindings = ENWIK8_DATA + ENWIK8_RUN + (ENWIK8_MORE if more else []) + _EXTRA
  result = _run(
    'train',
    _cli(
      'train',
      f'--config_file={ENWIK8}',
      f'--output_dir={run_dir}',
      '--progress_every_n_steps=1',
      *_bindings(bindings),
    ),
    folder,
    timeout,
  )
  return {'train': result, **_train_figures(run_dir)}


def others(folder, timeout):
  out = {}
  for name, extra in (
    ('stock', ['--implementation=stock']),
    ('default', ['--config=train.use_memory_efficient_trainer = False']),
  ):
    out[name] = _run(
      name,
      _cli(
        'train',
        f'--config_file={ENWIK8}',
        f'--output_dir={os.path.join(folder, name)}',
        *extra,
        *_bindings(
          ENWIK8_DATA
          + [
            'train.steps = 2',
            'train.eval_frequency = 1000',
            'train.checkpoints_at = [2]',
          ]
          + _EXTRA
        ),
      ),
      folder,
      timeout,
    )
  json_path = os.path.join(folder, 'estimate.json')
  out['estimate'] = _run(
    'estimate',
    _cli(
      'estimate',
      f'--config_file={ENWIK8}',
      f'--json={json_path}',
      *_bindings(ENWIK8_DATA + _EXTRA),
    ),
    folder,
    timeout,
  )
  if os.path.exists(json_path):
    with open(json_path) as f:
      trainers = json.load(f).get('trainers', {})
    out['estimated'] = {
      name: {
        k: t.get(k)
        for k in (
          'peak_device_bytes',
          'peak_host_bytes',
          'fits',
          'refused',
          'error',
          'plan_line',
          'least_device_bytes',
        )
      }
      for name, t in trainers.items()
    }
  return out


def compare(folder, timeout):
  out_dir = os.path.join(folder, 'compare')
  result = _run(
    'compare',
    _cli(
      'compare',
      f'--config_file={MAIN}',
      '--steps=300',
      f'--output_dir={out_dir}',
      '--step_floor',
      '--nodevice_accounting',
    ),
    folder,
    timeout,
  )
  path = os.path.join(out_dir, 'compare.json')
  summary = {}
  if os.path.exists(path):
    with open(path) as f:
      data = json.load(f)
    for side in ('stock', 'revplus'):
      run = data.get(side) or data.get('runs', {}).get(side) or {}
      summary[side] = {
        k: run.get(k)
        for k in (
          'eval_losses',
          'final_train_loss',
          'median_step_seconds',
          'first_step_seconds',
          'status',
        )
        if k in run
      }
  return {'compare': result, 'sides': summary}


def bench(folder, timeout):
  out_dir = os.path.join(folder, 'bench')
  result = _run(
    'bench',
    [
      sys.executable,
      os.path.join(REPO, 'tools', 'bench.py'),
      '--configs=l6,char,ende,lm12',
      '--trainers=default,stock,ours',
      '--nomemory',
      '--steps=5',
      f'--out_dir={out_dir}',
    ],
    folder,
    timeout,
  )
  path = os.path.join(out_dir, 'bench.json')
  data = {}
  if os.path.exists(path):
    with open(path) as f:
      data = json.load(f)
  return {'bench': result, 'results': data}


def floor(folder, timeout):
  return {
    'floor': _run(
      'floor',
      [
        sys.executable,
        os.path.join(REPO, 'tools', 'step_floor.py'),
        '--configs=lm12',
        '--repeats=5',
      ],
      folder,
      timeout,
    )
  }


def first_step(folder, timeout):
  out = {}
  cache = os.path.join(folder, 'cache')
  runs = (
    ('stock', ['--implementation=stock', '--nocompilation_cache']),
    ('ours_cold', ['--nocompilation_cache']),
    ('ours_fill', [f'--compilation_cache_dir={cache}']),
    ('ours_warm', [f'--compilation_cache_dir={cache}']),
  )
  for name, extra in runs:
    run_dir = os.path.join(folder, name)
    out[name] = _run(
      name,
      _cli(
        'train',
        f'--config_file={MAIN}',
        f'--output_dir={run_dir}',
        *extra,
        *_bindings(LM12),
      ),
      folder,
      timeout,
    )
    out[name]['first_step_seconds'] = first_step_seconds(run_dir)
  return out


def first_step_seconds(run_dir):
  """The first step's seconds as the run's run_stats.json writes them
  (`first_step_seconds`: its compiling included), or None."""
  return _run_stats(run_dir).get('first_step_seconds')


# The steps each model's arithmetic part runs, and the steps it profiles
# (after the first, which compiles). Ours' first steps on lm12 run on the
# plan ready first while its one program compiles (about 40 of them on
# one TPU v5e chip): its median step and profile are of later steps.
ARITHMETIC_RUNS = (
  ('lm12_ours', MAIN, LM12 + ['train.steps = 100'], [], '90-91'),
  (
    'lm12_stock',
    MAIN,
    LM12 + ['train.steps = 20'],
    ['--implementation=stock'],
    '10-11',
  ),
  (
    'enwik8_ours',
    ENWIK8,
    ENWIK8_DATA
    + [
      'train.steps = 6',
      'train.eval_frequency = 1000',
      'train.checkpoints_at = [6]',
    ],
    [],
    '4-5',
  ),
)


def _over(median, floor_seconds):
  """The median step over a floor, None where either is missing."""
  return median / floor_seconds if median and floor_seconds else None


def arithmetic(folder, timeout):
  # pylint: disable=g-import-not-at-top
  from tools import profile_summary

  out = {}
  for name, config, bindings, extra, profile in ARITHMETIC_RUNS:
    if _RUNS and name not in _RUNS:
      continue
    run_dir = os.path.join(folder, name)
    result = _run(
      name,
      _cli(
        'train',
        f'--config_file={config}',
        f'--output_dir={run_dir}',
        '--progress_every_n_steps=1',
        '--step_floor',
        f'--profile={profile}',
        *extra,
        *_bindings(bindings + _EXTRA),
      ),
      folder,
      timeout,
    )
    stats = _run_stats(run_dir)
    floor_figures = stats.get('step_floor') or {}
    try:
      traced = profile_summary.summarize(run_dir)
      traced.pop('top_events_seconds')
    except (OSError, ValueError, KeyError) as e:
      traced = {'error': str(e)}
    median = stats.get('median_step_seconds')
    out[name] = {
      'train': result,
      'median_step_seconds': median,
      'step_floor': {k: v for k, v in floor_figures.items() if k != 'kinds'},
      'kinds': floor_figures.get('kinds'),
      'over_floor': _over(median, floor_figures.get('step_floor_seconds')),
      'over_configured_floor': _over(
        median, floor_figures.get('configured_step_floor_seconds')
      ),
      'over_best_floor': _over(
        median, floor_figures.get('best_step_floor_seconds')
      ),
      'tflops_per_second': floor_figures['flops_per_step'] / median / 1e12
      if median and floor_figures
      else None,
      'profile': traced,
      'planning': stats.get('planning'),
    }
  return out


_PART_FUNCTIONS = {
  'arithmetic': arithmetic,
  'enwik8': enwik8,
  'enwik8_more': lambda folder, timeout: enwik8(folder, timeout, True),
  'others': others,
  'compare': compare,
  'bench': bench,
  'floor': floor,
  'first_step': first_step,
}


def _fixed(value, unit=''):
  return '-' if value is None else f'{value:.3g}{unit}'


def _gib(nbytes):
  return '-' if not nbytes else f'{nbytes / 2**30:.2f} GiB'


def _shares(shares):
  """Each layer kind's share of the floor and its rate, largest first
  (run_stats.json's `step_floor.shares`), an attention kind's also at its
  fastest setting timed, as one cell."""
  if not shares:
    return '-'
  return '; '.join(
    f'{s["name"]} x {s["count"]}: {s["share_of_floor"]:.0%}, '
    f'{s["tflops_per_second"]:.3g}'
    + (
      f' (best {_fixed(s.get("best_tflops_per_second"))} at '
      f'{_heads(s.get("best_parallel_heads"))})'
      if s.get('attention')
      else ''
    )
    for s in shares
  )


def _heads(n):
  """Attention pairs at once in a cell: 'as configured' for None, by kind
  'SelfAttention 8' for a plan's [[kind, n], ...]."""
  if n is None:
    return 'as configured'
  if isinstance(n, (list, tuple)):
    return ', '.join(f'{kind} {k}' for kind, k in n)
  return str(n)


def _arithmetic_row(name, run):
  """One model's row of the arithmetic table. A run measured before the
  floor timed attention settings has '-' as configured and at the best."""
  floor = run.get('step_floor') or {}
  median = run.get('median_step_seconds')
  wait = (run.get('profile') or {}).get('transfer_wait_fraction')
  floors = [
    floor.get(key)
    for key in (
      'configured_step_floor_seconds',
      'step_floor_seconds',
      'best_step_floor_seconds',
    )
  ]
  over = [_over(median, seconds) for seconds in floors]
  if over[1] is None:
    over[1] = run.get('over_floor')
  return (
    f'| {name} | {_fixed(median, " s")} | {_fixed(floors[0], " s")} | '
    f'{_fixed(floors[1], " s")} ({_heads(floor.get("parallel_heads"))}) | '
    f'{_fixed(floors[2], " s")} | '
    + ' / '.join(_fixed(r) for r in over)
    + f' | {_fixed(run.get("tflops_per_second"))} | '
    + ('-' if wait is None else f'{wait:.1%}')
    + f' | {_shares(floor.get("shares"))} |'
  )


def render(out_dir):
  """The Markdown table of the parts measured in `out_dir`."""
  parts = {}
  for part in PARTS:
    path = os.path.join(out_dir, f'{part}.json')
    if os.path.exists(path):
      with open(path) as f:
        parts[part] = json.load(f)
  lines = []
  if 'arithmetic' in parts:
    lines += [
      '| model, trainer | median step | floor as configured | floor at the '
      "plan's setting (attention pairs at once) | floor at the best setting "
      "| step / floor: configured / plan's / best | TFLOP/s | transfer wait "
      '| layer kinds: share of the floor, TFLOP/s (attention: best, at pairs '
      'at once) |',
      '|---|---|---|---|---|---|---|---|---|',
    ]
    for name, run in parts['arithmetic'].items():
      lines.append(_arithmetic_row(name, run))
    lines.append('')
  lines += ['| measurement | figure |', '|---|---|']
  for part in ('enwik8', 'enwik8_more'):
    if part not in parts:
      continue
    p = parts[part]
    lines += [
      f'| {part}: exit, steps/s | {p["train"]["exit"]}, '
      f'{p.get("steps_per_second_without_compiling")} |',
      f'| {part}: chip peak / accounted | {_gib(p.get("chip_peak_bytes"))}'
      f' / {_gib(p.get("accounted_peak_device_bytes"))} |',
      f'| {part}: host peak above open / accounted | '
      f'{_gib(p.get("host_peak_above_open_bytes"))} / '
      f'{_gib(p.get("accounted_peak_host_bytes"))} |',
      f'| {part}: eval losses | {p.get("eval_losses")} |',
    ]
  if 'others' in parts:
    for name in ('stock', 'default', 'estimate'):
      run = parts['others'].get(name, {})
      tail = ' '.join(run.get('tail', [])[-1:])[:300]
      lines.append(f'| enwik8 {name}: exit | {run.get("exit")}: {tail} |')
  if 'first_step' in parts:
    p = parts['first_step']
    lines.append(
      '| lm12 first step: stock / ours cold / ours warm cache | '
      + ' / '.join(
        f'{p.get(k, {}).get("first_step_seconds")}'
        for k in ('stock', 'ours_cold', 'ours_warm')
      )
      + ' s |'
    )
  return '\n'.join(lines) + '\n'


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--parts', default=','.join(PARTS))
  parser.add_argument('--out_dir', required=True)
  parser.add_argument('--timeout_seconds', type=float, default=900)
  parser.add_argument(
    '--bindings',
    action='append',
    default=[],
    help='a gin binding added to the enwik8 commands '
    '(e.g. smaller sizes, to try this on a CPU)',
  )
  parser.add_argument(
    '--runs',
    default='',
    help="the arithmetic part's runs to make, e.g. lm12_ours,lm12_stock "
    '(default: all); their figures join those of runs made before',
  )
  parser.add_argument(
    '--render',
    action='store_true',
    help='only rebuild the table from the JSON present',
  )
  args = parser.parse_args()
  os.makedirs(args.out_dir, exist_ok=True)
  _EXTRA.extend(args.bindings)
  _RUNS.extend(r for r in args.runs.split(',') if r)
  if not args.render:
    for part in args.parts.split(','):
      if part not in _PART_FUNCTIONS:
        parser.error(f'--parts: unknown part {part!r}; one of {PARTS}')
      figures = _PART_FUNCTIONS[part](
        os.path.join(args.out_dir, part), args.timeout_seconds
      )
      path = os.path.join(args.out_dir, f'{part}.json')
      if part == 'arithmetic' and os.path.exists(path):
        with open(path) as f:  # Runs made by an earlier command stay.
          figures = {**json.load(f), **figures}
      with open(path, 'w') as f:
        json.dump(figures, f, indent=1, default=str)
  table = render(args.out_dir)
  with open(os.path.join(args.out_dir, 'accelerator.md'), 'w') as f:
    f.write(table)
  print(table)


if __name__ == '__main__':
  main()
