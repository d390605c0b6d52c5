"""`trax-revplus compare`: stock trax and trax_revplus side by side.

In-process, with stand-ins for the training and estimate processes, and
the check before the runs in this process too (`check_in_process`) but
where the test is about that check's process; tools/compare_smoke.py runs
compare with its real processes on the tiny main job, on a simulated
one-chip host (stock equals trax_revplus, the figures, the table, the PNG
and the device accounting; trax's default Trainer; `.ci/run` runs it after
the suite).
"""

import importlib
import json
import os
import subprocess
import sys

import pytest

from trax_revplus import backend
from trax_revplus import cli
from trax_revplus import compare

from cli_cases import MAIN
from cli_cases import REPO

PNG_MAGIC = b'\x89PNG\r\n\x1a\n'

OUR_TRAINER = 'trax_revplus.trainer.ReversibleSerialTrainer'
STOCK_TRAINER = 'trax.optimizers.trainer.ReversibleSerialTrainer'
DEFAULT_TRAINER = 'trax.optimizers.trainer.Trainer'


@pytest.fixture
def check_in_process(monkeypatch):
  """compare's check of the config before the runs, in this process: each
  child process would take seconds to import trax
  (`test_the_check_runs_in_a_process_of_its_own` runs it there)."""

  def call(function, *args, **unused_kwargs):
    module, _, name = function.partition(':')
    return getattr(importlib.import_module(module), name)(*args)

  monkeypatch.setattr(backend, 'call', call)


def _main(capsys, *args):
  code = cli.main(['trax-revplus'] + list(args))
  out, err = capsys.readouterr()
  return code, out, err


def _check_png(path):
  with open(path, 'rb') as f:
    assert f.read(8) == PNG_MAGIC
  from matplotlib import image  # pylint: disable=g-import-not-at-top

  height, width = image.imread(path).shape[:2]
  assert height >= 400 and width >= 600


_MIB = 1 << 20


def _fake_estimate(command, log_path):
  """estimate's stand-in: the step peak of trax's default Trainer 12 MiB,
  stock's 8 MiB, ours 6 MiB."""
  json_path = next(
    a.split('=', 1)[1] for a in command if a.startswith('--json=')
  )
  with open(log_path, 'w') as f:
    f.write('log')
  with open(json_path, 'w') as f:
    json.dump(
      {
        'backend': 'cpu',
        'trainers': {
          'default': {'peak_device_bytes': 12 * _MIB},
          'stock': {'peak_device_bytes': 8 * _MIB},
          'revplus': {'peak_device_bytes': 6 * _MIB},
        },
      },
      f,
    )
  return 0, ''


def _fake_stats(
  steps,
  loss0=5.5,
  trainer=OUR_TRAINER,
  reversible_layers='trax_revplus.layers.ReversibleSerial x1',
):
  return {
    'trainer': trainer,
    'reversible_layers': reversible_layers,
    'steps': list(steps),
    'loss': [loss0 - 0.1 * i for i in range(len(steps))],
    'step_seconds': [2.0] + [0.1] * (len(steps) - 1),
    'host_rss_bytes': [1000 << 20] * len(steps),
    'device_bytes_in_use': [3 << 20] * len(steps),
    'device_bytes_source': 'live_arrays',
    'h2d_bytes': [1 << 20] * len(steps),
    'd2h_bytes': [1 << 20] * len(steps),
    'first_step_seconds': 2.0,
    'median_step_seconds': 0.1,
    'peak_host_rss_bytes': 1100 << 20,
    'peak_device_bytes': 4 << 20,
    'total_h2d_bytes': len(steps) << 20,
    'total_d2h_bytes': len(steps) << 20,
  }


_STOCK_CRASH = """\
trax-revplus train: stock trax reversible layers and trainer; output in d
step 1/3  loss 5.545  0.10 steps/s  host 1200 MiB
Traceback (most recent call last):
  File "trax/optimizers/trainer.py", line 800, in one_step
    backend = jax.lib.xla_bridge.get_backend()
AttributeError: module 'jax.lib' has no attribute 'xla_bridge'
"""


def test_failed_stock_run_is_reported_and_ours_decides_exit(
  tmp_path, monkeypatch, capsys, check_in_process
):
  """The orchestration without training processes: stock crashes."""
  commands = []

  def fake_run(command, log_path, prefix, stream):
    del prefix, stream
    commands.append(command)
    if 'estimate' in command:
      return _fake_estimate(command, log_path)
    implementation = command[command.index('train') + 1].split('=')[1]
    output_dir = next(
      a.split('=', 1)[1] for a in command if a.startswith('--output_dir=')
    )
    with open(log_path, 'w') as f:
      f.write('log')
    if implementation == 'stock':
      return 1, _STOCK_CRASH
    os.makedirs(output_dir)
    with open(os.path.join(output_dir, 'run_stats.json'), 'w') as f:
      json.dump(_fake_stats([1, 2, 3]), f)
    return 0, (
      '\n== summary ==\ntrainer            '
      + OUR_TRAINER
      + '\nreversible layers  trax_revplus.layers.ReversibleSerial x1'
      '\n'
    )

  monkeypatch.setattr(compare.runs, 'run_streaming', fake_run)
  config = tmp_path / 'mode2.gin'
  config.write_text('train.use_memory_efficient_trainer = 2\n')
  output_dir = tmp_path / 'cmp'
  code, out, _ = _main(
    capsys,
    'compare',
    f'--config_file={MAIN}',
    f'--config_file={config}',
    '--steps=3',
    f'--output_dir={output_dir}',
  )
  assert code == 0

  assert [c[c.index('train') + 1] for c in commands[:2]] == [
    '--implementation=stock',
    '--implementation=revplus',
  ]
  # Then estimate on the same config, for the XLA peaks.
  assert commands[2][2:4] == ['trax_revplus.cli', 'estimate']
  for command in commands:
    # The main job's config sets its seed, so compare binds only steps.
    bindings = [a for a in command if a.startswith('--config=')]
    assert bindings == ['--config=train.steps = 3']
  report = json.loads((output_dir / 'compare.json').read_text())
  stock = report['runs']['stock']
  assert stock['status'] == 'failed'
  assert stock['error'] == (
    "exit 1: AttributeError: module 'jax.lib' has no attribute 'xla_bridge'"
  )
  assert report['runs']['revplus']['status'] == 'ok'
  assert report['final_weights'] == {
    'max_abs_diff': None,
    'n_arrays': None,
    'reason': 'stock trax did not finish',
  }
  assert report['loss_max_abs_diff'] is None
  assert f'stock trax:   failed ({stock["error"]})' in out
  rows = {line.split('  ')[0]: line for line in out.splitlines()}
  assert rows['peak host RSS (MiB)'].split()[4:6] == ['failed', '1100']
  _check_png(output_dir / 'compare.png')

  # Our run failing too is a runtime error.
  monkeypatch.setattr(
    compare.runs, 'run_streaming', lambda *args: (1, _STOCK_CRASH)
  )
  code, out, _ = _main(
    capsys,
    'compare',
    f'--config_file={MAIN}',
    f'--config_file={config}',
    f'--output_dir={tmp_path / "cmp2"}',
  )
  assert code == 1
  assert 'trax_revplus: failed (exit 1: AttributeError' in out


def test_compare_refuses_output_dirs_that_hold_runs(tmp_path, capsys):
  run_dir = tmp_path / 'cmp' / 'stock'
  run_dir.mkdir(parents=True)
  (run_dir / 'model.pkl.gz').write_bytes(b'')
  code, _, err = _main(
    capsys,
    'compare',
    f'--config_file={MAIN}',
    f'--output_dir={tmp_path / "cmp"}',
  )
  assert code == 2
  lines = err.strip().splitlines()
  assert len(lines) == 1 and 'already holds a run' in lines[0]


# A config the check before the runs accepts; the runs are stand-ins.
# Given after the main job's config (its inputs and model: compare reads
# one batch before the runs).
_FAKE_CONFIG = 'train.steps = 2\n'


def _fake_runs(memory_lines, junk='', trainers=None, failed=()):
  """A `_run_streaming` stand-in: both runs succeed but those `failed`
  names; ours writes a log (its records, then `junk`). `trainers`:
  {implementation: the trainer class its run_stats.json (and summary)
  names}, by default each side's memory-efficient trainer."""
  trainers = trainers or {'stock': STOCK_TRAINER, 'revplus': OUR_TRAINER}

  def fake_run(command, log_path, prefix, stream):
    del prefix, stream
    if 'estimate' in command:
      return _fake_estimate(command, log_path)
    implementation = command[command.index('train') + 1].split('=')[1]
    output_dir = next(
      a.split('=', 1)[1] for a in command if a.startswith('--output_dir=')
    )
    with open(log_path, 'w') as f:
      f.write('log')
    if implementation in failed:
      return 1, _STOCK_CRASH
    os.makedirs(output_dir)
    with open(os.path.join(output_dir, 'run_stats.json'), 'w') as f:
      json.dump(_fake_stats([1, 2], trainer=trainers[implementation]), f)
    if implementation == 'revplus' and memory_lines:
      with open(os.path.join(output_dir, 'memory.jsonl'), 'w') as f:
        f.write(''.join(json.dumps(r) + '\n' for r in memory_lines) + junk)
    return 0, (
      f'\n== summary ==\ntrainer            {trainers[implementation]}\n'
    )

  return fake_run


@pytest.mark.parametrize('xla', [False, True])
def test_peaks_come_from_the_memory_log(
  xla, tmp_path, monkeypatch, capsys, check_in_process
):
  mib = 1 << 20
  lines = [
    {'step': 0, 'phase': 'start', 'host_peak_bytes': 900 * mib},
    {
      'step': 1,
      'phase': 'forward',
      'host_rss_bytes': 1000 * mib,
      'device_bytes_in_use': 7 * mib,
    },
    {
      'step': 1,
      'phase': 'step',
      'host_peak_bytes': 1234 * mib,
      'host_rss_bytes': 1001 * mib,
      'device_bytes_in_use': 1 * mib,
    },
    {'step': 2, 'phase': 'step', 'host_peak_bytes': 1200 * mib},
    {'step': 2, 'phase': 'end', 'host_peak_bytes': 1100 * mib},
  ]
  if xla:
    lines[2]['peak_device_bytes'] = 9 * mib
  monkeypatch.setattr(compare.runs, 'run_streaming', _fake_runs(lines))
  config = tmp_path / 'c.gin'
  config.write_text(_FAKE_CONFIG)
  output_dir = tmp_path / 'cmp'
  code, out, _ = _main(
    capsys,
    'compare',
    f'--config_file={MAIN}',
    f'--config_file={config}',
    f'--output_dir={output_dir}',
  )
  assert code == 0
  rows = {line.split('  ')[0]: line.split() for line in out.splitlines()}
  # Stock has no memory log: its figures are run_stats.json's.
  assert rows['peak host RSS (MiB)'][4:6] == ['1100', '1234']
  device = next(v for k, v in rows.items() if k.startswith('peak device ('))
  assert device[-3:-1] == ['4', '7']
  report = json.loads((output_dir / 'compare.json').read_text())
  assert report['runs']['stock']['memory_log'] is None
  ours = report['runs']['revplus']['memory_log']
  assert ours['host_peak_bytes'] == 1234 * mib and ours['records'] == 5
  # Stock's XLA peak is estimate's; ours the memory log's where it has
  # one, else estimate's.
  assert rows['peak device, XLA (MiB)'][4:6] == ['8', '9' if xla else '6']
  assert report['device_accounting']['trainers']['stock'] == {
    'peak_device_bytes': 8 * mib,
    'min_peak_device_bytes': None,
    'error': None,
  }
  _check_png(output_dir / 'compare.png')


def test_unreadable_memory_log_lines_are_named(
  tmp_path, monkeypatch, capsys, check_in_process
):
  lines = [{'step': 1, 'phase': 'step', 'host_peak_bytes': 5 << 20}]
  monkeypatch.setattr(
    compare.runs,
    'run_streaming',
    _fake_runs(lines, junk='\x00\x01 not json\n{"step": 2'),
  )
  config = tmp_path / 'c.gin'
  config.write_text(_FAKE_CONFIG)
  output_dir = tmp_path / 'cmp'
  code, out, err = _main(
    capsys,
    'compare',
    f'--config_file={MAIN}',
    f'--config_file={config}',
    f'--output_dir={output_dir}',
  )
  assert code == 0, err
  log = output_dir / 'revplus' / 'memory.jsonl'
  assert (
    f'trax-revplus compare: warning: {log}: 2 of 3 lines are not '
    f'memory records and were skipped (the first, line 2: not a JSON '
    f'object)'
  ) in out.splitlines()
  report = json.loads((output_dir / 'compare.json').read_text())
  assert report['runs']['revplus']['memory_log']['records'] == 1
  assert report['runs']['revplus']['memory_log']['unreadable_lines'] == 2


@pytest.mark.parametrize(
  'binding,text',
  [
    (
      'train.use_memory_efficient_trainer = 3',
      'train.use_memory_efficient_trainer = 3: must be one of False, True, 2',
    ),
    (
      "trax_revplus.ReversibleSerialTrainer.on_non_finite = 'warn'",
      'the trainer rejects its settings: on_non_finite must be one of',
    ),
    (
      'trax_revplus.ReversibleSerialTrainer.batch_slices = 3',
      'batch_slices = 3 does not divide the 8 rows of the batch each device '
      'gets',
    ),
  ],
  ids=['trainer_mode', 'on_non_finite', 'batch_slices'],
)
def test_compare_rejects_what_train_rejects_before_either_run(
  binding, text, tmp_path, monkeypatch, capsys, check_in_process
):
  def no_run(*unused_args):
    raise AssertionError('compare started a run')

  monkeypatch.setattr(compare.runs, 'run_streaming', no_run)
  code, out, err = _main(
    capsys,
    'compare',
    f'--config_file={MAIN}',
    f'--output_dir={tmp_path / "cmp"}',
    f'--config={binding}',
  )
  assert code == 2, err
  lines = err.strip().splitlines()
  assert (
    len(lines) == 1
    and lines[0].startswith('trax-revplus compare: error: ')
    and text in lines[0]
  ), err
  assert 'training with' not in out


def test_the_check_runs_in_a_process_of_its_own(tmp_path, monkeypatch, capsys):
  """What `train` rejects, found by the check in its own process (which
  opens JAX's backend; compare's process does not): train's line and exit
  status, and no output dir left behind to look like a run."""

  def no_run(*unused_args):
    raise AssertionError('compare started a run')

  monkeypatch.setattr(compare.runs, 'run_streaming', no_run)
  output_dir = tmp_path / 'cmp'
  code, _, err = _main(
    capsys,
    'compare',
    f'--config_file={MAIN}',
    f'--output_dir={output_dir}',
    '--config=trax_revplus.ReversibleSerialTrainer.batch_slices = 3',
  )
  assert code == 2, err
  assert err.strip().splitlines() == [
    'trax-revplus compare: error: BatchSlicesError: trax_revplus.'
    'ReversibleSerialTrainer.batch_slices = 3 does not divide the 8 rows '
    'of the batch each device gets; use one of [1, 2, 4, 8], or a batch '
    'whose rows per device are a multiple of 3.'
  ]
  assert not output_dir.exists()


def _xla_row(out):
  """The "peak device, XLA" row of the printed table: (name, cells)."""
  line = next(
    line for line in out.splitlines() if line.startswith('peak device, XLA')
  )
  name, _, cells = line.partition(')')
  return name + ')', cells.split()


def test_the_xla_row_is_the_default_trainer_s_where_both_sides_ran_it(
  tmp_path, monkeypatch, capsys, check_in_process
):
  """A config with train.use_memory_efficient_trainer = False runs trax's
  default Trainer on both sides: the row shows its figure (12 MiB), not
  the memory-efficient trainers' (8 and 6 MiB)."""
  monkeypatch.setattr(
    compare.runs,
    'run_streaming',
    _fake_runs(
      [], trainers={'stock': DEFAULT_TRAINER, 'revplus': DEFAULT_TRAINER}
    ),
  )
  config = tmp_path / 'c.gin'
  config.write_text(
    _FAKE_CONFIG + 'train.use_memory_efficient_trainer = False\n'
  )
  output_dir = tmp_path / 'cmp'
  code, out, _ = _main(
    capsys,
    'compare',
    f'--config_file={MAIN}',
    f'--config_file={config}',
    f'--output_dir={output_dir}',
  )
  assert code == 0
  assert _xla_row(out) == (
    "peak device, XLA (MiB, trax's default Trainer)",
    ['12', '12', '1'],
  )
  report = json.loads((output_dir / 'compare.json').read_text())
  assert report['xla_peaks'] == {
    k: {
      'trainer': 'default',
      'peak_device_bytes': 12 * _MIB,
      'source': 'estimate',
    }
    for k in ('stock', 'revplus')
  }


def test_no_ratio_beside_a_failed_run(
  tmp_path, monkeypatch, capsys, check_in_process
):
  monkeypatch.setattr(
    compare.runs, 'run_streaming', _fake_runs([], failed=('stock',))
  )
  config = tmp_path / 'c.gin'
  config.write_text(_FAKE_CONFIG)
  code, out, _ = _main(
    capsys,
    'compare',
    f'--config_file={MAIN}',
    f'--config_file={config}',
    f'--output_dir={tmp_path / "cmp"}',
  )
  assert code == 0
  # Ours' figure from estimate; stock's none, and no ratio.
  assert _xla_row(out) == ('peak device, XLA (MiB)', ['failed', '6', '-'])
  table = out.split('== compare:', 1)[1]
  rows = [
    line.split('  ')
    for line in table.splitlines()
    if line.startswith(
      ('first step', 'median later', 'peak host', 'H2D', 'D2H')
    )
  ]
  assert len(rows) == 5
  for row in rows:
    cells = [c.strip() for c in row if c.strip()]
    assert cells[1] == 'failed' and cells[-1] == '-', cells


# compare on a simulated one-chip host, its runs and estimate stand-ins that
# each open JAX's backend in a process of their own: they can only where
# compare's own process holds no backend.
_PARENT = """
import os, subprocess, sys
from trax_revplus import cli
from trax_revplus import compare

def run(command, log_path, prefix, stream):
  del prefix, stream
  probe = subprocess.run([sys.executable, '-c', 'import jax; jax.devices()'],
                         capture_output=True, text=True)
  with open(log_path, 'w') as f:
    f.write(probe.stderr)
  return probe.returncode, probe.stderr

compare.runs.run_streaming = run
sys.exit(cli.main(['trax-revplus', 'compare'] + sys.argv[1:]))
"""


def test_compare_s_own_process_holds_no_backend(tmp_path, one_chip_host):
  output_dir = tmp_path / 'cmp'
  proc = subprocess.run(
    [
      sys.executable,
      '-c',
      _PARENT,
      f'--config_file={MAIN}',
      f'--output_dir={output_dir}',
      '--steps=1',
    ],
    env=one_chip_host,
    cwd=REPO,
    capture_output=True,
    text=True,
    check=False,
  )
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  report = json.loads((output_dir / 'compare.json').read_text())
  assert [report['runs'][k]['status'] for k in ('stock', 'revplus')] == [
    'ok',
    'ok',
  ], report['runs']
  # The stand-in wrote no estimate.json: a failure, one line of the table.
  assert report['device_accounting']['status'] == 'failed'
  assert 'Traceback' not in proc.stdout
