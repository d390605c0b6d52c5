"""compare.png: loss, step time, host and device memory of both runs."""

import os

from trax_revplus import memory
from trax_revplus import output_files
from trax_revplus.compare.common import IMPLEMENTATIONS
from trax_revplus.compare.common import LABELS
from trax_revplus.compare.common import Report
from trax_revplus.compare.runs import memory_records
from trax_revplus.memory import step_axis

# Phase records of the memory log; colours apart from the two runs' lines.
_PHASE_COLORS = (
  'black',
  'tab:green',
  'tab:purple',
  'tab:orange',
  'tab:brown',
  'tab:olive',
  'tab:cyan',
  'tab:pink',
)
_PHASE_MARKERS = 'sD^v<>ph'


def _log_records(run):
  """The memory log's records with a numeric step and a phase, or []."""
  return [
    r
    for r in memory_records(run['output_dir']).records
    if isinstance(r.get('step'), (int, float)) and 'phase' in r
  ]


def _phase_records(run):
  """(x, record) of the trax_revplus memory log's phase records, or [].

  A step's phases happen before the step ends, when the runs' per-step
  figures are sampled: they sit inside (step - 1, step), where
  `plot-memory` draws them too (`memory.step_axis`).
  """
  points = []
  for segment in step_axis.segments(_log_records(run)):
    for x, r in zip(step_axis.x_positions(segment), segment):
      if (
        r.get('layer') is None
        and r['phase'] != 'init'
        and r['phase'] not in step_axis.PROCESS_PHASES
      ):
        points.append((x, r))
  return points


def plot(report: Report, png_path: str) -> str:
  """Writes compare.png: loss, step time, host and device memory per step.

  Args:
    report: dict from `build_report`.
    png_path: str, where to write the PNG.

  Returns:
    str, png_path.
  """
  # Imported when a figure is drawn: matplotlib takes a quarter second, and
  # its backend is chosen here, not in every process that imports compare.
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')
  # Once the backend is chosen.
  # pylint: disable=g-import-not-at-top
  import matplotlib.pyplot as plt
  from matplotlib import ticker
  # pylint: enable=g-import-not-at-top

  runs = report['runs']
  style = {
    'stock': dict(
      color='tab:blue',
      linestyle='-',
      linewidth=3.5,
      alpha=0.5,
      marker='o',
      markersize=7,
    ),
    'revplus': dict(
      color='tab:red', linestyle='--', linewidth=1.5, marker='x', markersize=6
    ),
  }
  fig, axes = plt.subplots(2, 2, figsize=(13, 9), constrained_layout=True)
  (ax_loss, ax_time), (ax_host, ax_dev) = axes
  title = ', '.join(os.path.basename(p) for p in report['config_files'])
  notes = []
  for k in IMPLEMENTATIONS:
    if runs[k]['status'] != 'ok':
      notes.append(f'{LABELS[k]} failed: {runs[k]["error"]}')
  weights = report['final_weights']
  if weights['max_abs_diff'] is not None:
    notes.append(
      f'final weights max |stock - trax_revplus| = '
      f'{weights["max_abs_diff"]:.3g}'
    )
  fig.suptitle(
    f'stock trax vs trax_revplus: {title or "bindings"}'
    + ''.join(f'\n{n[:150]}' for n in notes),
    fontsize=11,
  )

  panels = [
    (ax_loss, 'loss', 1.0, 'training loss (nats)', 'Training loss per step'),
    (
      ax_time,
      'step_seconds',
      1.0,
      'seconds',
      'Wall time per step (first step compiles)',
    ),
    (
      ax_host,
      'host_rss_bytes',
      memory.BYTES_PER_MIB,
      'host RSS (MiB)',
      'Host resident set size after each step',
    ),
    (
      ax_dev,
      'device_bytes_in_use',
      memory.BYTES_PER_MIB,
      'device bytes in use (MiB)',
      'Device memory in use after each step',
    ),
  ]
  for ax, key, scale, ylabel, panel_title in panels:
    for k in IMPLEMENTATIONS:
      stats = runs[k].get('stats') or {}
      points = [
        (s, v / scale)
        for s, v in zip(stats.get('steps') or [], stats.get(key) or [])
        if v is not None
      ]
      if points:
        ax.plot(
          [p[0] for p in points],
          [p[1] for p in points],
          label=LABELS[k],
          **style[k],
        )
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
      pts = [
        (x, r[key] / memory.BYTES_PER_MIB)
        for x, r in phases
        if r['phase'] == name and isinstance(r.get(key), (int, float))
      ]
      if pts:
        ax.scatter(
          [p[0] for p in pts],
          [p[1] for p in pts],
          s=30,
          color=_PHASE_COLORS[i % len(_PHASE_COLORS)],
          marker=_PHASE_MARKERS[i % len(_PHASE_MARKERS)],
          zorder=3,
          label=f'trax_revplus memory log: {name}',
        )
  steps = [r for r in _log_records(runs['revplus']) if r['phase'] == 'step']
  for ax, key, label in (
    (ax_host, 'host_peak_bytes', 'trax_revplus memory log: peak of each step'),
    (
      ax_dev,
      'peak_device_bytes',
      'trax_revplus memory log: peak of each step (XLA)',
    ),
  ):
    pts = [
      (r['step'], r[key] / memory.BYTES_PER_MIB)
      for r in steps
      if isinstance(r.get(key), (int, float))
    ]
    if pts:
      ax.plot(
        [p[0] for p in pts],
        [p[1] for p in pts],
        color='black',
        linewidth=1,
        marker='_',
        markersize=10,
        zorder=3,
        label=label,
      )
  failures = '\n'.join(
    f'{LABELS[k]} failed: {runs[k]["error"]}'[:110]
    for k in IMPLEMENTATIONS
    if runs[k]['status'] != 'ok'
  )
  for ax in axes.flat:
    if not any(line.get_xydata().size for line in ax.get_lines()) and not (
      ax.collections
    ):
      ax.text(
        0.5,
        0.5,
        'no data' + (f'\n{failures}' if failures else ''),
        transform=ax.transAxes,
        ha='center',
        va='center',
        color='gray',
        wrap=True,
      )
  source = next(
    (
      (runs[k].get('stats') or {}).get('device_bytes_source')
      for k in IMPLEMENTATIONS
      if (runs[k].get('stats') or {}).get('device_bytes_source')
    ),
    None,
  )
  if source == 'live_arrays':
    ax_dev.set_title(
      'Device memory in use after each step\n(CPU: bytes of live JAX arrays)'
    )
  for ax in axes.flat:
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    if ax.get_legend_handles_labels()[0]:
      ax.legend(fontsize=9, loc='best')
  try:
    # Exactly at png_path, safely: no suffix added, no partial file left.
    return output_files.write(
      png_path, lambda f: fig.savefig(f, format='png', dpi=90)
    )
  finally:
    plt.close(fig)
