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

import os
from typing import IO

import matplotlib

matplotlib.use('Agg')
# pylint: disable=g-import-not-at-top
import matplotlib.pyplot as plt
from matplotlib import ticker

from trax_revplus import output_files
from trax_revplus.memory import plot_panels
from trax_revplus.memory import reading as reading_lib
from trax_revplus.memory.records import MEMORY_LOG_FILENAME
from trax_revplus.memory.step_axis import PROCESS_PHASES
from trax_revplus.memory.step_axis import segments
from trax_revplus.memory.step_axis import x_positions
# pylint: enable=g-import-not-at-top

DEFAULT_PNG_FILENAME = 'memory.png'
_MARKERS = 'osD^v<>ph*'


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
      f'the path of the file itself'
    )
  return path


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
  return os.path.join(
    os.path.dirname(os.path.abspath(log_path)), DEFAULT_PNG_FILENAME
  )


def plot_memory(
  run_dir_or_jsonl: str | os.PathLike,
  output_png: str | os.PathLike | None = None,
) -> str:
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


def plot_reading(
  log: reading_lib.LogReading, output_png: str | os.PathLike | None = None
) -> str:
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
    raise ValueError(
      f'{path} holds no memory records yet; train with the '
      f'memory log enabled for at least one step, then plot '
      f'again'
    )
  output_png = (
    os.fspath(output_png) if output_png is not None else (default_png(path))
  )

  phases = list(
    dict.fromkeys(
      r['phase'] for r in records if r['phase'] not in PROCESS_PHASES
    )
  )
  cmap = plt.get_cmap('tab10')
  phase_style = {
    p: (cmap(i % 10), _MARKERS[i % len(_MARKERS)]) for i, p in enumerate(phases)
  }
  segs = [(seg, x_positions(seg)) for seg in segments(records)]
  sources = sorted(
    {r['device_bytes_source'] for r in records if r.get('device_bytes_source')}
  )
  steps = {r['step'] for r in records if r['phase'] == 'step'} or {
    r['step'] for r in records if r['phase'] not in ('init', 'start')
  }

  fig, (ax_host, ax_dev, ax_xfer) = plt.subplots(
    3, 1, figsize=(11, 11), sharex=True, constrained_layout=True
  )
  fig.suptitle(
    f'Memory log: {path}\n({len(records)} records, '
    f'{len(steps)} steps, {len(segs)} process'
    f'{"" if len(segs) == 1 else "es"})',
    fontsize=11,
  )
  plot_panels.plot_host(ax_host, segs, phase_style)
  plot_panels.plot_device(ax_dev, segs, phase_style, sources)
  plot_panels.plot_transfers(ax_xfer, records)
  for seg, xs in segs:
    for x, r in zip(xs, seg):
      if r['phase'] == 'start':
        for ax in (ax_host, ax_dev, ax_xfer):
          ax.axvline(x, color='gray', linestyle='--', linewidth=1)
        ax_host.annotate(
          f' process {r.get("process_index", 0)} start '
          f'(pid {r.get("pid", "?")})',
          xy=(x, 1),
          xycoords=('data', 'axes fraction'),
          va='top',
          fontsize=8,
          color='gray',
          rotation=90,
        )
  for ax in (ax_host, ax_dev, ax_xfer):
    ax.grid(True, alpha=0.3)
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    if ax.get_legend_handles_labels()[0]:
      ax.legend(fontsize=8, loc='best')
  ax_xfer.set_xlabel(
    'training step (step k spans (k - 1, k]: its phases '
    'left to right, its peak at k)'
  )
  return _save(fig, output_png)
