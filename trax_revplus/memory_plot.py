"""Renders a run's `memory.jsonl` (see `trax_revplus.memory`) as a PNG.

Three panels share the training step as x-axis: host RSS, device bytes in
use, and bytes copied host-to-device (H2D) and device-to-host (D2H) per step.
Records of one step are spread a little along x in file order, so the phases
of a step (forward, loss, backward, free) read left to right; each phase has
its own colour and marker. Sizes are shown in MiB (2**20 bytes).
"""

import collections
import os
from typing import Sequence

import matplotlib

matplotlib.use('Agg')
# pylint: disable=g-import-not-at-top
import matplotlib.pyplot as plt

from trax_revplus import memory
# pylint: enable=g-import-not-at-top

DEFAULT_PNG_FILENAME = 'memory.png'
_MARKERS = 'osD^v<>ph*'


def _resolve_jsonl(run_dir_or_jsonl):
  path = os.fspath(run_dir_or_jsonl)
  if os.path.isdir(path):
    path = os.path.join(path, memory.MEMORY_LOG_FILENAME)
  if not os.path.isfile(path):
    raise FileNotFoundError(
        f'No memory log at {path}. Pass a training output dir that holds '
        f'{memory.MEMORY_LOG_FILENAME} (written by the trax_revplus trainer '
        f'once the Loop has an output_dir) or the path of the file itself.')
  return path


def _x_positions(records):
  """Step of each record, spread within a step in file order (list of float)."""
  steps = sorted({r['step'] for r in records})
  gaps = [b - a for a, b in zip(steps, steps[1:])]
  width = 0.8 * (min(gaps) if gaps else 1)
  per_step = collections.Counter(r['step'] for r in records)
  seen = collections.Counter()
  xs = []
  for r in records:
    xs.append(r['step'] + width * seen[r['step']] / per_step[r['step']])
    seen[r['step']] += 1
  return xs


def _transfers_per_step(records):
  """{step: (h2d_bytes, d2h_bytes)} summed over the step's records.

  Phase records and per-layer records may both carry transfers; a step's
  phase records are used where they have any, so bytes are not counted twice.
  """
  by_step = collections.defaultdict(lambda: {'phase': [0, 0, False],
                                             'layer': [0, 0, False]})
  for r in records:
    if r.get('h2d_bytes') is None and r.get('d2h_bytes') is None:
      continue
    kind = 'layer' if r.get('layer') is not None else 'phase'
    acc = by_step[r['step']][kind]
    acc[0] += r.get('h2d_bytes') or 0
    acc[1] += r.get('d2h_bytes') or 0
    acc[2] = True
  out = {}
  for step, kinds in sorted(by_step.items()):
    acc = kinds['phase'] if kinds['phase'][2] else kinds['layer']
    out[step] = (acc[0], acc[1])
  return out


def _plot_by_phase(ax, records, xs, key, phase_style):
  points = [(x, r[key] / memory.BYTES_PER_MIB) for x, r in zip(xs, records)
            if isinstance(r.get(key), (int, float))]
  if not points:
    ax.text(0.5, 0.5, f'no {key} in this log', transform=ax.transAxes,
            ha='center', va='center', color='gray')
    return
  ax.plot([p[0] for p in points], [p[1] for p in points], color='lightgray',
          linewidth=1, zorder=1)
  for phase, (color, marker) in phase_style.items():
    sel = [(x, r) for x, r in zip(xs, records)
           if r['phase'] == phase and isinstance(r.get(key), (int, float))]
    if not sel:
      continue
    ax.scatter([x for x, _ in sel],
               [r[key] / memory.BYTES_PER_MIB for _, r in sel],
               color=color, marker=marker, s=28, label=phase, zorder=2,
               edgecolors='none')


def plot_memory(run_dir_or_jsonl: str | os.PathLike,
                output_png: str | os.PathLike | None = None) -> str:
  """Renders a memory log to a PNG.

  Args:
    run_dir_or_jsonl: str, a training output dir holding `memory.jsonl`, or
      the path of a memory log.
    output_png: str or None; default `memory.png` next to the log.

  Returns:
    str, path of the PNG written.

  Raises:
    FileNotFoundError: there is no memory log at the given path.
    ValueError: the log holds no complete record with 'step' and 'phase'.
  """
  path = _resolve_jsonl(run_dir_or_jsonl)
  records = [r for r in memory.read_memory_log(path)
             if isinstance(r.get('step'), (int, float)) and 'phase' in r]
  if not records:
    raise ValueError(
        f'{path} holds no memory records. Train with the memory log enabled '
        f'for at least one recorded step, then plot again.')
  if output_png is None:
    output_png = os.path.join(os.path.dirname(os.path.abspath(path)),
                              DEFAULT_PNG_FILENAME)
  output_png = os.fspath(output_png)

  phases = list(dict.fromkeys(r['phase'] for r in records))
  cmap = plt.get_cmap('tab10')
  phase_style = {p: (cmap(i % 10), _MARKERS[i % len(_MARKERS)])
                 for i, p in enumerate(phases)}
  xs = _x_positions(records)
  sources = sorted({r['device_bytes_source'] for r in records
                    if r.get('device_bytes_source')})

  fig, (ax_host, ax_dev, ax_xfer) = plt.subplots(
      3, 1, figsize=(10, 10), sharex=True, constrained_layout=True)
  fig.suptitle(f'Memory log: {path}\n({len(records)} records, '
               f'{len({r["step"] for r in records})} steps)', fontsize=11)

  _plot_by_phase(ax_host, records, xs, 'host_rss_bytes', phase_style)
  ax_host.set_ylabel('host RSS (MiB)')
  ax_host.set_title('Host resident set size, per record')

  _plot_by_phase(ax_dev, records, xs, 'device_bytes_in_use', phase_style)
  source = ', '.join(s.replace('_', ' ') for s in sources) or 'no probe'
  ax_dev.set_ylabel(f'device bytes in use (MiB)\n[{source}]')
  ax_dev.set_title('Device memory in use, summed over devices, per record')
  if any(isinstance(r.get('device_peak_bytes'), (int, float))
         for r in records):
    peaks = [(x, r['device_peak_bytes'] / memory.BYTES_PER_MIB)
             for x, r in zip(xs, records)
             if isinstance(r.get('device_peak_bytes'), (int, float))]
    ax_dev.plot([p[0] for p in peaks], [p[1] for p in peaks], color='black',
                linestyle='--', linewidth=1, label='peak')

  for ax in (ax_host, ax_dev):
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
      ax.legend(title='phase', fontsize=8, loc='best')

  transfers = _transfers_per_step(records)
  if transfers:
    steps = list(transfers)
    ax_xfer.plot(steps,
                 [transfers[s][0] / memory.BYTES_PER_MIB for s in steps],
                 marker='o',
                 label='H2D (host to device)')
    ax_xfer.plot(steps,
                 [transfers[s][1] / memory.BYTES_PER_MIB for s in steps],
                 marker='s',
                 label='D2H (device to host)')
    ax_xfer.legend(fontsize=8, loc='best')
  else:
    ax_xfer.text(0.5, 0.5, 'no h2d_bytes / d2h_bytes in this log',
                 transform=ax_xfer.transAxes, ha='center', va='center',
                 color='gray')
  ax_xfer.set_ylim(bottom=0)
  ax_xfer.set_ylabel('bytes copied per step (MiB)')
  ax_xfer.set_title('Host-device transfers per recorded step')
  ax_xfer.set_xlabel('training step (records of a step spread left to right '
                     'in order)')
  ax_xfer.grid(True, alpha=0.3)

  out_dir = os.path.dirname(os.path.abspath(output_png))
  os.makedirs(out_dir, exist_ok=True)
  fig.savefig(output_png, dpi=100)
  plt.close(fig)
  return output_png


def main(argv: Sequence[str]) -> int:
  """`trax-revplus plot-memory` with `argv` (no program name) as its flags.

  For `tools/plot_memory.py`; the parsing and the exit statuses are the
  command's (`trax_revplus.cli`).

  Returns:
    The exit status: 0 done, 1 the PNG could not be written, 2 a usage
    error such as no memory log at the path.
  """
  from trax_revplus import cli  # pylint: disable=g-import-not-at-top
  return cli.main([cli.PROG, 'plot-memory', *argv])
