"""The main job's memory log: every step, and the summary's peak.

The main job (shrunk) trains through `trax-revplus train` in this process:
the command's flag reaches the trainer's log, every step gets a record, the
summary's peak is the log's, and plot-memory draws the run. The schedule of
phase records itself is test_log.py's.
"""

import pytest

from cli_cases import MAIN
from cli_cases import TINY_MODEL
import png_checks
from trax_revplus import cli
from trax_revplus import memory
from trax_revplus.memory import plot

pytestmark = pytest.mark.usefixtures('stock_trax_and_empty_gin')

STEPS = 4


def test_train_logs_every_step_and_the_summary_s_peak(tmp_path, capsys):
  # Phase records at step 1, then every 2nd: steps 1 and 3.
  bindings = [
    f'train.steps = {STEPS}',
    f'train.eval_frequency = {STEPS}',
    'sequence_length = 32',
    'trax_revplus.ReversibleSerialTrainer.memory_log_first_steps = 1',
  ] + TINY_MODEL
  code = cli.main(
    [
      cli.PROG,
      'train',
      f'--config_file={MAIN}',
      f'--output_dir={tmp_path}',
      '--memory_log_every_n_steps=2',
    ]
    + [f'--config={b}' for b in bindings]
  )
  out, err = capsys.readouterr()
  assert code == 0, err[-3000:]
  records = memory.read_memory_log(tmp_path / 'memory.jsonl')
  phases = [r['phase'] for r in records]
  assert phases.index('start') < phases.index('step')
  assert phases[-1] == 'end'
  steps = [r for r in records if r['phase'] == 'step']
  assert [r['step'] for r in steps] == list(range(1, STEPS + 1))
  assert sorted({r['step'] for r in records if r['phase'] == 'backward'}) == [
    1,
    3,
  ]
  assert [r['recorded'] for r in steps] == [True, False, True, False]
  if memory.host_peak.supported():
    assert {r['host_peak_source'] for r in steps} == {'kernel_hwm'}
  # The summary's peak (the process's, from the kernel) is the log's: its
  # 'start' record holds the process's peak before the first step.
  summary = out.split('== summary ==', 1)[1]
  line = next(
    l for l in summary.splitlines() if l.startswith('peak host memory')
  )
  summary_mib = float(line.split()[3])
  log_mib = memory.peaks(records)['host_peak_bytes'] / memory.BYTES_PER_MIB
  assert abs(log_mib - summary_mib) <= 0.05 * summary_mib, (log_mib, line)

  # The figure of the run: host, device and transfer panels, each with what
  # the run logged.
  image = png_checks.read_png(plot.plot_memory(str(tmp_path)))
  host, device, transfers = png_checks.panels(image)
  # The step peaks (a red line), and the forward phase's points (the first
  # phase after the trainer's 'init' records: colour C1) in host and device.
  assert png_checks.pixels_of(image, host, 'tab:red') > 0
  for panel in (host, device):
    assert png_checks.pixels_of(image, panel, 'C1') > 0
  # Bytes copied each way per step: the H2D (C0) and D2H (C1) lines.
  assert png_checks.pixels_of(image, transfers, 'C0') > 0
  assert png_checks.pixels_of(image, transfers, 'C1') > 0
  # The run is one process: one 'start' line in each panel.
  for panel in (host, device, transfers):
    assert len(png_checks.vertical_lines(image, panel, 'gray')) == 1
