"""trax_revplus.memory.plot: the figure of a memory log."""

import collections

import matplotlib.colors
import numpy as np
import pytest

import png_checks
from trax_revplus import cli
from trax_revplus import memory
from trax_revplus.memory import plot
from trax_revplus.memory import plot_panels
from trax_revplus.memory import reading
from trax_revplus.memory import step_axis


_PHASES = ('init', 'forward', 'loss', 'backward', 'free')


def _write_small_log(run_dir):
  log = memory.MemoryLog(
    every_n_steps=1, output_dir=str(run_dir), tensorboard=False
  )
  for layer in range(2):
    log.record(
      0,
      'init',
      layer=layer,
      layer_name=f'Dense_{layer}',
      weights_bytes=4096,
      slots_bytes=8192,
    )
  for step in (1, 2):
    for phase in _PHASES[1:]:
      log.record(
        step, phase, seconds=0.01, h2d_bytes=2 << 20, d2h_bytes=1 << 20
      )
  log.close()


def test_plot_renders_png(tmp_path):
  _write_small_log(tmp_path)
  png = plot.plot_memory(str(tmp_path))
  assert png == str(tmp_path / 'memory.png')
  with open(png, 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  other = plot.plot_memory(
    str(tmp_path / 'memory.jsonl'), str(tmp_path / 'out' / 'm.png')
  )
  image = png_checks.read_png(other)
  host, device, transfers = png_checks.panels(image)
  # Each phase's points in its own colour (C0 ... C4, in the order the
  # phases first appear) in the host and the device panel.
  for panel in (host, device):
    for color in png_checks.TAB10[: len(_PHASES)]:
      assert png_checks.pixels_of(image, panel, color) > 0
  # Transfers per step: the H2D (C0) and D2H (C1) lines, and no phase points.
  assert png_checks.pixels_of(image, transfers, 'C0') > 0
  assert png_checks.pixels_of(image, transfers, 'C1') > 0
  assert png_checks.pixels_of(image, transfers, 'C2') == 0


def test_plot_sums_transfers_per_step(tmp_path):
  _write_small_log(tmp_path)
  records = memory.read_memory_log(tmp_path / 'memory.jsonl')
  assert plot_panels.transfers_per_step(records) == {
    1: (8 << 20, 4 << 20),
    2: (8 << 20, 4 << 20),
  }


def test_plot_errors_clearly(tmp_path):
  with pytest.raises(FileNotFoundError, match='No memory log at'):
    plot.plot_memory(str(tmp_path))
  (tmp_path / 'memory.jsonl').write_text('{"step": 1, "pha')
  with pytest.raises(reading.CorruptMemoryLogError, match='is corrupt'):
    plot.plot_memory(str(tmp_path))
  assert cli.main([cli.PROG, 'plot-memory', str(tmp_path / 'missing')]) == 2


def _write_resumed_log(run_dir):
  """Two processes: steps 1-3, then (resumed) steps 4-5, each with init."""
  for steps in ((1, 2, 3), (4, 5)):
    log = memory.MemoryLog(
      every_n_steps=1, output_dir=str(run_dir), tensorboard=False
    )
    log.record(0, 'init', layer=0, weights_bytes=4096)
    log.record(0, 'init', layer=1, weights_bytes=4096)
    for step in steps:
      log.begin_step(step)
      for phase in ('forward', 'loss', 'backward'):
        log.record(step, phase, h2d_bytes=1 << 20)
      log.end_step(step)
    log.close()


def test_plot_draws_one_segment_per_process(tmp_path):
  _write_resumed_log(tmp_path)
  records = memory.read_memory_log(tmp_path / 'memory.jsonl')
  segs = step_axis.segments(records)
  assert [len(s) for s in segs] == [2 + 1 + 3 * 4 + 1, 2 + 1 + 2 * 4 + 1]
  assert sum(segs, []) == records
  second = segs[1]
  xs = step_axis.x_positions(second)
  by_phase = collections.defaultdict(list)
  for x, r in zip(xs, second):
    by_phase[r['phase']].append((r['step'], x))
  # The resumed process's init records sit just before step 4, not at 0.
  assert by_phase['start'] == [(3, 3.0)]
  assert all(2.5 < x <= 3 for _, x in by_phase['init'])
  # Step k spans (k - 1, k]: phases inside, the step record on the tick.
  assert by_phase['step'] == [(4, 4.0), (5, 5.0)]
  for phase in ('forward', 'loss', 'backward'):
    assert all(step - 1 < x < step for step, x in by_phase[phase])
  image = png_checks.read_png(plot.plot_memory(str(tmp_path)))
  panels = png_checks.panels(image)
  assert len(panels) == 3
  # Each process's 'start' is a dashed grey line across every panel, at
  # the same place in each.
  starts = [png_checks.vertical_lines(image, panel, 'gray') for panel in panels]
  assert len(starts[0]) == 2, starts
  assert starts[1] == starts[2] == starts[0]


def test_plot_of_an_empty_log_writes_no_figure(tmp_path):
  (tmp_path / 'memory.jsonl').write_text('')
  with pytest.raises(ValueError, match='holds no memory records'):
    plot.plot_memory(str(tmp_path))
  assert not (tmp_path / 'memory.png').exists()


def _rows_of(image, box, color, tolerance=0.06):
  """Image rows inside `box` that hold pixels of `color`."""
  top, bottom, left, right = box
  near = np.all(
    np.abs(
      image[top:bottom, left : right + 1]
      - np.asarray(matplotlib.colors.to_rgb(color), np.float32)
    )
    <= tolerance,
    axis=-1,
  )
  return top + np.flatnonzero(near.any(axis=1))


def test_device_panel_draws_the_xla_peak_above_the_live_arrays(tmp_path):
  # Live arrays between phases say 2-4 MiB; the step's programs need 50 MiB
  # at their peak (as on the main job: 7.5-17.5 MiB live, 55 MiB needed).
  mib = 1 << 20
  log = memory.MemoryLog(
    every_n_steps=1, output_dir=str(tmp_path), tensorboard=False
  )
  for step in (1, 2, 3):
    log.begin_step(step)
    for i, phase in enumerate(('forward', 'loss', 'backward')):
      log.record(
        step,
        phase,
        device_bytes_in_use=(2 + i) * mib,
        peak_device_bytes=50 * mib,
        phase_peak_device_bytes=(40 + i) * mib,
      )
    log.end_step(step)
  log.close()
  image = png_checks.read_png(plot.plot_memory(str(tmp_path)))
  device = png_checks.panels(image)[1]
  peak_rows = _rows_of(image, device, 'tab:purple')
  assert peak_rows.size, 'no XLA peak drawn'
  live_rows = np.concatenate(
    [_rows_of(image, device, c) for c in png_checks.TAB10[:3]]
  )
  assert live_rows.size
  # Image rows grow downwards: the peak (50 MiB) is drawn far above every
  # live-array point (at most 4 MiB), near the top of the panel.
  top, bottom = device[:2]
  assert peak_rows.max() < live_rows.min()
  assert peak_rows.min() < top + 0.25 * (bottom - top)
