"""`trax-revplus compare`: one gin config, stock trax versus trax_revplus.

Trains the config twice, one run after the other, each in a fresh process
(`python -m trax_revplus.cli train`): first with stock trax
(`--implementation=stock`), then with trax_revplus
(`--implementation=revplus`), with the same bindings, the same number of
steps and the same seed. Both runs are measured by the same code,
`trax_revplus.progress.ProgressPrinter`, which writes each run's
`run_stats.json`. The comparison is printed as a table and written to
`<output_dir>/compare.json` and `<output_dir>/compare.png`.

Files under `output_dir`:
  stock/, revplus/: the two training output dirs (checkpoints, train.log,
    run_stats.json; revplus/ also memory.jsonl).
  stock.log, revplus.log: what each training process printed.
  compare.json: the figures below.
  compare.png: loss and step time per step, host and device memory per step
    (plus the trax_revplus memory log's per-phase records).

Keys of `compare.json` (sizes in bytes, times in seconds, losses in nats per
token for cross-entropy):
  config_files (list of str), bindings (list of str): the user's config.
  steps (int or null): the `train.steps` bound for both runs; null keeps the
    config's.
  seed (int or null): the `train.random_seed` both runs used: bound by
    compare, or the config's (null if the config binds something other than
    a literal, e.g. a macro).
  seed_from_config (bool): the config set the seed and compare left it.
  runs: {'stock': RUN, 'revplus': RUN}, where RUN has
    status (str): 'ok' or 'failed'.
    exit_code (int): the training process's exit status (negative: killed
      by that signal).
    error (str or null): why it failed, the last error line it printed.
    output_dir (str), log (str): its output dir and printed output.
    wall_seconds (float): wall time of the whole process (imports included).
    trainer (str or null), reversible_layers (str or null): the classes that
      ran, from the summary the run printed.
    memory_log (dict or null): the peaks of its memory log
      (`memory.jsonl`, trax_revplus's trainer only; `memory.peaks`):
      host_peak_bytes (the true peak RSS over the steps, before and after
      them), device_bytes_peak (the largest device bytes in use a record
      saw, inside the steps), peak_device_bytes (the device peak XLA's
      figures give, where the trainer writes it; else null), records (int).
      The table takes its peaks from here, and from `stats` for a run
      without a memory log.
    stats (dict or null): its `run_stats.json` (keys documented in
      `trax_revplus.progress`): per step `steps`, `loss`, `step_seconds`,
      `host_rss_bytes`, `device_bytes_in_use`, `h2d_bytes`, `d2h_bytes`, and
      `first_step_seconds` (includes compilation), `median_step_seconds`
      (median over all steps but the first), `peak_host_rss_bytes`,
      `peak_device_bytes`, `total_h2d_bytes`, `total_d2h_bytes` (null where
      the trainer does not count transfers: stock trax).
  loss_max_abs_diff (float or null): max over common steps of |stock loss -
    trax_revplus loss|; null unless both runs recorded losses.
  loss_steps_compared (int).
  final_weights, final_slots: {'max_abs_diff': float or null, 'n_arrays':
    int or null, 'reason': str or null}: max |stock - trax_revplus| over all
    elements of the final checkpoints' flat weights
    (`model.weights.npy.gz`) and optimizer slots (`model.opt_slots0.npy.gz`);
    `reason` says why there is no figure (a run failed, a file is missing,
    the array lists differ in length or shape).

Exit status: 0 when the trax_revplus run succeeded (also when stock failed:
the table says why), 1 when the trax_revplus run failed, 2 on a usage error
(e.g. output dirs that already hold runs).
"""

import gzip
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from typing import Any, Sequence, TextIO

import numpy as np

from trax_revplus import memory
from trax_revplus.cli import errors
from trax_revplus.cli import output_dir as output_dirs

# A run's entry of compare.json (see `collect_run`) and the whole report.
Run = dict[str, Any]
Report = dict[str, Any]

COMPARE_JSON = 'compare.json'
COMPARE_PNG = 'compare.png'
RUN_STATS_FILENAME = 'run_stats.json'  # As trax_revplus.progress writes it.
IMPLEMENTATIONS = ('stock', 'revplus')
LABELS = {'stock': 'stock trax', 'revplus': 'trax_revplus'}
DEFAULT_SEED = 0
# Phase records of the memory log; colours apart from the two runs' lines.
_PHASE_COLORS = ('black', 'tab:green', 'tab:purple', 'tab:orange', 'tab:brown',
                 'tab:olive', 'tab:cyan', 'tab:pink')
_PHASE_MARKERS = 'sD^v<>ph'

# A Python exception line ("jax.errors.JaxRuntimeError: ...") or the CLI's
# one-line error.
_ERROR_LINE = re.compile(
    r'^((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt)'
    r'\b(?::.*)?|trax-revplus train: error: .*)$')


# -------------------------------------------------------------- the seed --


def _statements(text):
  """The gin statements of `text` (list), without importing what they name."""
  import gin  # pylint: disable=g-import-not-at-top
  from gin import config_parser  # pylint: disable=g-import-not-at-top
  delegate = gin.config.ParserDelegate(skip_unknown=True)
  return list(config_parser.ConfigParser(text, delegate))


def config_seed(config_files: Sequence[str], bindings: Sequence[str]
                ) -> tuple[bool, int | None]:
  """Finds a `train.random_seed` binding in configs and bindings.

  Follows `include` statements (looked up next to the including file, then
  relative to the working directory), as `trax-revplus train` does. Nothing
  is imported: gin's parser reads the statements only.

  Args:
    config_files: list of str, .gin paths.
    bindings: list of str, gin bindings applied after the files.

  Returns:
    (found, value): found (bool) is True if some file or binding binds
    `train.random_seed`, or if a config cannot be read (then the seed is left
    to the config); value is the last bound literal (int) or None.
  """
  from gin import config_parser  # pylint: disable=g-import-not-at-top
  found, value = False, None
  seen = set()

  def visit(statements, base_dir):
    nonlocal found, value
    for statement in statements:
      if isinstance(statement, config_parser.IncludeStatement):
        for candidate in (os.path.join(base_dir, statement.filename),
                          statement.filename):
          if os.path.isfile(candidate):
            visit_file(candidate)
            break
      elif isinstance(statement, config_parser.BindingStatement):
        if (statement.selector.split('.')[-1] == 'train' and
            statement.arg_name == 'random_seed'):
          found = True
          value = statement.value if isinstance(statement.value, int) else None

  def visit_file(path):
    path = os.path.abspath(path)
    if path in seen:
      return
    seen.add(path)
    with open(path, encoding='utf-8') as f:
      visit(_statements(f.read()), os.path.dirname(path))

  try:
    for path in config_files:
      visit_file(path)
    for binding in bindings:
      visit(_statements(binding), os.getcwd())
  except Exception:  # pylint: disable=broad-except
    # The training runs report an unreadable config themselves.
    return True, None
  return found, value


# --------------------------------------------------------------- the runs --


def _train_command(implementation, config_files, bindings, output_dir,
                   progress_every_n_steps):
  command = [sys.executable, '-m', 'trax_revplus.cli', 'train',
             f'--implementation={implementation}',
             f'--output_dir={output_dir}']
  command += [f'--config_file={os.path.abspath(p)}' for p in config_files]
  command += [f'--config={b}' for b in bindings]
  if progress_every_n_steps is not None:
    command.append(f'--progress_every_n_steps={progress_every_n_steps}')
  return command


def _run_streaming(command, log_path, prefix, stream):
  """Runs `command`, copying its output to `log_path` and, prefixed, `stream`.

  Returns:
    (exit_code, output): int exit status (negative: killed by that signal)
    and the text it printed (stdout and stderr, interleaved).
  """
  env = dict(os.environ, PYTHONUNBUFFERED='1')
  lines = []
  with open(log_path, 'w', encoding='utf-8') as log:
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        errors='replace', env=env)
    try:
      for line in process.stdout:
        lines.append(line)
        log.write(line)
        log.flush()
        stream.write(f'{prefix}{line}')
        stream.flush()
      process.wait()
    except BaseException:
      # Ctrl-C reaches the child too; wait for it so no run is left behind.
      process.terminate()
      process.wait()
      raise
  return process.returncode, ''.join(lines)


def failure_reason(exit_code: int, output: str) -> str:
  """One line saying why a training process failed.

  Args:
    exit_code: int, its exit status (negative: killed by that signal).
    output: str, what it printed.

  Returns:
    str, e.g. "exit 1: AttributeError: module 'jax.lib' has no attribute
    'xla_bridge'".
  """
  if exit_code < 0:
    head = f'killed by signal {-exit_code}'
  else:
    head = f'exit {exit_code}'
  lines = [line.strip() for line in output.splitlines() if line.strip()]
  errors = [line for line in lines if _ERROR_LINE.match(line)]
  last = errors[-1] if errors else (lines[-1] if lines else '')
  if len(last) > 300:
    last = last[:297] + '...'
  return f'{head}: {last}' if last else head


def _summary_rows(output):
  """The `== summary ==` block a training run printed, as {row: value}."""
  if '== summary ==' not in output:
    return {}
  rows = {}
  for line in output.split('== summary ==', 1)[1].strip().splitlines():
    name, sep, value = line.partition('  ')
    if not sep:
      break
    rows[name.strip()] = value.strip()
  return rows


def _read_json(path):
  try:
    with open(path, encoding='utf-8') as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def collect_run(implementation: str, exit_code: int, output: str,
                output_dir: str, log_path: str,
                wall_seconds: float) -> Run:
  """The RUN entry of compare.json for one finished training process.

  Args:
    implementation: 'stock' or 'revplus'.
    exit_code: int, the process's exit status.
    output: str, what it printed.
    output_dir: str, its training output dir.
    log_path: str, where its output was saved.
    wall_seconds: float, wall time of the process.

  Returns:
    dict, see the module docstring.
  """
  rows = _summary_rows(output)
  stats = _read_json(os.path.join(output_dir, RUN_STATS_FILENAME))
  records = _memory_records(output_dir)
  trainer = rows.get('trainer') or (stats or {}).get('trainer')
  return {
      'implementation': implementation,
      'status': 'ok' if exit_code == 0 else 'failed',
      'exit_code': exit_code,
      'error': None if exit_code == 0 else failure_reason(exit_code, output),
      'output_dir': output_dir,
      'log': log_path,
      'wall_seconds': wall_seconds,
      'trainer': trainer,
      'reversible_layers': rows.get('reversible layers'),
      'stats': stats,
      'memory_log': dict(memory.peaks(records), records=len(records))
                    if records else None,
  }


def _memory_records(output_dir):
  """The records of the run's memory.jsonl, [] without one."""
  path = os.path.join(output_dir, memory.MEMORY_LOG_FILENAME)
  if not os.path.isfile(path):
    return []
  try:
    return memory.read_memory_log(path)
  except OSError:
    return []


# ------------------------------------------------------------ the figures --


def read_npy_gz(path: str | os.PathLike) -> list[np.ndarray]:
  """Reads the arrays of a trax `.npy.gz` checkpoint file.

  Mirrors `trax.layers.np_from_file` (the same format: `np.save`d arrays
  one after another in one gzip stream) without importing trax (~20 s).

  Args:
    path: str, e.g. `<output_dir>/model.weights.npy.gz`.

  Returns:
    list of numpy arrays, in file order.

  Raises:
    OSError: the file is missing or not gzip; ValueError: an entry is not
    an array saved by `np.save`.
  """
  arrays = []
  with gzip.open(path, 'rb') as f:
    while True:
      try:
        arrays.append(np.load(f, allow_pickle=False))
      except EOFError:
        break
  return arrays


def max_abs_diff(a_arrays: Sequence[np.ndarray],
                 b_arrays: Sequence[np.ndarray]
                 ) -> tuple[float | None, str | None]:
  """Max |a - b| over all elements of two equally shaped lists of arrays.

  Args:
    a_arrays, b_arrays: lists of numpy arrays.

  Returns:
    (value, reason): value is a float (0.0 for two empty lists) or None;
    reason (str or None) says why there is no value (the lists differ in
    length, or an array pair in shape).
  """
  if len(a_arrays) != len(b_arrays):
    return None, (f'different number of arrays: {len(a_arrays)} (stock) vs '
                  f'{len(b_arrays)} (trax_revplus)')
  worst = 0.0
  for i, (a, b) in enumerate(zip(a_arrays, b_arrays)):
    if a.shape != b.shape:
      return None, f'array {i}: shape {a.shape} (stock) vs {b.shape}'
    if a.size:
      diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
      worst = max(worst, float(np.max(diff)))
  return worst, None


def checkpoint_diff(runs: dict[str, Run], filename: str) -> dict[str, Any]:
  """Compares one checkpoint file of the two runs.

  Args:
    runs: {'stock': RUN, 'revplus': RUN} (see `collect_run`).
    filename: str, e.g. 'model.weights.npy.gz'.

  Returns:
    dict {'max_abs_diff', 'n_arrays', 'reason'}, see the module docstring.
  """
  failed = [LABELS[k] for k in IMPLEMENTATIONS if runs[k]['status'] != 'ok']
  if failed:
    return {'max_abs_diff': None, 'n_arrays': None,
            'reason': f'{" and ".join(failed)} did not finish'}
  arrays = []
  for k in IMPLEMENTATIONS:
    path = os.path.join(runs[k]['output_dir'], filename)
    try:
      arrays.append(read_npy_gz(path))
    except (OSError, ValueError) as e:
      return {'max_abs_diff': None, 'n_arrays': None,
              'reason': f'cannot read {path}: {e}'}
  value, reason = max_abs_diff(*arrays)
  return {'max_abs_diff': value, 'n_arrays': len(arrays[0]),
          'reason': reason}


def _losses_by_step(run):
  stats = run.get('stats') or {}
  return {step: loss for step, loss in zip(stats.get('steps') or [],
                                           stats.get('loss') or [])
          if loss is not None}


def build_report(config_files: Sequence[str], bindings: Sequence[str],
                 steps: int | None, seed: int | None,
                 seed_from_config: bool, runs: dict[str, Run]) -> Report:
  """Assembles compare.json's content (see the module docstring).

  Args:
    config_files, bindings: the user's config (lists of str).
    steps: int or None, the bound `train.steps`.
    seed: int or None, the `train.random_seed` both runs used.
    seed_from_config: bool, the config set the seed and compare left it.
    runs: {'stock': RUN, 'revplus': RUN} from `collect_run`.

  Returns:
    dict, plain JSON types.
  """
  stock, ours = (_losses_by_step(runs[k]) for k in IMPLEMENTATIONS)
  common = sorted(set(stock) & set(ours))
  loss_diff = (max(abs(stock[s] - ours[s]) for s in common)
               if common else None)
  return {
      'config_files': list(config_files),
      'bindings': list(bindings),
      'steps': steps,
      'seed': seed,
      'seed_from_config': seed_from_config,
      'runs': runs,
      'loss_max_abs_diff': loss_diff,
      'loss_steps_compared': len(common),
      'final_weights': checkpoint_diff(runs, 'model.weights.npy.gz'),
      'final_slots': checkpoint_diff(runs, 'model.opt_slots0.npy.gz'),
  }


# -------------------------------------------------------------- the table --


def _stat(run, key):
  stats = run.get('stats')
  if run['status'] != 'ok' or not stats:
    return None
  return stats.get(key)


def _peak(run, log_key, stats_key):
  """A run's peak: from its memory log's records, else from run_stats."""
  log = run.get('memory_log') if run['status'] == 'ok' else None
  if log and log.get(log_key) is not None:
    return log[log_key]
  return _stat(run, stats_key) if stats_key else None


def _final_loss(run):
  losses = [loss for loss in (_stat(run, 'loss') or []) if loss is not None]
  return losses[-1] if losses else None


def _fmt(value, kind):
  if value is None:
    return 'n/a'
  if kind == 'mib':
    return f'{value / memory.BYTES_PER_MIB:.4g}'
  if kind == 'seconds':
    return f'{value:.3f}'
  if kind == 'loss':
    return f'{value:.4f}'
  return str(value)


def _fmt_diff(entry):
  if entry['max_abs_diff'] is None:
    return f'n/a ({entry["reason"]})'
  return f'{entry["max_abs_diff"]:.3g} over {entry["n_arrays"]} arrays'


def format_table(report: Report) -> str:
  """The text `compare` prints: runs, figures side by side, differences.

  Args:
    report: dict from `build_report`.

  Returns:
    str, several lines.
  """
  runs = report['runs']
  head = ', '.join(report['config_files'] or ['(bindings only)'])
  steps = report['steps'] if report['steps'] is not None else 'config'
  seed = report['seed'] if report['seed'] is not None else 'n/a'
  if report['seed_from_config']:
    seed = f'{seed} (from the config)'
  lines = ['', f'== compare: {head}; steps {steps}; seed {seed} ==']
  width = max(len(LABELS[k]) for k in IMPLEMENTATIONS) + 1
  for k in IMPLEMENTATIONS:
    run = runs[k]
    if run['status'] == 'ok':
      what = f'ok, {run["wall_seconds"]:.0f} s in all'
    else:
      what = f'failed ({run["error"]})'
    lines.append(f'{(LABELS[k] + ":").ljust(width)} {what}')
    if run['trainer'] or run['reversible_layers']:
      lines.append(f'  trainer            {run["trainer"] or "n/a"}')
      lines.append(f'  reversible layers  {run["reversible_layers"] or "n/a"}')

  source = next((_stat(runs[k], 'device_bytes_source')
                 for k in IMPLEMENTATIONS
                 if _stat(runs[k], 'device_bytes_source')), None)
  device_note = f', {source.replace("_", " ")}' if source else ''
  metrics = [
      ('steps run', lambda r: len(_stat(r, 'steps') or []) or None, 'int',
       False),
      ('final train loss (nats)', _final_loss, 'loss', False),
      ('first step (s, compiles)',
       lambda r: _stat(r, 'first_step_seconds'), 'seconds', True),
      ('median later step (s)',
       lambda r: _stat(r, 'median_step_seconds'), 'seconds', True),
      ('peak host RSS (MiB)',
       lambda r: _peak(r, 'host_peak_bytes', 'peak_host_rss_bytes'), 'mib',
       True),
      (f'peak device (MiB{device_note})',
       lambda r: _peak(r, 'device_bytes_peak', 'peak_device_bytes'), 'mib',
       True),
      ('H2D copied (MiB)', lambda r: _stat(r, 'total_h2d_bytes'), 'mib',
       True),
      ('D2H copied (MiB)', lambda r: _stat(r, 'total_d2h_bytes'), 'mib',
       True),
  ]
  if any((runs[k].get('memory_log') or {}).get('peak_device_bytes')
         is not None for k in IMPLEMENTATIONS):
    metrics.insert(6, ('peak device, XLA (MiB)',
                       lambda r: _peak(r, 'peak_device_bytes', None), 'mib',
                       True))
  table = [('metric', LABELS['stock'], LABELS['revplus'],
            'trax_revplus / stock')]
  for name, get, kind, with_ratio in metrics:
    a, b = get(runs['stock']), get(runs['revplus'])
    if runs['stock']['status'] != 'ok':
      a_text = 'failed'
    else:
      a_text = _fmt(a, kind)
    if runs['revplus']['status'] != 'ok':
      b_text = 'failed'
    else:
      b_text = _fmt(b, kind)
    ratio = (f'{b / a:.3g}' if with_ratio and a and b is not None
             else ('' if not with_ratio else 'n/a'))
    table.append((name, a_text, b_text, ratio))
  widths = [max(len(row[i]) for row in table) for i in range(4)]
  lines.append('')
  for row in table:
    lines.append('  '.join(cell.ljust(w) for cell, w in
                           zip(row, widths)).rstrip())

  lines.append('')
  if report['loss_max_abs_diff'] is None:
    lines.append('loss per step: n/a (needs losses from both runs)')
  else:
    lines.append(f'loss per step: max abs difference '
                 f'{report["loss_max_abs_diff"]:.3g} over '
                 f'{report["loss_steps_compared"]} steps')
  lines.append(f'final weights: max abs difference '
               f'{_fmt_diff(report["final_weights"])}')
  lines.append(f'optimizer slots: max abs difference '
               f'{_fmt_diff(report["final_slots"])}')
  lines.extend(textwrap.wrap(
      'The first step includes compilation; the median is over the later '
      'steps; peaks are per process, imports included, read from the '
      'memory log (memory.jsonl: the true peak of each step, and before and '
      'after the steps) where the run writes one (trax_revplus), else from '
      'run_stats.json (stock trax: the process peak RSS, device bytes after '
      'each step); H2D/D2H bytes are counted by trax_revplus only (n/a for '
      'stock trax).', width=78))
  return '\n'.join(lines)


# --------------------------------------------------------------- the plot --


# Memory-log records of the process rather than of a step's phases.
_PROCESS_PHASES = ('init', 'start', 'step', 'end')


def _log_records(run):
  """The memory log's records with a numeric step and a phase, or []."""
  return [r for r in _memory_records(run['output_dir'])
          if isinstance(r.get('step'), (int, float)) and 'phase' in r]


def _phase_records(run):
  """(x, record) of the trax_revplus memory log's phase records, or []."""
  records = [r for r in _log_records(run)
             if r.get('layer') is None and r['phase'] not in _PROCESS_PHASES]
  # A step's phases happen before the step ends, when the runs' per-step
  # figures are sampled: spread them over (step - 1, step] in file order.
  per_step = {}
  for r in records:
    per_step.setdefault(r['step'], []).append(r)
  points = []
  for step, recs in per_step.items():
    for i, r in enumerate(recs):
      points.append((step - 1 + (i + 1) / len(recs), r))
  return points


def plot(report: Report, png_path: str) -> str:
  """Writes compare.png: loss, step time, host and device memory per step.

  Args:
    report: dict from `build_report`.
    png_path: str, where to write the PNG.

  Returns:
    str, png_path.
  """
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top

  runs = report['runs']
  style = {'stock': dict(color='tab:blue', linestyle='-', linewidth=3.5,
                         alpha=0.5, marker='o', markersize=7),
           'revplus': dict(color='tab:red', linestyle='--', linewidth=1.5,
                           marker='x', markersize=6)}
  fig, axes = plt.subplots(2, 2, figsize=(13, 9), constrained_layout=True)
  (ax_loss, ax_time), (ax_host, ax_dev) = axes
  title = ', '.join(os.path.basename(p) for p in report['config_files'])
  notes = []
  for k in IMPLEMENTATIONS:
    if runs[k]['status'] != 'ok':
      notes.append(f'{LABELS[k]} failed: {runs[k]["error"]}')
  weights = report['final_weights']
  if weights['max_abs_diff'] is not None:
    notes.append(f'final weights max |stock - trax_revplus| = '
                 f'{weights["max_abs_diff"]:.3g}')
  fig.suptitle(f'stock trax vs trax_revplus: {title or "bindings"}'
               + ''.join(f'\n{n[:150]}' for n in notes), fontsize=11)

  panels = [
      (ax_loss, 'loss', 1.0, 'training loss (nats)', 'Training loss per step'),
      (ax_time, 'step_seconds', 1.0, 'seconds',
       'Wall time per step (first step compiles)'),
      (ax_host, 'host_rss_bytes', memory.BYTES_PER_MIB, 'host RSS (MiB)',
       'Host resident set size after each step'),
      (ax_dev, 'device_bytes_in_use', memory.BYTES_PER_MIB,
       'device bytes in use (MiB)',
       'Device memory in use after each step'),
  ]
  for ax, key, scale, ylabel, panel_title in panels:
    for k in IMPLEMENTATIONS:
      stats = runs[k].get('stats') or {}
      points = [(s, v / scale) for s, v in zip(stats.get('steps') or [],
                                               stats.get(key) or [])
                if v is not None]
      if points:
        ax.plot([p[0] for p in points], [p[1] for p in points],
                label=LABELS[k], **style[k])
      elif runs[k]['status'] != 'ok':
        ax.plot([], [], label=f'{LABELS[k]}: failed', **style[k])
    ax.set_title(panel_title)
    ax.set_ylabel(ylabel)
    ax.set_xlabel('training step')
    ax.grid(True, alpha=0.3)
  ax_time.set_yscale('log')

  phases = _phase_records(runs['revplus'])
  names = list(dict.fromkeys(r['phase'] for _, r in phases))
  for ax, key in ((ax_host, 'host_rss_bytes'), (ax_dev, 'device_bytes_in_use')):
    for i, name in enumerate(names):
      pts = [(x, r[key] / memory.BYTES_PER_MIB) for x, r in phases
             if r['phase'] == name and isinstance(r.get(key), (int, float))]
      if pts:
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=30,
                   color=_PHASE_COLORS[i % len(_PHASE_COLORS)],
                   marker=_PHASE_MARKERS[i % len(_PHASE_MARKERS)], zorder=3,
                   label=f'trax_revplus memory log: {name}')
  steps = [r for r in _log_records(runs['revplus']) if r['phase'] == 'step']
  for ax, key, label in (
      (ax_host, 'host_peak_bytes', 'trax_revplus memory log: peak of each '
                                   'step'),
      (ax_dev, 'peak_device_bytes', 'trax_revplus memory log: peak of each '
                                    'step (XLA)')):
    pts = [(r['step'], r[key] / memory.BYTES_PER_MIB) for r in steps
           if isinstance(r.get(key), (int, float))]
    if pts:
      ax.plot([p[0] for p in pts], [p[1] for p in pts], color='black',
              linewidth=1, marker='_', markersize=10, zorder=3, label=label)
  failures = '\n'.join(f'{LABELS[k]} failed: {runs[k]["error"]}'[:110]
                        for k in IMPLEMENTATIONS
                        if runs[k]['status'] != 'ok')
  for ax in axes.flat:
    if not any(line.get_xydata().size for line in ax.get_lines()) and not (
        ax.collections):
      ax.text(0.5, 0.5, 'no data' + (f'\n{failures}' if failures else ''),
              transform=ax.transAxes, ha='center', va='center',
              color='gray', wrap=True)
  source = next(((runs[k].get('stats') or {}).get('device_bytes_source')
                 for k in IMPLEMENTATIONS
                 if (runs[k].get('stats') or {}).get('device_bytes_source')),
                None)
  if source == 'live_arrays':
    ax_dev.set_title('Device memory in use after each step\n'
                     '(CPU: bytes of live JAX arrays)')
  for ax in axes.flat:
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    if ax.get_legend_handles_labels()[0]:
      ax.legend(fontsize=9, loc='best')
  os.makedirs(os.path.dirname(os.path.abspath(png_path)), exist_ok=True)
  fig.savefig(png_path, dpi=90)
  plt.close(fig)
  return png_path


# ------------------------------------------------------------ the command --


def _check_fresh(run_dirs):
  """Raises UserError if a run dir holds files: train would resume there."""
  for path in run_dirs:
    if os.path.isdir(path) and os.listdir(path):
      raise errors.UserError(
          f'{path} already holds a run (training would resume from it); '
          f'give a new --output_dir or remove it')


def compare_main(config_files: Sequence[str], bindings: Sequence[str],
                 output_dir: str | None = None, steps: int | None = None,
                 seed: int | None = None,
                 stream: TextIO | None = None) -> int:
  """Runs both trainings, prints the table, writes compare.json and the PNG.

  Args:
    config_files: list of str, .gin files, parsed in order by both runs.
    bindings: list of str, gin bindings applied after them.
    output_dir: str or None; default ~/trax/compare_<config>_<date>_<time>.
    steps: int or None; binds `train.steps` for both runs.
    seed: int or None; binds `train.random_seed` for both runs. None keeps
      the config's seed, or binds 0 if the config sets none.
    stream: file-like object for the runs' output and the table; default
      sys.stdout.

  Returns:
    int exit status: 0 when the trax_revplus run succeeded, 1 when it failed.

  Raises:
    errors.UserError: the output dirs already hold runs.
  """
  stream = stream or sys.stdout
  output_dir = os.path.abspath(os.path.expanduser(
      output_dir or output_dirs.default_output_dir(config_files, 'compare_')))
  run_dirs = {k: os.path.join(output_dir, k) for k in IMPLEMENTATIONS}
  _check_fresh(run_dirs.values())
  os.makedirs(output_dir, exist_ok=True)

  extra = []
  if steps is not None:
    extra.append(f'train.steps = {int(steps)}')
  seed_from_config = False
  if seed is None:
    seed_from_config, config_value = config_seed(config_files, bindings)
    if seed_from_config:
      seed = config_value
    else:
      seed = DEFAULT_SEED
      extra.append(f'train.random_seed = {seed}')
  else:
    extra.append(f'train.random_seed = {int(seed)}')
  every = None if steps is None else max(1, int(steps) // 10)

  runs = {}
  for k in IMPLEMENTATIONS:
    log_path = os.path.join(output_dir, f'{k}.log')
    command = _train_command(k, config_files, list(bindings) + extra,
                             run_dirs[k], every)
    stream.write(f'{errors.PROG} compare: training with {LABELS[k]} '
                 f'(output in {log_path})\n')
    stream.flush()
    start = time.perf_counter()
    exit_code, output = _run_streaming(command, log_path, f'[{k}] ', stream)
    runs[k] = collect_run(k, exit_code, output, run_dirs[k], log_path,
                          time.perf_counter() - start)

  report = build_report(config_files, bindings, steps, seed,
                        seed_from_config, runs)
  json_path = os.path.join(output_dir, COMPARE_JSON)
  with open(json_path + '.tmp', 'w', encoding='utf-8') as f:
    json.dump(report, f, indent=1)
  os.replace(json_path + '.tmp', json_path)
  stream.write(format_table(report) + '\n')
  png_path = os.path.join(output_dir, COMPARE_PNG)
  try:
    plot(report, png_path)
    written = f'{json_path}, {png_path}'
  except Exception as e:  # pylint: disable=broad-except
    written = json_path
    stream.write(f'could not draw {png_path}: {type(e).__name__}: {e}\n')
  stream.write(f'wrote {written}\n')
  stream.flush()
  return (errors.EXIT_OK if runs['revplus']['status'] == 'ok' else
          errors.EXIT_RUNTIME)
