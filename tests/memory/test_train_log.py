"""The main job's memory log: every step, and the summary's peak."""

import os
import subprocess


from trax_revplus import memory
from trax_revplus.memory import plot


def test_train_logs_every_step_and_the_summary_s_peak(tmp_path):
  from cli_cases import cli_command, MAIN, REPO, TINY_MODEL  # pylint: disable=g-import-not-at-top,g-multiple-import
  bindings = ['train.steps = 12', 'train.eval_frequency = 6',
              'sequence_length = 32'] + TINY_MODEL
  # No time limit: a busy machine makes the run slow, not wrong.
  result = subprocess.run(
      cli_command() + ['train', f'--config_file={MAIN}',
                       f'--output_dir={tmp_path}',
                       '--memory_log_every_n_steps=5'] +
      [f'--config={b}' for b in bindings],
      capture_output=True, text=True, cwd=REPO, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  records = memory.read_memory_log(tmp_path / 'memory.jsonl')
  phases = [r['phase'] for r in records]
  assert phases.index('start') < phases.index('step')
  assert phases[-1] == 'end'
  steps = [r for r in records if r['phase'] == 'step']
  assert [r['step'] for r in steps] == list(range(1, 13))
  # Phase records: the first 10 steps, then 1 + 5k.
  assert sorted({r['step'] for r in records if r['phase'] == 'backward'}) == (
      list(range(1, 11)) + [11])
  assert [r['recorded'] for r in steps] == [s <= 11 for s in range(1, 13)]
  if memory.host_peak.supported():
    assert {r['host_peak_source'] for r in steps} == {'kernel_hwm'}
  # The summary's peak (the process's, from the kernel) is the log's.
  summary = result.stdout.split('== summary ==', 1)[1]
  line = next(l for l in summary.splitlines()
              if l.startswith('peak host memory'))
  summary_mib = float(line.split()[3])
  log_mib = memory.peaks(records)['host_peak_bytes'] / memory.BYTES_PER_MIB
  assert abs(log_mib - summary_mib) <= 0.05 * summary_mib, (log_mib, line)
  png = plot.plot_memory(str(tmp_path))
  assert os.path.getsize(png) > 10_000
