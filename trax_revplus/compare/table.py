"""The table `compare` prints: the runs, their figures side by side."""

import textwrap

from trax_revplus.byte_sizes import format_bytes
from trax_revplus.compare import accounting
from trax_revplus.compare.common import IMPLEMENTATIONS
from trax_revplus.compare.common import LABELS
from trax_revplus.compare.common import Report


def _stat(run, key):
  stats = run.get('stats')
  if run['status'] != 'ok' or not stats:
    return None
  return stats.get(key)


def _floor_seconds(run):
  """The run's step floor (`train --step_floor`), seconds, or None."""
  floor = _stat(run, 'step_floor')
  return floor['step_floor_seconds'] if floor else None


def _over_floor(run):
  """The run's median step over its step floor, or None."""
  floor, median = _floor_seconds(run), _stat(run, 'median_step_seconds')
  return median / floor if floor and median else None


def _tflops_per_second(run):
  """The model's TFLOP a step over the median step, or None."""
  floor, median = _stat(run, 'step_floor'), _stat(run, 'median_step_seconds')
  return floor['flops_per_step'] / median / 1e12 if floor and median else None


def _peak(run, log_key, stats_key):
  """A run's peak: from its memory log's records, else from run_stats."""
  log = run.get('memory_log') if run['status'] == 'ok' else None
  if log and log.get(log_key) is not None:
    return log[log_key]
  return _stat(run, stats_key) if stats_key else None


def _last_step_loss(run):
  """The loss of the run's last step, as its summary's 'train loss, last
  step' row shows it: run_stats.json's last `loss` (None: not finite)."""
  losses = _stat(run, 'loss') or []
  return losses[-1] if losses else None


def _fmt(value, kind):
  if value is None:
    return 'n/a'
  if kind == 'mib':
    return format_bytes(value, spec='.4g', suffix=False)
  if kind == 'seconds':
    return f'{value:.3f}'
  if kind == 'loss':
    return f'{value:.4f}'
  if kind == 'ratio':
    return f'{value:.3g}'
  return str(value)


def _xla_row_name(xla_peaks):
  """'peak device, XLA (MiB)', naming the trainers where a side ran
  another than its memory-efficient one (trax's default Trainer)."""
  trainers = [xla_peaks[k]['trainer'] for k in IMPLEMENTATIONS]
  if all(t in (None, k) for t, k in zip(trainers, IMPLEMENTATIONS)):
    return 'peak device, XLA (MiB)'
  named = [accounting.TRAINER_LABELS[t] if t else 'n/a' for t in trainers]
  return (
    f'peak device, XLA (MiB, {named[0]})'
    if named[0] == named[1]
    else f'peak device, XLA (MiB, {named[0]} / {named[1]})'
  )


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
      if run.get('trainer_fix'):
        lines.append(
          f'  trainer fix        {run["trainer_fix"]} (as current JAX requires)'
        )
      lines.append(f'  reversible layers  {run["reversible_layers"] or "n/a"}')

  source = next(
    (
      _stat(runs[k], 'device_bytes_source')
      for k in IMPLEMENTATIONS
      if _stat(runs[k], 'device_bytes_source')
    ),
    None,
  )
  device_note = f', {source.replace("_", " ")}' if source else ''
  metrics = [
    ('steps run', lambda r: len(_stat(r, 'steps') or []) or None, 'int', False),
    ('train loss, last step (nats)', _last_step_loss, 'loss', False),
    (
      'first step (s, compiles)',
      lambda r: _stat(r, 'first_step_seconds'),
      'seconds',
      True,
    ),
    (
      'median later step (s)',
      lambda r: _stat(r, 'median_step_seconds'),
      'seconds',
      True,
    ),
    (
      'peak host RSS (MiB)',
      lambda r: _peak(r, 'host_peak_bytes', 'peak_host_rss_bytes'),
      'mib',
      True,
    ),
    (
      f'peak device (MiB{device_note})',
      lambda r: _peak(r, 'device_bytes_peak', 'peak_device_bytes'),
      'mib',
      True,
    ),
    ('H2D copied (MiB)', lambda r: _stat(r, 'total_h2d_bytes'), 'mib', True),
    ('D2H copied (MiB)', lambda r: _stat(r, 'total_d2h_bytes'), 'mib', True),
  ]
  accounted = report.get('device_accounting')
  xla_peaks = report['xla_peaks']
  if any(
    xla_peaks[k]['peak_device_bytes'] is not None for k in IMPLEMENTATIONS
  ):
    metrics.insert(
      6,
      (
        _xla_row_name(xla_peaks),
        lambda r: xla_peaks[r['implementation']]['peak_device_bytes'],
        'mib',
        True,
      ),
    )
  floors = any(_stat(runs[k], 'step_floor') for k in IMPLEMENTATIONS)
  if floors:  # After the median step.
    metrics[4:4] = [
      ('step floor (s)', _floor_seconds, 'seconds', True),
      ('median step / floor', _over_floor, 'ratio', False),
      ('TFLOP/s, median step', _tflops_per_second, 'ratio', True),
    ]
  table = [
    ('metric', LABELS['stock'], LABELS['revplus'], 'trax_revplus / stock')
  ]
  both_ok = all(runs[k]['status'] == 'ok' for k in IMPLEMENTATIONS)
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
    if not with_ratio:
      ratio = ''
    elif not both_ok:  # Nothing to compare with a run that failed.
      ratio = '-'
    else:
      ratio = f'{b / a:.3g}' if a and b is not None else 'n/a'
    table.append((name, a_text, b_text, ratio))
  widths = [max(len(row[i]) for row in table) for i in range(4)]
  lines.append('')
  for row in table:
    lines.append(
      '  '.join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
    )

  lines.append('')
  if report['loss_max_abs_diff'] is None:
    lines.append('loss per step: n/a (needs losses from both runs)')
  else:
    lines.append(
      f'loss per step: max abs difference '
      f'{report["loss_max_abs_diff"]:.3g} over '
      f'{report["loss_steps_compared"]} steps'
    )
  lines.append(
    f'final weights: max abs difference {_fmt_diff(report["final_weights"])}'
  )
  if report.get('final_weights_note'):
    # One line, unwrapped: the setting in it is pasted as it is.
    lines.append(f'  {report["final_weights_note"]}')
  lines.append(
    f'optimizer slots: max abs difference {_fmt_diff(report["final_slots"])}'
  )
  lines.extend(
    textwrap.wrap(
      'The first step includes compilation; the median is over the later '
      'steps; peaks are per process, imports included, read from the '
      'memory log (memory.jsonl: the true peak of each step, and before and '
      'after the steps) where the run writes one (trax_revplus), else from '
      'run_stats.json (stock trax: the process peak RSS, device bytes after '
      'each step); H2D/D2H bytes are counted by trax_revplus only (n/a for '
      "stock trax). The XLA peak is the step's peak device bytes "
      'computed from its compiled programs, for the trainer each side ran: '
      "trax_revplus's memory-efficient trainer's from its memory log, "
      "the others' (stock trax's, trax's default Trainer) from "
      '`trax-revplus estimate` on the same config. '
      + (
        "A step floor is the model's forward and gradient timed on the "
        "device at the rows of that side's calls (train --step_floor); "
        "TFLOP/s is XLA's count of it over the median step. "
        if floors
        else ''
      )
      + 'No ratio beside a run that failed.',
      width=78,
    )
  )
  if accounted and accounted.get('status') == 'failed':
    lines.append(f'device accounting (estimate): failed, {accounted["error"]}')
  return '\n'.join(lines)
