"""Benchmark: trax's default Trainer, stock ReversibleSerialTrainer, ours.

Measures, on ReformerLM configs (full causal self-attention, dropout 0.1,
Adam, byte vocabulary), side by side:

  * step time (seconds per step): each trainer is built in a process of its
    own, and the parent steps them round-robin (default, stock, ours,
    default, ...), one step at a time while the others wait idle, so machine
    load hits all three alike; the first two steps of each are reported apart
    (the first compiles; trax's default and stock trainers compile again on
    the second, when their weights come back as different array types), the
    median of the `--steps` steps after them is the step time. Each trainer
    gets a process because ours changes process-wide state: its constructor
    clears JAX's compilation caches (and sets glibc's mmap threshold where
    `host_mmap_threshold` asks for it), and it
    returns free C-allocator memory to the system (`malloc_trim`) during its
    steps; in a shared process the other trainers would run under ours'
    settings, as no user's run of them does;
  * peak host RSS above the import baseline (bytes): one fresh process per
    (config, trainer), which imports everything, resets the kernel's peak RSS
    mark (`/proc/self/clear_refs`, so import-time peaks do not count),
    records its RSS, builds the model and trainer, runs `--memory_steps`
    steps and reports its peak RSS (VmHWM in `/proc/self/status`), and the
    running peak after each step, which shows whether more steps would have
    raised it; with `--memory_repeats=N`, the median of N such processes
    (all N peaks are kept in bench.json);
  * weights and Adam slots bytes of each config, so the growth of peak RSS
    from the 6- to the 24-layer config can be compared with the bytes added.

Results go to `<out_dir>/bench.json` and `<out_dir>/bench.md` (a Markdown
table with the ratios the README quotes).

Usage:
  python tools/bench.py                      # all four configs
  python tools/bench.py --configs=l6,l64 --steps=3
  python tools/bench.py --quick              # small shapes, a smoke run
  python tools/bench.py --nomemory           # timing only
  python tools/bench.py --configs=l6 \
      --trainers=default,stock,ours,ours+host_mmap_threshold=1048576
      # ours with a constructor argument changed, as a fourth trainer
  python tools/bench.py --configs=l6,l24 --trainers=ours,"ours+GLIBC_TUNABLES=\
'glibc.malloc.arena_max=1:glibc.malloc.mmap_threshold=1048576'"
      # ours in processes whose C allocator is set up from their start
  python tools/bench.py --configs=l6,l24 --device_memory --notiming \
      --nomemory  # device-memory figures and targets only (XLA, no steps
                  # beyond one logged step of ours per config)

With --device_memory: peak device bytes per step of each trainer (XLA's
memory analysis of the programs it runs, composed with what it holds across
each call; `trax_revplus.device_memory`), ours under a budget of stock's
own peak, the depth ratio l24 / l6, the longest l6-family sequence within
--seq_device_memory_bytes, ours' figure against its memory log's
peak_device_bytes, and the wall time of `trax-revplus estimate` on the main
job (`device_memory_targets`). The step-time targets under a budget run as
trainer variants, e.g. --trainers=stock,ours+device_memory_budget_bytes=N.

Absolute times on a shared machine vary from run to run; the ratios of one
interleaved run are the figures to read.
"""

import ast
import inspect
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import time

from absl import app
from absl import flags

FLAGS = flags.FLAGS

flags.DEFINE_list('configs', ['l6', 'l24', 'l64', 'l12'],
                  'Configs to run (see CONFIGS).')
TRAINERS = ('default', 'stock', 'ours')  # every trainer, in table order
# Variant arguments that go into the environment of the trainer's processes
# rather than to its constructor: glibc reads GLIBC_TUNABLES when a process
# starts, and some of its settings (the arena count) cannot be changed once
# JAX's runtime has started its threads.
_ENV_ARGS = ('GLIBC_TUNABLES',)
flags.DEFINE_list('trainers', list(TRAINERS),
                  'Trainers to compare; ours+NAME=VALUE[+...] is ours with '
                  'constructor arguments changed, e.g. '
                  'ours+host_mmap_threshold=None (VALUE a Python literal); '
                  f'NAME one of {list(_ENV_ARGS)} sets that environment '
                  'variable (VALUE a str) in the trainer\'s processes '
                  'instead, so that it applies from their start.')
flags.DEFINE_integer('steps', 3,
                     'Measured steps per trainer after the 2 warm-up steps.')
flags.DEFINE_integer('memory_steps', 2, 'Steps run by each memory process.')
flags.DEFINE_bool('memory', True, 'Measure peak RSS in separate processes.')
flags.DEFINE_integer('memory_repeats', 1,
                     'Fresh processes per (config, trainer) peak RSS; the '
                     'median is reported.')
flags.DEFINE_bool('timing', True, 'Measure step times (interleaved).')
flags.DEFINE_bool('quick', False, 'Scale every config down (smoke run).')
flags.DEFINE_string('out_dir', os.path.join(os.path.dirname(__file__),
                                            'bench_results'),
                    'Where bench.json and bench.md go.')
flags.DEFINE_bool('update', False,
                  'Merge into the existing bench.json: keep configs, parts '
                  '(timing, memory) and memory figures of trainers not '
                  'measured in this run.')
flags.DEFINE_string('memory_child', None,
                    'Internal: CONFIG:TRAINER, run one memory measurement.')
flags.DEFINE_bool('device_memory', False,
                  'Account each trainer\'s peak device bytes per step from '
                  'XLA (deterministic, one process per config, no step runs) '
                  'and check the device-memory targets (see '
                  'device_memory_targets).')
flags.DEFINE_integer('seq_device_memory_bytes', 2**30,
                     'Device memory of the longest-sequence target.')
flags.DEFINE_list('seq_lengths', ['512', '1024', '2048', '4096'],
                  'Sequence lengths tried for the longest-sequence target '
                  '(l6 family).')
flags.DEFINE_bool('estimate_main_job', True,
                  'With --device_memory, also time `trax-revplus estimate` '
                  'on the main job config.')
flags.DEFINE_string('device_memory_child', None,
                    'Internal: JSON request of one device-memory process.')
flags.DEFINE_string('timing_child', None,
                    'Internal: CONFIG:TRAINER, build one trainer and run the '
                    'steps numbered on stdin.')

# n_layers decoder blocks (each 2 ReversibleHalfResidual + 2 ReversibleSwap),
# d_ff = 4 * d_model, 4 heads of d_model / 4.
CONFIGS = {
    'l6': dict(n_layers=6, length=1024, d_model=128, batch=4),
    'l24': dict(n_layers=24, length=1024, d_model=128, batch=4),
    'l12': dict(n_layers=12, length=2048, d_model=256, batch=2),
    'l64': dict(n_layers=64, length=64, d_model=32, batch=2),
}
_QUICK = {'length': 64, 'd_model': 32}
VOCAB = 256
TRAINER_NAMES = {'default': 'default Trainer',
                 'stock': 'stock ReversibleSerialTrainer',
                 'ours': 'trax_revplus ReversibleSerialTrainer'}


def config(name, quick=False):
  cfg = dict(CONFIGS[name])
  if quick:
    cfg.update(_QUICK)
  return cfg


def describe(cfg):
  return (f"{cfg['n_layers']} layers, length {cfg['length']}, "
          f"d_model {cfg['d_model']}, batch {cfg['batch']}")


def _batch(cfg, seed=0):
  import numpy as np  # pylint: disable=g-import-not-at-top
  rs = np.random.RandomState(seed)
  x = rs.randint(1, VOCAB, size=(cfg['batch'], cfg['length'])).astype(np.int32)
  return (x, x, np.ones_like(x, dtype=np.float32))


def parse_trainer(spec):
  """'ours+a=1+b=None' -> ('ours', {'a': 1, 'b': None}).

  Raises:
    ValueError: an unknown trainer, arguments for another trainer than
      ours, or an argument that is not NAME=<Python literal>.
  """
  name, *args = spec.split('+')
  if name not in TRAINERS:
    raise ValueError(f'unknown trainer {name!r}; choose from {list(TRAINERS)}')
  if args and name != 'ours':
    raise ValueError(f'{spec!r}: only ours takes constructor arguments')
  kwargs = {}
  for arg in args:
    key, sep, value = arg.partition('=')
    try:
      if not sep or not key.isidentifier():
        raise ValueError
      kwargs[key] = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      raise ValueError(f'{spec!r}: {arg!r} is not NAME=VALUE with VALUE a '
                       f'Python literal') from None
  return name, kwargs


def split_trainer(spec):
  """Splits a `--trainers` entry into (name, constructor args, environment).

  E.g. "ours+GLIBC_TUNABLES='x'+a=1" -> ('ours', {'a': 1},
  {'GLIBC_TUNABLES': 'x'}): `parse_trainer`'s arguments, those named in
  `_ENV_ARGS` apart, for the environment of the trainer's processes.

  Raises:
    ValueError: as `parse_trainer`, or an environment argument whose value
      is not a str.
  """
  name, kwargs = parse_trainer(spec)
  env = {k: v for k, v in kwargs.items() if k in _ENV_ARGS}
  for key, value in env.items():
    if not isinstance(value, str):
      raise ValueError(f'{spec!r}: {key} must be a quoted str, got '
                       f'{value!r}')
  ctor = {k: v for k, v in kwargs.items() if k not in _ENV_ARGS}
  return name, ctor, env


def child_env(spec):
  """Environment for the processes of trainer `spec`, or None to inherit.

  Raises:
    ValueError: as `split_trainer`.
  """
  env = split_trainer(spec)[2]
  return {**os.environ, **env} if env else None


def build(trainer_name, cfg):
  """Builds model + trainer; returns (trainer, weights_bytes, slots_bytes).

  `trainer_name` is a `--trainers` entry (`split_trainer`; its environment
  arguments apply to the process, not here).
  """
  trainer_name, extra_kwargs, _ = split_trainer(trainer_name)
  # pylint: disable=g-import-not-at-top
  from trax import fastmath
  from trax import layers as tl
  from trax import models
  from trax import optimizers
  from trax import shapes
  from trax.optimizers import trainer as stock_trainer
  import trax_revplus
  from trax_revplus import memory
  from trax_revplus import trainer as rev_trainer
  # pylint: enable=g-import-not-at-top
  if trainer_name == 'ours':
    trax_revplus.activate()
  else:
    trax_revplus.deactivate()
  try:
    d = cfg['d_model']
    model = models.ReformerLM(
        VOCAB, d_model=d, d_ff=4 * d, d_attention_key=d // 4,
        d_attention_value=d // 4, n_layers=cfg['n_layers'], n_heads=4,
        dropout=0.1, max_len=cfg['length'], attention_type=tl.SelfAttention,
        mode='train')
    loss = tl.WeightedCategoryCrossEntropy()
    sig = shapes.signature(_batch(cfg))
    rng = fastmath.random.get_prng(0)
    if trainer_name == 'default':
      model_with_loss = tl.Serial(model, loss)
      model_with_loss.init(sig, rng=rng)
      opt = optimizers.Adam()
      opt.tree_init(model_with_loss.weights)
      trainer = optimizers.Trainer(model_with_loss, opt, n_devices=1)
      return (trainer, memory.array_bytes(model_with_loss.weights),
              memory.array_bytes(opt.slots))
    module = stock_trainer if trainer_name == 'stock' else rev_trainer
    blocks, loss_layer = module.extract_reversible_blocks([model, loss])
    module.init_reversible_blocks(blocks, loss_layer, sig, rng)
    kwargs = {}
    if trainer_name == 'ours':
      # Steady-state steps: phase records (which wait for each phase) on
      # the first step only, as in a long run after its first steps.
      kwargs = dict(memory_log_tensorboard=False, memory_log_first_steps=1,
                    **extra_kwargs)
    trainer = module.ReversibleSerialTrainer(
        blocks, loss_layer, optimizers.Adam, n_devices=1, **kwargs)
    weights = [l.weights for l in trainer.all_layers]
    return (trainer, memory.array_bytes(weights),
            memory.array_bytes(trainer.slots))
  finally:
    trax_revplus.deactivate()


def _step(trainer, batch, step):
  import jax  # pylint: disable=g-import-not-at-top
  from trax import fastmath  # pylint: disable=g-import-not-at-top
  t0 = time.perf_counter()
  loss, _ = trainer.one_step(batch, fastmath.random.get_prng(step), step=step)
  loss = float(jax.block_until_ready(loss))
  return time.perf_counter() - t0, loss


# Marks the lines a timing process writes for the parent on its stdout.
_RESULT = 'BENCH_RESULT '


def _send(obj):
  print(_RESULT + json.dumps(obj), flush=True)


def _receive(proc, what):
  """The next result line of timing process `proc` (`what` names it)."""
  for line in proc.stdout:
    if line.startswith(_RESULT):
      return json.loads(line[len(_RESULT):])
  raise RuntimeError(f'timing process {what} exited with status '
                     f'{proc.wait()} (its log is above)')


def timing_child(spec):
  """Runs in a fresh process: builds one trainer, then times each step whose
  number arrives on stdin, until stdin closes."""
  name, _, trainer_name = spec.partition(':')  # the variant may hold ':'
  cfg = config(name, FLAGS.quick)
  t0 = time.perf_counter()
  trainer, weights_bytes, slots_bytes = build(trainer_name, cfg)
  batch = _batch(cfg)
  _send(dict(build_s=time.perf_counter() - t0, weights_bytes=weights_bytes,
             slots_bytes=slots_bytes,
             glibc_tunables=os.environ.get('GLIBC_TUNABLES')))
  for line in sys.stdin:
    seconds, loss = _step(trainer, batch, int(line))
    _send(dict(seconds=seconds, loss=loss))


def time_config(name, trainers, n_steps):
  """Interleaved timing of `trainers` on one config; returns a dict.

  Each trainer runs in a process of its own (`timing_child`), built one
  after the other; the steps then go round-robin, one process computing at
  a time.
  """
  procs, built = {}, {}
  try:
    for t in trainers:
      cmd = [sys.executable, os.path.abspath(__file__),
             f'--timing_child={name}:{t}']
      if FLAGS.quick:
        cmd.append('--quick')
      procs[t] = subprocess.Popen(cmd, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True,
                                  env=child_env(t))
      built[t] = _receive(procs[t], f'{name}:{t}')
      print(f'[{name}] built {t} in {built[t]["build_s"]:.1f} s',
            flush=True)
    results = {t: dict(first_step_s=None, second_step_s=None, step_s=[],
                       losses=[]) for t in trainers}
    for step in range(1, n_steps + 3):
      for t in trainers:
        procs[t].stdin.write(f'{step}\n')
        procs[t].stdin.flush()
        done = _receive(procs[t], f'{name}:{t}')
        seconds, loss = done['seconds'], done['loss']
        r = results[t]
        if step == 1:
          r['first_step_s'] = seconds
        elif step == 2:
          r['second_step_s'] = seconds
        else:
          r['step_s'].append(seconds)
        r['losses'].append(loss)
        print(f'[{name}] step {step} {t}: {seconds:.3f} s loss {loss:.5f}',
              flush=True)
  except BaseException:
    for proc in procs.values():
      proc.kill()
    raise
  finally:
    for proc in procs.values():
      proc.stdin.close()
      proc.wait()
  for t in trainers:
    r = results[t]
    r['median_step_s'] = statistics.median(r['step_s']) if r['step_s'] else None
    r['weights_bytes'] = built[t]['weights_bytes']
    r['slots_bytes'] = built[t]['slots_bytes']
    r['glibc_tunables'] = built[t].get('glibc_tunables')
  return results


def _peak_rss_bytes():
  """Peak RSS since the last reset (VmHWM), or ru_maxrss without /proc."""
  try:
    with open('/proc/self/status') as f:
      for line in f:
        if line.startswith('VmHWM:'):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _reset_peak_rss():
  """Resets the kernel's peak RSS mark (Linux >= 4.0); False if it cannot."""
  try:
    with open('/proc/self/clear_refs', 'w') as f:
      f.write('5')
    return True
  except OSError:
    return False


def memory_child(spec):
  """Runs in a fresh process: peak RSS of one (config, trainer)."""
  name, _, trainer_name = spec.partition(':')  # the variant may hold ':'
  # Import everything the build needs before the baseline is taken.
  # pylint: disable=g-import-not-at-top,unused-import
  import jax
  import trax
  from trax import models
  from trax import optimizers
  from trax.supervised import training
  import trax_revplus
  from trax_revplus import trainer as rev_trainer
  import psutil
  # pylint: enable=g-import-not-at-top,unused-import
  cfg = config(name, FLAGS.quick)
  peak_reset = _reset_peak_rss()
  baseline = psutil.Process().memory_info().rss
  trainer, weights_bytes, slots_bytes = build(trainer_name, cfg)
  batch = _batch(cfg)
  seconds = []
  peaks_by_step = []  # the running peak after each step: shows when it settles
  for step in range(1, FLAGS.memory_steps + 1):
    seconds.append(_step(trainer, batch, step)[0])
    peaks_by_step.append(_peak_rss_bytes() - baseline)
  peak = _peak_rss_bytes()
  print(json.dumps(dict(peak_reset=peak_reset,
      config=name, trainer=trainer_name, baseline_rss_bytes=baseline,
      peak_rss_bytes=peak, peak_above_baseline_bytes=peak - baseline,
      weights_bytes=weights_bytes, slots_bytes=slots_bytes,
      peak_above_baseline_after_step_bytes=peaks_by_step,
      glibc_tunables=os.environ.get('GLIBC_TUNABLES'),
      step_s=seconds)))


def run_memory_median(name, trainer_name, repeats):
  """Median peak RSS of `repeats` fresh processes."""
  runs = [run_memory(name, trainer_name) for _ in range(repeats)]
  if len(runs) == 1:
    return runs[0]
  peaks = [r['peak_above_baseline_bytes'] for r in runs]
  result = dict(sorted(runs, key=lambda r: r['peak_above_baseline_bytes'])[
      (len(runs) - 1) // 2])
  result.update(peak_above_baseline_bytes=statistics.median(peaks),
                peak_above_baseline_bytes_runs=peaks,
                peak_above_baseline_after_step_bytes_runs=[
                    r['peak_above_baseline_after_step_bytes'] for r in runs])
  return result


def run_memory(name, trainer_name):
  cmd = [sys.executable, os.path.abspath(__file__),
         f'--memory_child={name}:{trainer_name}',
         f'--memory_steps={FLAGS.memory_steps}']
  if FLAGS.quick:
    cmd.append('--quick')
  t0 = time.perf_counter()
  proc = subprocess.run(cmd, capture_output=True, text=True, check=False,
                        env=child_env(trainer_name))
  if proc.returncode:
    print(proc.stderr[-3000:], file=sys.stderr)
    raise RuntimeError(f'memory process {name}:{trainer_name} failed')
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  print(f'[{name}] memory {trainer_name}: peak above baseline '
        f"{result['peak_above_baseline_bytes'] / 2**20:.0f} MiB "
        f'({time.perf_counter() - t0:.0f} s)', flush=True)
  return result


def _ratio(a, b):
  return None if a is None or b is None or not b else a / b


def summarize(results):
  """Adds ratios, target checks and the depth scaling to `results`."""
  targets = {'l6': (0.85, 1.40), 'l24': (0.85, 1.40), 'l12': (0.95, 1.36),
             'l64': (0.5, None)}
  for name, r in results['configs'].items():
    tm = r.get('timing', {})
    med = {t: tm.get(t, {}).get('median_step_s') for t in tm}
    first = {t: tm.get(t, {}).get('first_step_s') for t in tm}
    ratios = dict(
        ours_over_stock=_ratio(med.get('ours'), med.get('stock')),
        ours_over_default=_ratio(med.get('ours'), med.get('default')),
        stock_over_default=_ratio(med.get('stock'), med.get('default')))
    r['ratios'] = ratios
    checks = {}
    vs_stock, vs_default = targets.get(name, (None, None))
    if ratios['ours_over_stock'] is not None and vs_stock is not None:
      checks[f'step ours/stock <= {vs_stock}'] = (
          ratios['ours_over_stock'] <= vs_stock)
    if ratios['ours_over_default'] is not None and vs_default is not None:
      checks[f'step ours/default <= {vs_default}'] = (
          ratios['ours_over_default'] <= vs_default)
    if first.get('ours') is not None and first.get('stock') is not None:
      checks['first step ours <= stock'] = first['ours'] <= first['stock']
      second = {t: tm.get(t, {}).get('second_step_s') for t in tm}
      checks['first two steps ours <= stock'] = (
          first['ours'] + second['ours'] <= first['stock'] + second['stock'])
    mem = r.get('memory', {})
    if 'ours' in mem and 'stock' in mem:
      checks['peak RSS above baseline ours <= stock'] = (
          mem['ours']['peak_above_baseline_bytes'] <=
          mem['stock']['peak_above_baseline_bytes'])
    r['checks'] = checks
  cfgs = results['configs']
  if 'l6' in cfgs and 'l24' in cfgs:
    scaling = {}
    # Every trainer measured on both configs, also in earlier --update runs.
    for t in TRAINERS:
      m6 = cfgs['l6'].get('memory', {}).get(t)
      m24 = cfgs['l24'].get('memory', {}).get(t)
      if not m6 or not m24:
        continue
      added = ((m24['weights_bytes'] + m24['slots_bytes']) -
               (m6['weights_bytes'] + m6['slots_bytes']))
      growth = (m24['peak_above_baseline_bytes'] -
                m6['peak_above_baseline_bytes'])
      scaling[t] = dict(peak_growth_bytes=growth,
                        weights_and_slots_added_bytes=added,
                        growth_over_added=_ratio(growth, added))
    results['depth_scaling'] = scaling
    results.pop('depth_scaling_check', None)
    results.pop('depth_scaling_note', None)
    if any(v['peak_growth_bytes'] < 0 for v in scaling.values()):
      # A deeper model cannot need less memory: one of the two peaks was
      # not measured above its own baseline (e.g. it includes the imports).
      results['depth_scaling_note'] = (
          'not checked: a peak growth below 0 means the 6- and 24-layer '
          'peaks are not comparable; re-measure both with --notiming')
    elif 'ours' in scaling:
      results['depth_scaling_check'] = {
          'ours growth <= 1.2 x weights and slots added':
              scaling['ours']['growth_over_added'] <= 1.2}
  return results


def _fmt(x, spec='.3f'):
  return '-' if x is None else format(x, spec)


def _mib(x):
  return '-' if x is None else f'{x / 2**20:.0f}'


def markdown(results):
  """The Markdown tables of `results`."""
  lines = []
  lines.append('Step time: median seconds per step after two warm-up steps '
               '(one process per trainer, stepped in turns); first and '
               'second step times include compilation.')
  lines.append('')
  lines.append('| config | default s/step | stock s/step | ours s/step | '
               'ours / stock | ours / default | stock / default | '
               'first step default / stock / ours (s) | '
               'second step default / stock / ours (s) |')
  lines.append('|---|---|---|---|---|---|---|---|---|')
  for name, r in results['configs'].items():
    tm = r.get('timing')
    if not tm:
      continue
    g = lambda t, k: tm.get(t, {}).get(k)
    ra = r['ratios']
    lines.append(
        f"| {describe(r['config'])} | {_fmt(g('default', 'median_step_s'))} | "
        f"{_fmt(g('stock', 'median_step_s'))} | "
        f"{_fmt(g('ours', 'median_step_s'))} | "
        f"{_fmt(ra['ours_over_stock'], '.2f')} | "
        f"{_fmt(ra['ours_over_default'], '.2f')} | "
        f"{_fmt(ra['stock_over_default'], '.2f')} | "
        f"{_fmt(g('default', 'first_step_s'), '.1f')} / "
        f"{_fmt(g('stock', 'first_step_s'), '.1f')} / "
        f"{_fmt(g('ours', 'first_step_s'), '.1f')} | "
        f"{_fmt(g('default', 'second_step_s'), '.1f')} / "
        f"{_fmt(g('stock', 'second_step_s'), '.1f')} / "
        f"{_fmt(g('ours', 'second_step_s'), '.1f')} |")
  if any(r.get('memory') for r in results['configs'].values()):
    lines.append('')
    lines.append('Peak host RSS above the import baseline (MiB), one fresh '
                 'process per trainer and config; weights + Adam slots of '
                 'the model (MiB).')
    lines.append('')
    lines.append('| config | default | stock | ours | weights + slots |')
    lines.append('|---|---|---|---|---|')
    for name, r in results['configs'].items():
      mem = r.get('memory')
      if not mem:
        continue
      def g(t):
        m = mem.get(t, {})
        runs = m.get('peak_above_baseline_bytes_runs')
        cell = _mib(m.get('peak_above_baseline_bytes'))
        if runs:
          cell += (f' (median of {len(runs)}: '
                   f"{', '.join(_mib(x) for x in runs)})")
        return cell
      any_t = next(iter(mem.values()))
      lines.append(
          f"| {describe(r['config'])} | {g('default')} | "
          f"{g('stock')} | {g('ours')} | "
          f"{_mib(any_t['weights_bytes'] + any_t['slots_bytes'])} |")
  variant_rows = []
  for name, r in results['configs'].items():
    tm, mem = r.get('timing', {}), r.get('memory', {})
    for t in sorted((set(tm) | set(mem)) - set(TRAINERS)):
      med = tm.get(t, {}).get('median_step_s')
      vs_stock = _ratio(med, tm.get('stock', {}).get('median_step_s'))
      vs_default = _ratio(med, tm.get('default', {}).get('median_step_s'))
      variant_rows.append(
          f"| {name} | `{t}` | {_fmt(med)} | {_fmt(vs_stock, '.2f')} | "
          f"{_fmt(vs_default, '.2f')} | "
          f"{_fmt(tm.get(t, {}).get('first_step_s'), '.1f')} | "
          f"{_mib(mem.get(t, {}).get('peak_above_baseline_bytes'))} |")
  if variant_rows:
    lines.append('')
    lines.append('Ours with constructor arguments or its processes\' '
                 'environment changed (`--trainers=ours+NAME=VALUE`), '
                 'measured beside the rows above.')
    lines.append('')
    lines.append('| config | trainer | s/step | / stock | / default | '
                 'first step (s) | peak RSS above baseline (MiB) |')
    lines.append('|---|---|---|---|---|---|---|')
    lines.extend(variant_rows)
  scaling = results.get('depth_scaling')
  if scaling:
    lines.append('')
    lines.append('Depth scaling 6 -> 24 layers: growth of peak RSS above '
                 'baseline vs weights + slots added (MiB).')
    lines.append('')
    lines.append('| trainer | peak growth | weights + slots added | '
                 'growth / added |')
    lines.append('|---|---|---|---|')
    for t, s in scaling.items():
      lines.append(f"| {t} | {_mib(s['peak_growth_bytes'])} | "
                   f"{_mib(s['weights_and_slots_added_bytes'])} | "
                   f"{_fmt(s['growth_over_added'], '.2f')} |")
  lines.append('')
  lines.append('Targets:')
  lines.append('')
  for name, r in results['configs'].items():
    for check, ok in r.get('checks', {}).items():
      lines.append(f"- {name}: {check}: {'holds' if ok else 'does not hold'}")
  if 'depth_scaling_note' in results:
    lines.append(f"- depth scaling: {results['depth_scaling_note']}")
  for check, ok in results.get('depth_scaling_check', {}).items():
    lines.append(f"- depth scaling: {check}: "
                 f"{'holds' if ok else 'does not hold'}")
  lines.extend(_device_memory_markdown(results.get('device_memory')))
  return '\n'.join(lines) + '\n'


def _device_memory_markdown(dm):
  """The device-memory section of bench.md (empty without figures)."""
  if not dm:
    return []
  lines = ['', 'Peak device bytes per step (XLA memory analysis of the '
           'programs each trainer runs, composed with what it holds across '
           'each call; CPU backend):', '',
           '| config | default | stock | ours | ours at stock\'s peak |',
           '|---|---|---|---|---|']
  for name, f in dm['configs'].items():
    cells = []
    for key in ('default', 'stock', 'ours', 'ours_at_stock_peak'):
      r = f.get(key, {})
      cells.append(_mib(r['peak_device_bytes']) + ' MiB'
                   if 'peak_device_bytes' in r else
                   'error: ' + r.get('error', '-')[:60])
    lines.append(f'| {name} | ' + ' | '.join(cells) + ' |')
  t = dm['targets']
  lines.append('')
  for key, value in t.items():
    if key in ('longest_sequence', 'estimate_main_job_output'):
      continue
    lines.append(f'* {key}: {value}')
  ls = t.get('longest_sequence', {})
  if ls:
    lines.append(f"* longest sequence within "
                 f"{_mib(ls['device_memory_bytes'])} MiB (l6 family): "
                 f"{ls['longest']}")
  return lines


# Device memory (issue: plan with XLA's figures). Each request runs in a
# process of its own: ours clears JAX's caches and sets process-wide state.


def _account(trainer_name, cfg, trainer, batch):
  """{'peak_device_bytes', 'largest_program_bytes', 'peak_call', 'plan'}
  or {'error'} of one built trainer."""
  # pylint: disable=g-import-not-at-top
  import jax
  from trax_revplus import device_memory
  from trax_revplus.trainer import device_plan
  # pylint: enable=g-import-not-at-top
  backend = jax.default_backend()
  sds = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in batch)
  try:
    if trainer_name == 'default':
      step = device_memory.default_trainer_memory(trainer, sds, backend).step
    elif trainer_name == 'stock':
      step = device_memory.stock_trainer_memory(trainer, sds, backend).step
    else:
      step = trainer.device_memory_of(batch)
  except device_plan.DeviceMemoryBudgetError as e:
    return {'error': str(e), 'fits': False}
  except Exception as e:  # pylint: disable=broad-except
    return {'error': device_memory.report.one_line(e)}
  out = {'peak_device_bytes': step.peak_device_bytes,
         'largest_program_bytes': step.largest_program_bytes,
         'peak_call': step.peak_call.name, 'n_calls': len(step.calls)}
  if trainer_name != 'default' and trainer_name != 'stock':
    choice = trainer.device_plan.choice
    if choice is not None:
      out['plan'] = dict(segment_max_layers=choice.segment_max_layers,
                         backward_segment_max_layers=(
                             choice.backward_segment_max_layers),
                         kept_segments=choice.kept_segments)
  return out


def device_memory_child(request):
  """One process: accounts `request['trainers']` on a config.

  request: {'config': name, 'quick': bool, 'length': int or None,
  'trainers': [spec, ...], 'memory_log': bool}. With memory_log, ours also
  runs one real step with its memory log on and reports the
  peak_device_bytes the log recorded (`logged_peak_device_bytes`).
  """
  import tempfile  # pylint: disable=g-import-not-at-top
  cfg = config(request['config'], request['quick'])
  if request.get('length'):
    cfg['length'] = request['length']
  batch = _batch(cfg)
  out = {}
  for spec in request['trainers']:
    t0 = time.perf_counter()
    try:
      trainer = build(spec, cfg)[0]
    except Exception as e:  # pylint: disable=broad-except
      out[spec] = {'error': f'{type(e).__name__}: {e}'.splitlines()[0]}
      continue
    out[spec] = _account(split_trainer(spec)[0], cfg, trainer, batch)
    out[spec]['seconds'] = time.perf_counter() - t0
    if request.get('memory_log') and split_trainer(spec)[0] == 'ours':
      with tempfile.TemporaryDirectory() as tmp:
        logged = build(spec, cfg)[0]
        logged.memory_log.set_output_dir(tmp)
        _step(logged, batch, 1)
        logged.memory_log.close()
        with open(os.path.join(tmp, 'memory.jsonl')) as f:
          records = [json.loads(line) for line in f if line.strip()]
        peaks = {r.get('peak_device_bytes') for r in records
                 if r.get('step') == 1 and 'peak_device_bytes' in r}
        out[spec]['logged_peak_device_bytes'] = (
            peaks.pop() if len(peaks) == 1 else sorted(peaks))
  _send(out)


def _device_memory_run(request):
  """Runs `device_memory_child(request)` in a fresh process."""
  proc = subprocess.Popen(
      [sys.executable, __file__,
       f'--device_memory_child={json.dumps(request)}'],
      stdout=subprocess.PIPE, text=True)
  result = _receive(proc, f'device memory {request}')
  proc.wait()
  return result


def device_memory_targets(names, quick):
  """The device-memory figures and targets (bytes per device, XLA CPU).

  * per config: each trainer's peak; ours under a budget of stock's own
    peak (must fit);
  * depth: ours' peak at l24 / l6 (same plan) <= 1.05, the default
    Trainer's ratio beside;
  * longest sequence of the l6 family whose step fits
    `--seq_device_memory_bytes`: ours (planning under that budget) at least
    stock's and 2x the default Trainer's;
  * ours' accounted peak == the peak_device_bytes its memory log records
    for a real step;
  * `trax-revplus estimate` on the main job config: wall seconds (< 60).
  """
  out = {'configs': {}, 'targets': {}}
  for name in names:
    request = dict(config=name, quick=quick, trainers=list(TRAINERS),
                   memory_log=True)
    figures = _device_memory_run(request)
    stock_peak = figures.get('stock', {}).get('peak_device_bytes')
    if stock_peak:
      spec = f'ours+device_memory_budget_bytes={stock_peak}'
      figures['ours_at_stock_peak'] = _device_memory_run(dict(
          config=name, quick=quick, trainers=[spec]))[spec]
    out['configs'][name] = figures
  t = out['targets']
  c = out['configs']
  peak = lambda name, trainer: c.get(name, {}).get(trainer, {}).get(
      'peak_device_bytes')
  if peak('l6', 'ours') and peak('l24', 'ours'):
    t['depth_ours_l24_over_l6'] = peak('l24', 'ours') / peak('l6', 'ours')
    t['depth_ours_met'] = t['depth_ours_l24_over_l6'] <= 1.05
    if peak('l6', 'default') and peak('l24', 'default'):
      t['depth_default_l24_over_l6'] = (peak('l24', 'default') /
                                        peak('l6', 'default'))
  t['ours_fits_stock_peak'] = {
      name: 'error' not in f.get('ours_at_stock_peak', {'error': 1})
      for name, f in c.items()}
  t['estimate_equals_memory_log'] = {
      name: f.get('ours', {}).get('peak_device_bytes') ==
      f.get('ours', {}).get('logged_peak_device_bytes')
      for name, f in c.items()}
  budget = FLAGS.seq_device_memory_bytes
  longest, per_length = {}, {}
  for length in [int(n) for n in FLAGS.seq_lengths]:
    spec = f'ours+device_memory_budget_bytes={budget}'
    r = _device_memory_run(dict(config='l6', quick=quick, length=length,
                                trainers=['default', 'stock', spec]))
    per_length[length] = r
    fits_now = {}
    for trainer, key in (('default', 'default'), ('stock', 'stock'),
                         ('ours', spec)):
      p = r.get(key, {}).get('peak_device_bytes')
      fits_now[trainer] = p is not None and p <= budget
      if fits_now[trainer]:
        longest[trainer] = length
    if not any(fits_now.values()):
      break
  t['longest_sequence'] = dict(device_memory_bytes=budget, longest=longest,
                               per_length=per_length)
  if longest.get('ours') and longest.get('default'):
    t['longest_sequence_met'] = (
        longest['ours'] >= longest.get('stock', 0) and
        longest['ours'] >= 2 * longest['default'])
  if not FLAGS.estimate_main_job:
    return out
  main_job = os.path.join(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))), 'gin_configs', 'reformer_char_lm.gin')
  t0 = time.perf_counter()
  proc = subprocess.run([sys.executable, '-m', 'trax_revplus.cli',
                         'estimate', f'--config_file={main_job}'],
                        capture_output=True, text=True, check=False)
  t['estimate_main_job_seconds'] = time.perf_counter() - t0
  t['estimate_main_job_ok'] = proc.returncode == 0
  t['estimate_main_job_output'] = proc.stdout if proc.returncode == 0 else (
      proc.stderr[-2000:])
  return out


def _environment():
  import jax  # pylint: disable=g-import-not-at-top
  import trax  # pylint: disable=g-import-not-at-top
  return dict(python=sys.version.split()[0], jax=jax.__version__,
              trax=getattr(trax, '__version__', '1.4.1'),
              cpu_count=os.cpu_count(),
              devices=[str(d) for d in jax.devices()])


def main(argv):
  del argv
  if FLAGS.device_memory_child:
    device_memory_child(json.loads(FLAGS.device_memory_child))
    return
  if FLAGS.memory_child:
    memory_child(FLAGS.memory_child)
    return
  if FLAGS.timing_child:
    timing_child(FLAGS.timing_child)
    return
  unknown = set(FLAGS.configs) - set(CONFIGS)
  if unknown:
    raise app.UsageError(f'unknown configs {sorted(unknown)}; '
                         f'choose from {sorted(CONFIGS)}')
  variants = {}
  for spec in FLAGS.trainers:
    try:
      variants[spec] = split_trainer(spec)[1]
    except ValueError as e:
      raise app.UsageError(str(e)) from None
  if any(variants.values()):  # importing trax takes a while
    # pylint: disable=g-import-not-at-top
    from trax_revplus import trainer as rev_trainer
    # pylint: enable=g-import-not-at-top
    ours_args = inspect.signature(
        rev_trainer.ReversibleSerialTrainer.__init__).parameters
    for spec, kwargs in variants.items():
      unknown = sorted(set(kwargs) - set(ours_args) - {'self'})
      if unknown:
        raise app.UsageError(
            f'{spec!r}: trax_revplus.ReversibleSerialTrainer takes no '
            f'argument {unknown[0]!r}')
  # Quoted as a shell needs it, so the recorded command runs as given.
  results = dict(command=shlex.join(['python'] + sys.argv),
                 started=time.strftime('%Y-%m-%d %H:%M:%S'),
                 steps=FLAGS.steps, memory_steps=FLAGS.memory_steps,
                 quick=FLAGS.quick, trainers=list(FLAGS.trainers),
                 environment=_environment(), configs={})
  os.makedirs(FLAGS.out_dir, exist_ok=True)
  suffix = '_quick' if FLAGS.quick else ''
  json_path = os.path.join(FLAGS.out_dir, f'bench{suffix}.json')
  md_path = os.path.join(FLAGS.out_dir, f'bench{suffix}.md')

  if FLAGS.update and os.path.exists(json_path):
    with open(json_path) as f:
      previous = json.load(f)
    for name, r in previous.get('configs', {}).items():
      if name not in FLAGS.configs:
        results['configs'][name] = r
      else:
        kept = {k: v for k, v in r.items()
                if k == 'config' or (k == 'timing' and not FLAGS.timing) or
                (k == 'memory' and not FLAGS.memory)}
        if FLAGS.memory and 'memory' in r:  # trainers not measured now
          kept['memory'] = {t: m for t, m in r['memory'].items()
                            if t not in FLAGS.trainers}
        results.setdefault('updated_parts', {})[name] = [
            k for k, measured in (('timing', FLAGS.timing),
                                  ('memory', FLAGS.memory)) if measured]
        results['configs'][name] = dict(kept)
    results['previous_commands'] = (previous.get('previous_commands', []) +
                                    [previous.get('command')])

  def save():
    summarize(results)
    with open(json_path, 'w') as f:
      json.dump(results, f, indent=1)
    with open(md_path, 'w') as f:
      commands = [c for c in results.get('previous_commands', []) if c]
      commands.append(results['command'])
      f.write('Commands: ' + ', then '.join(f'`{c}`' for c in commands) +
              '\n\n' + markdown(results))

  for name in FLAGS.configs:  # every table row names its config
    results['configs'].setdefault(name, {})['config'] = config(
        name, FLAGS.quick)
  if FLAGS.device_memory:
    results['device_memory'] = device_memory_targets(FLAGS.configs,
                                                     FLAGS.quick)
    save()
  for name in FLAGS.configs:
    if FLAGS.timing:
      results['configs'][name]['timing'] = time_config(
          name, FLAGS.trainers, FLAGS.steps)
      save()
    if FLAGS.memory:
      memory = results['configs'][name].setdefault('memory', {})
      memory.update({t: run_memory_median(name, t, FLAGS.memory_repeats)
                     for t in FLAGS.trainers})
      save()
  save()
  print(open(md_path).read())


if __name__ == '__main__':
  app.run(main)
