"""bench.md: the Markdown tables and target lines of a benchmark's results.

Reads `results` after `summary.summarize` (its ratios and checks). Each
section is a list of lines; one without figures is left out.
"""

import functools

from trax_revplus.byte_sizes import format_bytes

from tools.bench import configs
from tools.bench import summary


def _fmt(x, spec='.3f'):
  return '-' if x is None else format(x, spec)


# Whole MiB without the unit, '-' where unknown: the tables' headers name it.
_mib = functools.partial(format_bytes, spec='.0f', suffix=False)


def _holds(ok):
  return 'holds' if ok else 'does not hold'


def markdown(results):
  """The Markdown tables of `results` (str, ending in a newline)."""
  lines = (
    _step_time(results)
    + _host_memory(results)
    + _variants(results)
    + _depth_scaling(results)
    + _targets(results)
    + _device_memory(results.get('device_memory'))
  )
  return '\n'.join(lines) + '\n'


def _step_time(results):
  """The step-time table of the three trainers (always there); where a
  config was timed one process at a time (`timing_mode` 'sequential'),
  with how each config was timed and each trainer's device peak."""
  sequential = any(
    r.get('timing') and r.get('timing_mode') == 'sequential'
    for r in results['configs'].values()
  )
  if sequential:
    head = (
      'Step time: median seconds per step after two warm-up steps '
      '(one process per trainer: stepped in turns, or one process at '
      'a time, as the "timed" column says); first and second step '
      'times include compilation; the device peak is '
      "`memory_stats()['peak_bytes_in_use']` of each trainer's "
      'process after its last step (MiB; "-" where the backend keeps '
      'none, as the CPU).'
    )
    extra_head, extra_rule = (
      ' timed | device peak default / stock / ours (MiB) |',
      '---|---|',
    )
  else:
    head = (
      'Step time: median seconds per step after two warm-up steps '
      '(one process per trainer, stepped in turns); first and '
      'second step times include compilation.'
    )
    extra_head, extra_rule = '', ''
  lines = [
    head,
    '',
    '| config | default s/step | stock s/step | ours s/step | '
    'ours / stock | ours / default | stock / default | '
    'first step default / stock / ours (s) | '
    'second step default / stock / ours (s) |' + extra_head,
    '|---|---|---|---|---|---|---|---|---|' + extra_rule,
  ]
  for r in results['configs'].values():
    tm = r.get('timing')
    if not tm:
      continue
    g = lambda t, k: tm.get(t, {}).get(k)  # noqa: B023  # pylint: disable=cell-var-from-loop
    three = lambda k, fmt: ' / '.join(
      fmt(g(t, k))  # noqa: B023  # pylint: disable=cell-var-from-loop
      for t in configs.TRAINERS
    )
    ra = r['ratios']
    extra = ''
    if sequential:
      timed = (
        'one at a time' if r.get('timing_mode') == 'sequential' else 'in turns'
      )
      extra = f' {timed} | {three("chip_peak_bytes", _mib)} |'
    lines.append(
      f'| {configs.describe(r["config"])} | '
      f'{_fmt(g("default", "median_step_s"))} | '
      f'{_fmt(g("stock", "median_step_s"))} | '
      f'{_fmt(g("ours", "median_step_s"))} | '
      f'{_fmt(ra["ours_over_stock"], ".2f")} | '
      f'{_fmt(ra["ours_over_default"], ".2f")} | '
      f'{_fmt(ra["stock_over_default"], ".2f")} | '
      f'{three("first_step_s", lambda x: _fmt(x, ".1f"))} | '
      f'{three("second_step_s", lambda x: _fmt(x, ".1f"))} |' + extra
    )
  failures = []
  for name, c in results['configs'].items():
    for t, r in c.get('timing', {}).items():
      if r.get('error'):
        when = (
          'to build'
          if r['failed_at_step'] == 0
          else f'at step {r["failed_at_step"]}'
        )
        failures.append(f'- {name}: {t} fails {when}: {r["error"]}')
  if failures:
    lines += [
      '',
      'Trainers that could not train a config ("-" in the table):',
      '',
    ] + failures
  ready = [
    f'- {name}: {t}, steps {", ".join(map(str, r["steps_on_ready_plan"]))}'
    for name, c in results['configs'].items()
    for t, r in c.get('timing', {}).items()
    if r.get('steps_on_ready_plan')
  ]
  if ready:
    lines += [
      '',
      'Steps on the plan ready first while the fused program compiled '
      '(left out of the median step):',
      '',
    ] + ready
  return lines


def _rss_cell(m):
  """A trainer's peak RSS (MiB), with each process's where there were more."""
  runs = m.get('peak_above_baseline_bytes_runs')
  cell = _mib(m.get('peak_above_baseline_bytes'))
  if runs:
    cell += f' (median of {len(runs)}: {", ".join(_mib(x) for x in runs)})'
  return cell


def _host_memory(results):
  """The peak RSS table of the three trainers."""
  if not any(r.get('memory') for r in results['configs'].values()):
    return []
  lines = [
    '',
    'Peak host RSS above the import baseline (MiB), one fresh '
    'process per trainer and config; weights + Adam slots of '
    'the model (MiB).',
    '',
    '| config | default | stock | ours | weights + slots |',
    '|---|---|---|---|---|',
  ]
  for r in results['configs'].values():
    mem = r.get('memory')
    if not mem:
      continue
    any_t = next(iter(mem.values()))
    cells = [_rss_cell(mem.get(t, {})) for t in configs.TRAINERS]
    lines.append(
      f'| {configs.describe(r["config"])} | {" | ".join(cells)} | '
      f'{_mib(any_t["weights_bytes"] + any_t["slots_bytes"])} |'
    )
  return lines


def _variants(results):
  """A row per trainer variant (`ours+NAME=VALUE`), beside the three."""
  rows = []
  for name, r in results['configs'].items():
    tm, mem = r.get('timing', {}), r.get('memory', {})
    for t in sorted((set(tm) | set(mem)) - set(configs.TRAINERS)):
      med = tm.get(t, {}).get('median_step_s')
      vs_stock = summary.ratio(med, tm.get('stock', {}).get('median_step_s'))
      vs_default = summary.ratio(
        med, tm.get('default', {}).get('median_step_s')
      )
      rows.append(
        f'| {name} | `{t}` | {_fmt(med)} | {_fmt(vs_stock, ".2f")} | '
        f'{_fmt(vs_default, ".2f")} | '
        f'{_fmt(tm.get(t, {}).get("first_step_s"), ".1f")} | '
        f'{_mib(mem.get(t, {}).get("peak_above_baseline_bytes"))} |'
      )
  if not rows:
    return []
  return [
    '',
    "Ours with constructor arguments or its processes' "
    'environment changed (`--trainers=ours+NAME=VALUE`), '
    'measured beside the rows above.',
    '',
    '| config | trainer | s/step | / stock | / default | '
    'first step (s) | peak RSS above baseline (MiB) |',
    '|---|---|---|---|---|---|---|',
  ] + rows


def _depth_scaling(results):
  """Peak RSS growth from l6 to l24 against the bytes the model added."""
  scaling = results.get('depth_scaling')
  if not scaling:
    return []
  lines = [
    '',
    'Depth scaling 6 -> 24 layers: growth of peak RSS above '
    'baseline vs weights + slots added (MiB).',
    '',
    '| trainer | peak growth | weights + slots added | growth / added |',
    '|---|---|---|---|',
  ]
  for t, s in scaling.items():
    lines.append(
      f'| {t} | {_mib(s["peak_growth_bytes"])} | '
      f'{_mib(s["weights_and_slots_added_bytes"])} | '
      f'{_fmt(s["growth_over_added"], ".2f")} |'
    )
  return lines


def _targets(results):
  """Whether each target holds (always there, maybe with no line)."""
  lines = ['', 'Targets:', '']
  for name, r in results['configs'].items():
    for check, ok in r.get('checks', {}).items():
      lines.append(f'- {name}: {check}: {_holds(ok)}')
  if 'depth_scaling_note' in results:
    lines.append(f'- depth scaling: {results["depth_scaling_note"]}')
  for check, ok in results.get('depth_scaling_check', {}).items():
    lines.append(f'- depth scaling: {check}: {_holds(ok)}')
  return lines


def _device_memory(dm):
  """The device-memory section of bench.md (empty without figures)."""
  if not dm:
    return []
  lines = [
    '',
    'Peak device bytes per step (XLA memory analysis of the '
    'programs each trainer runs, composed with what it holds across '
    'each call; CPU backend):',
    '',
    '| config | default | stock | ours, defaults | '
    "ours at stock's peak | least: ours |",
    '|---|---|---|---|---|---|',
  ]
  for name, f in dm['configs'].items():
    cells = []
    for key in ('default', 'stock', 'ours', 'ours_at_stock_peak'):
      r = f.get(key, {})
      cells.append(
        _mib(r['peak_device_bytes']) + ' MiB'
        if 'peak_device_bytes' in r
        else 'error: ' + r.get('error', '-')[:60]
      )
    least = f.get('ours', {}).get('min_peak_device_bytes')
    cells.append('-' if least is None else _mib(least) + ' MiB')
    lines.append(f'| {name} | ' + ' | '.join(cells) + ' |')
  for name, g in dm.get('gin_configs', {}).items():
    if 'error' in g:
      lines.append(f'| {name} | error: {str(g["error"])[-60:]} | | | | |')
      continue
    tr = g['trainers']
    cell = lambda t, k='peak_device_bytes', tr=tr: (
      '-' if tr.get(t, {}).get(k) is None else _mib(tr[t][k]) + ' MiB'
    )
    ours = g['ours_at_stock_peak']
    at_stock = (
      _mib(ours['peak_device_bytes']) + ' MiB'
      if ours.get('fits')
      else 'no plan'
    )
    lines.append(
      f'| {name} | {cell("default")} | {cell("stock")} | '
      f'{cell("revplus")} | {at_stock} | '
      f'{cell("revplus", "min_peak_device_bytes")} |'
    )
  t = dm['targets']
  lines.append('')
  for key, value in t.items():
    if key in ('longest_sequence', 'estimate_main_job_output', 'gin_configs'):
      continue
    lines.append(f'* {key}: {value}')
  ls = t.get('longest_sequence', {})
  if ls:
    lines.append(
      f'* longest sequence within '
      f'{_mib(ls["device_memory_bytes"])} MiB (l6 family): '
      f'{ls["longest"]}'
    )
  return lines
