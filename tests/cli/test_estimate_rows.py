"""What each of `estimate`'s rows says: a trainer whose first step would
fail, the devices each was accounted on, and a note where `train` would
not run trax_revplus's plan.

The table and JSON are checked on figures made here (the accounting is
checked against real steps in tests/device_memory); the trainer `train`
would run is read from the parsed config as `train` reads it. The slow
test runs `estimate --n_devices=2` on 2 forced CPU devices in a fresh
process, with trax's default Trainer's own first step on those devices as
the reference that it cannot run there.
"""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from cli_cases import MAIN
from cli_cases import STOCK
from cli_cases import TINY_MODEL
from trax_revplus import device_memory
from trax_revplus.cli import estimate
from trax_revplus.cli import estimate_report
from trax_revplus.cli import gin_config

pytestmark = pytest.mark.usefixtures('stock_trax_and_empty_gin')

REPO = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
BATCH = (jax.ShapeDtypeStruct((2, 32), np.int32),)


def _memory(name, peak_bytes, **kwargs):
  program = device_memory.ProgramMemory(0, 0, 0, peak_bytes)
  step = device_memory.compose([device_memory.Call('step', 'step', program)])
  return device_memory.TrainerMemory(
    name, 'cpu', kwargs.pop('n_devices', 1), step, **kwargs
  )


def _results():
  return {
    'default': _memory(
      'default', 100, max_devices=1, weights_and_slots_on_host=False
    ),
    'stock': _memory(
      'stock',
      50,
      max_devices=1,
      step_error='Attempt to donate the same buffer twice (...)',
    ),
    'revplus': _memory('revplus', 40, n_devices=2),
  }


def _row(report, name):
  return next(
    line for line in report.splitlines() if line.startswith(f'{name} ')
  )


def test_each_row_says_whether_it_runs_and_on_how_many_devices():
  report = estimate_report.table('cpu', _results(), None, BATCH, 1000, 2)
  assert _row(report, 'stock') == (
    'stock    fails at step 1: Attempt to donate the same buffer twice (...)'
  )
  assert _row(report, 'default').endswith('yes  1 device only')
  assert _row(report, 'revplus').endswith('yes  2')
  assert 'note:' not in report
  data = estimate_report.to_json('cpu', _results(), None, 1000, 2)
  stock, default, rev = (
    data['trainers'][n] for n in ('stock', 'default', 'revplus')
  )
  assert stock['runs'] is False and stock['fits'] is False
  assert stock['error'].startswith('Attempt to donate the same buffer twice')
  assert stock['peak_device_bytes'] == 50  # What the step would have needed.
  assert (default['runs'], default['n_devices'], default['max_devices']) == (
    True,
    1,
    1,
  )
  assert (rev['runs'], rev['n_devices'], rev['max_devices']) == (True, 2, None)
  assert 'error' not in rev and data['train_runs'] == 'revplus'


def test_rows_show_host_bytes_and_a_trainer_the_backend_refuses():
  """A trainer's peak host bytes (the process's) stand in its row; one
  whose program the backend refused to compile for memory does not fit
  this device, whatever its memory."""
  results = _results()
  program = device_memory.ProgramMemory(0, 0, 0, 40)
  host = device_memory.Held('weights, slots and state', 3 * 2**20)
  step = device_memory.compose(
    [
      device_memory.Call(
        'step', 'step', program, (), (host,), devices_on_host=1
      )
    ]
  )
  results['revplus'] = device_memory.TrainerMemory('revplus', 'cpu', 1, step)
  results['default'] = device_memory.account(
    'default',
    'cpu',
    1,
    lambda: (_ for _ in ()).throw(
      device_memory.ProgramOutOfMemoryError(
        'JaxRuntimeError: RESOURCE_EXHAUSTED: ...',
        'update (forward, backward, optimizer)',
        2**34,
      )
    ),
  )
  report = estimate_report.table('cpu', results, None, BATCH, 1000, 1)
  header = next(
    line for line in report.splitlines() if line.startswith('trainer')
  )
  assert 'peak host/step' in header
  assert step.peak_host_bytes == 3 * 2**20 + 40
  assert '3.0 MiB' in _row(report, 'revplus')
  assert _row(report, 'default') == (
    'default  does not fit this device: the backend refused to compile '
    'update (forward, backward, optimizer) for memory, needing at least '
    '17179869184 bytes (16.0 GiB): JaxRuntimeError: RESOURCE_EXHAUSTED: '
    '...'
  )
  data = estimate_report.to_json('cpu', results, None, 1000, 1)
  assert data['trainers']['revplus']['peak_host_bytes'] == 3 * 2**20 + 40
  assert data['trainers']['revplus']['peak_host_parts_bytes'] == {
    'weights, slots and state': 3 * 2**20,
    'device buffers (host memory here)': 40,
  }
  default = data['trainers']['default']
  assert (default['runs'], default['fits'], default['least_device_bytes']) == (
    False,
    False,
    2**34,
  )


@pytest.mark.parametrize(
  'config_file,bindings,runs',
  [
    (MAIN, [], 'revplus'),
    (MAIN, ['train.use_memory_efficient_trainer = False'], 'default'),
    (STOCK, [], 'stock'),
  ],
)
def test_a_note_names_the_trainer_train_would_run(config_file, bindings, runs):
  gin_config.import_trax_quietly()
  gin_config.parse_configs([config_file], bindings)
  assert estimate.train_runs() == runs
  report = estimate_report.table(
    'cpu', _results(), None, BATCH, 1000, 1, runs=runs
  )
  notes = [line for line in report.splitlines() if line.startswith('note:')]
  if runs == 'revplus':
    assert not notes
  else:
    assert len(notes) == 1 and f'(the {runs} row)' in notes[0], notes
  assert (
    estimate_report.to_json('cpu', _results(), None, 1000, 1, runs=runs)[
      'train_runs'
    ]
    == runs
  )


_TWO_DEVICES = r"""
import sys
from trax import fastmath, layers as tl, optimizers, shapes
import numpy as np
from trax_revplus import cli
code = cli.main(['trax-revplus', 'estimate', '--config_file=' + sys.argv[1],
                 '--n_devices=2', '--json=' + sys.argv[2]] +
                ['--config=' + b for b in sys.argv[3:]])
assert code == 0, code
# The reference: trax's default Trainer's own first step on 2 devices.
model = tl.Serial(tl.Embedding(9, 4), tl.Dense(9), tl.LogSoftmax())
loss = tl.Serial(model, tl.CrossEntropyLoss())
x = np.ones((2, 4), np.int32)
batch = (x, x, np.ones((2, 4), np.float32))
loss.init(tuple(shapes.ShapeDtype(b.shape, b.dtype) for b in batch))
opt = optimizers.Adam()
opt.tree_init(loss.weights)
try:
  optimizers.Trainer(loss, opt, n_devices=2).one_step(
      batch, fastmath.random.get_prng(0), step=1)
  print('DEFAULT_TRAINER_RAN')
except Exception as e:  # pylint: disable=broad-except
  print('DEFAULT_TRAINER_FAILED', type(e).__name__, e)
"""


@pytest.mark.slow
def test_two_devices_rows(tmp_path):
  path = tmp_path / 'estimate.json'
  env = dict(os.environ)
  env['XLA_FLAGS'] = (
    env.get('XLA_FLAGS', '') + ' --xla_force_host_platform_device_count=2'
  ).strip()
  env['PYTHONPATH'] = REPO + os.pathsep + env.get('PYTHONPATH', '')
  proc = subprocess.run(
    [
      sys.executable,
      '-c',
      _TWO_DEVICES,
      MAIN,
      str(path),
      'sequence_length = 32',
    ]
    + TINY_MODEL,
    capture_output=True,
    text=True,
    env=env,
    cwd=REPO,
    timeout=900,
    check=False,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  report = proc.stdout
  assert 'asked for 2 device(s)' in report
  assert _row(report, 'default').endswith('1 device only'), report
  assert _row(report, 'stock').endswith('1 device only'), report
  assert _row(report, 'revplus').endswith('  2'), report
  data = json.loads(path.read_text())
  assert data['n_devices'] == 2
  assert data['trainers']['revplus']['n_devices'] == 2
  for name in ('default', 'stock'):
    figures = data['trainers'][name]
    assert (figures['n_devices'], figures['max_devices']) == (1, 1)
  # trax's default Trainer indeed cannot step on 2 devices here.
  assert 'DEFAULT_TRAINER_FAILED' in report, report[-2000:]
