"""The three panels of a memory log's figure, each drawn on its own axes.

`plot.plot_reading` lays out the figure and hands each panel its axes and
the records: the host panel (RSS at each phase record, the true peak of
each step), the device panel (bytes in use, the runtime's and XLA's peaks)
and the transfers panel (H2D and D2H bytes per step). Sizes are drawn in
MiB (2**20 bytes). Kept apart from `plot`, which finds the log, lays out
the figure and saves it, so that what each panel shows is read in one place.
"""

import collections
from typing import Any, Sequence

from matplotlib.axes import Axes

from trax_revplus.byte_sizes import BYTES_PER_MIB
from trax_revplus.byte_sizes import format_bytes
from trax_revplus.memory.records import is_number
from trax_revplus.memory.records import peaks
from trax_revplus.memory.records import Record
from trax_revplus.memory.step_axis import PROCESS_PHASES

# A process's records with the x position of each (`step_axis`).
Segments = Sequence[tuple[Sequence[Record], Sequence[float]]]
# Each phase's (colour, marker).
PhaseStyle = dict[str, tuple[Any, str]]

_MIB = BYTES_PER_MIB


def transfers_per_step(records: Sequence[Record]) -> dict[int, tuple[int, int]]:
  """{step: (h2d_bytes, d2h_bytes)} of each step.

  A step's 'step' record counts the whole step; without one, its phase
  records are summed, else its per-layer records, so bytes are not counted
  twice.
  """
  by_step: dict[int, dict[str, list]] = collections.defaultdict(
    lambda: {k: [0, 0, False] for k in ('step', 'phase', 'layer')}
  )
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
    acc = next(
      kinds[k]
      for k in ('step', 'phase', 'layer')
      if kinds[k][2] or k == 'layer'
    )
    out[step] = (acc[0], acc[1])
  return out


def _no_data(ax, text):
  ax.text(
    0.5,
    0.5,
    text,
    transform=ax.transAxes,
    ha='center',
    va='center',
    color='gray',
    wrap=True,
  )


def _plot_phases(ax, segs, key, phase_style, labelled):
  """Each phase record's `key` (bytes) as a scatter, one line per process."""
  drawn = False
  for seg, xs in segs:
    points = [
      (x, r)
      for x, r in zip(xs, seg)
      if r['phase'] not in PROCESS_PHASES and is_number(r.get(key))
    ]
    if not points:
      continue
    drawn = True
    ax.plot(
      [x for x, _ in points],
      [r[key] / _MIB for _, r in points],
      color='lightgray',
      linewidth=1,
      zorder=1,
    )
    for phase, (color, marker) in phase_style.items():
      sel = [(x, r) for x, r in points if r['phase'] == phase]
      if sel:
        ax.scatter(
          [x for x, _ in sel],
          [r[key] / _MIB for _, r in sel],
          color=color,
          marker=marker,
          s=24,
          zorder=2,
          edgecolors='none',
          label=None if phase in labelled else phase,
        )
        labelled.add(phase)
  return drawn


def _plot_line(ax, segs, phase, key, label, **style):
  """`key` of the `phase` records as a line per process; True if any."""
  drawn = False
  for seg, xs in segs:
    points = [
      (x, r[key] / _MIB)
      for x, r in zip(xs, seg)
      if r['phase'] == phase and is_number(r.get(key))
    ]
    if points:
      ax.plot(
        [p[0] for p in points],
        [p[1] for p in points],
        label=None if drawn else label,
        zorder=3,
        **style,
      )
      drawn = True
  return drawn


def plot_host(ax: Axes, segs: Segments, phase_style: PhaseStyle) -> None:
  """The host panel: RSS at each phase record, the peak of each step, the
  peaks between steps, before the first and after the last."""
  labelled: set[str] = set()
  drawn = _plot_phases(ax, segs, 'host_rss_bytes', phase_style, labelled)
  sources = {
    r.get('host_peak_source')
    for seg, _ in segs
    for r in seg
    if r['phase'] == 'step'
  } - {None}
  how = 'true' if sources == {'kernel_hwm'} else 'sampled'
  drawn |= _plot_line(
    ax,
    segs,
    'step',
    'host_peak_bytes',
    f'peak of each step ({how})',
    color='tab:red',
    marker='_',
    markersize=10,
    linewidth=1.5,
  )
  between = [
    (x - 1 + 0.1, r['host_peak_between_steps_bytes'] / _MIB)
    for seg, xs in segs
    for x, r in zip(xs, seg)
    if r['phase'] == 'step'
    and is_number(r.get('host_peak_between_steps_bytes'))
  ]
  if between:
    ax.scatter(
      [p[0] for p in between],
      [p[1] for p in between],
      marker='x',
      color='tab:red',
      s=20,
      zorder=3,
      label='peak between steps (evals, checkpoints)',
    )
  for phase, label, marker in (
    ('start', 'peak before the first step (imports, model init)', '*'),
    ('end', 'peak after the last step', 'P'),
  ):
    pts = [
      (x, r['host_peak_bytes'] / _MIB)
      for seg, xs in segs
      for x, r in zip(xs, seg)
      if r['phase'] == phase and is_number(r.get('host_peak_bytes'))
    ]
    if pts:
      drawn = True
      ax.scatter(
        [p[0] for p in pts],
        [p[1] for p in pts],
        marker=marker,
        s=70,
        color='tab:red',
        zorder=4,
        label=label,
      )
  all_records = [r for seg, _ in segs for r in seg]
  peak = peaks(all_records)['host_peak_bytes']
  if peak is not None:
    ax.axhline(peak / _MIB, color='tab:red', linestyle=':', linewidth=1)
    ax.annotate(
      f'peak {format_bytes(peak, spec=".0f")}',
      xy=(0.01, peak / _MIB),
      xycoords=('axes fraction', 'data'),
      va='bottom',
      color='tab:red',
      fontsize=9,
    )
  if not drawn:
    _no_data(ax, 'no host_rss_bytes or host_peak_bytes in this log')
  ax.set_ylabel('host RSS (MiB)')
  ax.set_title('Host memory: RSS at each phase record, true peak of each step')


def plot_device(
  ax: Axes, segs: Segments, phase_style: PhaseStyle, sources: Sequence[str]
) -> None:
  """The device panel: bytes in use at each phase record and after each
  step, and the peaks the runtime and XLA give; `sources` name the probes."""
  labelled = set(phase_style)  # The host panel's legend names the phases.
  drawn = _plot_phases(ax, segs, 'device_bytes_in_use', phase_style, labelled)
  drawn |= _plot_line(
    ax,
    segs,
    'step',
    'device_bytes_in_use',
    'after each step',
    color='black',
    marker='.',
    linewidth=0.8,
  )
  label: str | None
  for key, label, style in (
    ('device_peak_bytes', 'peak (runtime)', dict(linestyle='--')),
    (
      'peak_device_bytes',
      'peak of the step (XLA, computed)',
      dict(linestyle='-', marker='_', markersize=10),
    ),
  ):
    for phase in ('step',) + tuple(phase_style):
      if _plot_line(
        ax, segs, phase, key, label, color='tab:purple', linewidth=1, **style
      ):
        drawn = True
        label = None
  source = ', '.join(s.replace('_', ' ') for s in sources) or 'no probe'
  if not drawn:
    _no_data(ax, 'no device figures in this log')
  ax.set_ylabel(f'device bytes (MiB)\n[{source}]')
  ax.set_title('Device memory in use, summed over devices')


def plot_transfers(ax: Axes, records: Sequence[Record]) -> None:
  """The transfers panel: H2D and D2H bytes of each step."""
  transfers = transfers_per_step(records)
  if transfers:
    steps = list(transfers)
    ax.plot(
      steps,
      [transfers[s][0] / _MIB for s in steps],
      marker='o',
      label='H2D (host to device)',
    )
    ax.plot(
      steps,
      [transfers[s][1] / _MIB for s in steps],
      marker='s',
      label='D2H (device to host)',
    )
  else:
    _no_data(ax, 'no h2d_bytes / d2h_bytes in this log')
  ax.set_ylim(bottom=0)
  ax.set_ylabel('bytes copied per step (MiB)')
  ax.set_title('Host-device transfers per step')
