"""Renders a run's `memory.jsonl` (see `trax_revplus.memory`) as a PNG.

Three panels share the training step as x-axis, with ticks on whole steps:
host memory, device memory, and bytes copied host-to-device (H2D) and
device-to-host (D2H) per step. Sizes are shown in MiB (2**20 bytes).

Step k occupies (k - 1, k] (`step_axis`): its phase records (forward, loss,
backward, free) are spread over it in file order, each phase with its own
colour and marker, and its 'step' record, with the step's true host peak,
sits at k. Each process that wrote to the log is drawn as a segment of its
own: its 'start' record is a dashed vertical line at the step it started
from, its 'init' records sit just before it, and lines never join two
processes. The log is read defensively (`reading`): lines that are not
valid records are left out, and a log without any is an error, for which
no figure is written.
"""

import collections
import os
from typing import IO

import matplotlib

matplotlib.use('Agg')
# pylint: disable=g-import-not-at-top
import matplotlib.pyplot as plt
from matplotlib import ticker

from trax_revplus import output_files
from trax_revplus.byte_sizes import BYTES_PER_MIB
from trax_revplus.byte_sizes import format_bytes
from trax_revplus.memory import reading as reading_lib
from trax_revplus.memory.records import is_number
from trax_revplus.memory.records import MEMORY_LOG_FILENAME
from trax_revplus.memory.records import peaks
from trax_revplus.memory.step_axis import PROCESS_PHASES
from trax_revplus.memory.step_axis import segments
from trax_revplus.memory.step_axis import x_positions
# pylint: enable=g-import-not-at-top

DEFAULT_PNG_FILENAME = 'memory.png'
_MARKERS = 'osD^v<>ph*'
_MIB = BYTES_PER_MIB


def resolve_jsonl(run_dir_or_jsonl: str | os.PathLike) -> str:
  """The memory log of a run dir, or the path given if it is the log.

  Raises:
    FileNotFoundError: nothing at the path given, or no memory log there.
  """
  path = os.fspath(run_dir_or_jsonl)
  if not os.path.exists(path):
    raise FileNotFoundError(f'run directory not found: {path}')
  if os.path.isdir(path):
    path = os.path.join(path, MEMORY_LOG_FILENAME)
  if not os.path.isfile(path):
    raise FileNotFoundError(
        f'No memory log at {path}: give a training output dir that holds '
        f'{MEMORY_LOG_FILENAME} (written by the trax_revplus trainer) or '
        f'the path of the file itself')
  return path


def _transfers_per_step(records):
  """{step: (h2d_bytes, d2h_bytes)} of each step.

  A step's 'step' record counts the whole step; without one, its phase
  records are summed, else its per-layer records, so bytes are not counted
  twice.
  """
  by_step: dict[int, dict[str, list]] = collections.defaultdict(
      lambda: {k: [0, 0, False] for k in ('step', 'phase', 'layer')})
  for r in records:
    if r.get('h2d_bytes') is None and r.get('d2h_bytes') is None:
      continue
    if r['phase'] == 'step':
      kind = 'step'
    else:
      kind = 'layer' if r.get('layer') is not None else 'phase'
    acc = by_step[r['step']][kind]
    acc[0] += r.get('h2d_bytes') or 0
    acc[1] += r.get('d2h_bytes') or 0
    acc[2] = True
  out = {}
  for step, kinds in sorted(by_step.items()):
    acc = next(kinds[k] for k in ('step', 'phase', 'layer')
               if kinds[k][2] or k == 'layer')
    out[step] = (acc[0], acc[1])
  return out


def _no_data(ax, text):
  ax.text(0.5, 0.5, text, transform=ax.transAxes, ha='center', va='center',
          color='gray', wrap=True)


def _plot_phases(ax, segs, key, phase_style, labelled):
  """Each phase record's `key` (bytes) as a scatter, one line per process."""
  drawn = False
  for seg, xs in segs:
    points = [(x, r) for x, r in zip(xs, seg)
              if r['phase'] not in PROCESS_PHASES and is_number(r.get(key))]
    if not points:
      continue
    drawn = True
    ax.plot([x for x, _ in points], [r[key] / _MIB for _, r in points],
            color='lightgray', linewidth=1, zorder=1)
    for phase, (color, marker) in phase_style.items():
      sel = [(x, r) for x, r in points if r['phase'] == phase]
      if sel:
        ax.scatter([x for x, _ in sel], [r[key] / _MIB for _, r in sel],
                   color=color, marker=marker, s=24, zorder=2,
                   edgecolors='none',
                   label=None if phase in labelled else phase)
        labelled.add(phase)
  return drawn


def _plot_line(ax, segs, phase, key, label, **style):
  """`key` of the `phase` records as a line per process; True if any."""
  drawn = False
  for seg, xs in segs:
    points = [(x, r[key] / _MIB) for x, r in zip(xs, seg)
              if r['phase'] == phase and is_number(r.get(key))]
    if points:
      ax.plot([p[0] for p in points], [p[1] for p in points],
              label=None if drawn else label, zorder=3, **style)
      drawn = True
  return drawn


def _plot_host(ax, segs, phase_style):
  labelled: set[str] = set()
  drawn = _plot_phases(ax, segs, 'host_rss_bytes', phase_style, labelled)
  sources = {r.get('host_peak_source') for seg, _ in segs for r in seg
             if r['phase'] == 'step'} - {None}
  how = 'true' if sources == {'kernel_hwm'} else 'sampled'
  drawn |= _plot_line(ax, segs, 'step', 'host_peak_bytes',
                      f'peak of each step ({how})', color='tab:red',
                      marker='_', markersize=10, linewidth=1.5)
  between = [(x - 1 + 0.1, r['host_peak_between_steps_bytes'] / _MIB)
             for seg, xs in segs for x, r in zip(xs, seg)
             if r['phase'] == 'step' and
             is_number(r.get('host_peak_between_steps_bytes'))]
  if between:
    ax.scatter([p[0] for p in between], [p[1] for p in between], marker='x',
               color='tab:red', s=20, zorder=3,
               label='peak between steps (evals, checkpoints)')
  for phase, label, marker in (('start', 'peak before the first step '
                                          '(imports, model init)', '*'),
                               ('end', 'peak after the last step', 'P')):
    pts = [(x, r['host_peak_bytes'] / _MIB) for seg, xs in segs
           for x, r in zip(xs, seg)
           if r['phase'] == phase and is_number(r.get('host_peak_bytes'))]
    if pts:
      drawn = True
      ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker=marker,
                 s=70, color='tab:red', zorder=4, label=label)
  all_records = [r for seg, _ in segs for r in seg]
  peak = peaks(all_records)['host_peak_bytes']
  if peak is not None:
    ax.axhline(peak / _MIB, color='tab:red', linestyle=':', linewidth=1)
    ax.annotate(f'peak {format_bytes(peak, spec=".0f")}',
                xy=(0.01, peak / _MIB),
                xycoords=('axes fraction', 'data'), va='bottom',
                color='tab:red', fontsize=9)
  if not drawn:
    _no_data(ax, 'no host_rss_bytes or host_peak_bytes in this log')
  ax.set_ylabel('host RSS (MiB)')
  ax.set_title('Host memory: RSS at each phase record, true peak of each '
               'step')


def _plot_device(ax, segs, phase_style, sources):
  labelled = set(phase_style)  # The host panel's legend names the phases.
  drawn = _plot_phases(ax, segs, 'device_bytes_in_use', phase_style,
                       labelled)
  drawn |= _plot_line(ax, segs, 'step', 'device_bytes_in_use',
                      'after each step', color='black', marker='.',
                      linewidth=0.8)
  label: str | None
  for key, label, style in (
      ('device_peak_bytes', 'peak (runtime)', dict(linestyle='--')),
      ('peak_device_bytes', 'peak of the step (XLA, computed)',
       dict(linestyle='-', marker='_', markersize=10))):
    for phase in ('step',) + tuple(phase_style):
      if _plot_line(ax, segs, phase, key, label, color='tab:purple',
                    linewidth=1, **style):
        drawn = True
        label = None
  source = ', '.join(s.replace('_', ' ') for s in sources) or 'no probe'
  if not drawn:
    _no_data(ax, 'no device figures in this log')
  ax.set_ylabel(f'device bytes (MiB)\n[{source}]')
  ax.set_title('Device memory in use, summed over devices')


def _plot_transfers(ax, records):
  transfers = _transfers_per_step(records)
  if transfers:
    steps = list(transfers)
    ax.plot(steps, [transfers[s][0] / _MIB for s in steps], marker='o',
            label='H2D (host to device)')
    ax.plot(steps, [transfers[s][1] / _MIB for s in steps], marker='s',
            label='D2H (device to host)')
  else:
    _no_data(ax, 'no h2d_bytes / d2h_bytes in this log')
  ax.set_ylim(bottom=0)
  ax.set_ylabel('bytes copied per step (MiB)')
  ax.set_title('Host-device transfers per step')


def _save(fig, output_png):
  """Writes the figure as a PNG at exactly `output_png` (no suffix added),
  safely (`output_files.write`); returns the path."""
  def fill(f: IO[bytes]) -> None:
    fig.savefig(f, format='png', dpi=100)
  try:
    directory = os.path.dirname(os.path.abspath(output_png))
    os.makedirs(directory, exist_ok=True)
    return output_files.write(output_png, fill)
  finally:
    plt.close(fig)


def default_png(log_path: str) -> str:
  """`memory.png` next to the log."""
  return os.path.join(os.path.dirname(os.path.abspath(log_path)),
                      DEFAULT_PNG_FILENAME)


def plot_memory(run_dir_or_jsonl: str | os.PathLike,
                output_png: str | os.PathLike | None = None) -> str:
  """Renders a memory log to a PNG.

  Args:
    run_dir_or_jsonl: str, a training output dir holding `memory.jsonl`, or
      the path of a memory log.
    output_png: str or None; default `memory.png` next to the log. Written
      at exactly this path.

  Returns:
    str, path of the PNG written.

  Raises:
    FileNotFoundError: there is no memory log at the given path.
    reading.CorruptMemoryLogError: the log has lines but no valid record.
    ValueError: the log holds no record; no figure is written.
    output_files.OutputFileError: the PNG cannot be written.
  """
  log = reading_lib.read(resolve_jsonl(run_dir_or_jsonl))
  log.check_not_corrupt()
  return plot_reading(log, output_png)


def plot_reading(log: reading_lib.LogReading,
                 output_png: str | os.PathLike | None = None) -> str:
  """Renders the valid records of a read memory log to a PNG.

  Args:
    log: `reading.LogReading` of the log.
    output_png: as `plot_memory`.

  Returns:
    str, path of the PNG written.

  Raises:
    ValueError: the log holds no record; no figure is written.
    output_files.OutputFileError: the PNG cannot be written.
  """
  path, records = log.path, log.records
  if not records:
    raise ValueError(f'{path} holds no memory records yet; train with the '
                     f'memory log enabled for at least one step, then plot '
                     f'again')
  output_png = os.fspath(output_png) if output_png is not None else (
      default_png(path))

  phases = list(dict.fromkeys(r['phase'] for r in records
                              if r['phase'] not in PROCESS_PHASES))
  cmap = plt.get_cmap('tab10')
  phase_style = {p: (cmap(i % 10), _MARKERS[i % len(_MARKERS)])
                 for i, p in enumerate(phases)}
  segs = [(seg, x_positions(seg)) for seg in segments(records)]
  sources = sorted({r['device_bytes_source'] for r in records
                    if r.get('device_bytes_source')})
  steps = {r['step'] for r in records if r['phase'] == 'step'} or {
      r['step'] for r in records if r['phase'] not in ('init', 'start')}

  fig, (ax_host, ax_dev, ax_xfer) = plt.subplots(
      3, 1, figsize=(11, 11), sharex=True, constrained_layout=True)
  fig.suptitle(f'Memory log: {path}\n({len(records)} records, '
               f'{len(steps)} steps, {len(segs)} process'
               f'{"" if len(segs) == 1 else "es"})', fontsize=11)
  _plot_host(ax_host, segs, phase_style)
  _plot_device(ax_dev, segs, phase_style, sources)
  _plot_transfers(ax_xfer, records)
  for seg, xs in segs:
    for x, r in zip(xs, seg):
      if r['phase'] == 'start':
        for ax in (ax_host, ax_dev, ax_xfer):
          ax.axvline(x, color='gray', linestyle='--', linewidth=1)
        ax_host.annotate(f' process {r.get("process_index", 0)} start '
                         f'(pid {r.get("pid", "?")})', xy=(x, 1),
                         xycoords=('data', 'axes fraction'), va='top',
                         fontsize=8, color='gray', rotation=90)
  for ax in (ax_host, ax_dev, ax_xfer):
    ax.grid(True, alpha=0.3)
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    if ax.get_legend_handles_labels()[0]:
      ax.legend(fontsize=8, loc='best')
  ax_xfer.set_xlabel('training step (step k spans (k - 1, k]: its phases '
                     'left to right, its peak at k)')
  return _save(fig, output_png)
