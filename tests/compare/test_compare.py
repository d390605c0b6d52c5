"""trax_revplus.compare's parts: the seed, checkpoint differences, failures,
and where compare.png places the memory log's phase records."""

import json

import numpy as np
import pytest

from trax_revplus import compare
from trax_revplus.memory import step_axis


def test_config_seed_follows_includes_and_bindings(tmp_path):
  (tmp_path / 'base.gin').write_text('train.random_seed = 7\n')
  (tmp_path / 'top.gin').write_text(
    "import no_such_module\ninclude 'base.gin'\ntrain.steps = 3\n"
  )
  (tmp_path / 'plain.gin').write_text('train.steps = 3\n')
  top, plain = str(tmp_path / 'top.gin'), str(tmp_path / 'plain.gin')
  assert compare.config_seed([top], []) == (True, 7)
  assert compare.config_seed([top], ['train.random_seed = 9']) == (True, 9)
  assert compare.config_seed([plain], []) == (False, None)
  assert compare.config_seed([plain], ['train.random_seed = %s']) == (
    True,
    None,
  )


def test_max_abs_diff_finds_a_planted_difference(tmp_path):
  rng = np.random.default_rng(0)
  a = [
    rng.normal(size=(3, 4)).astype(np.float32),
    np.zeros((0,)),
    rng.normal(size=(5,)).astype(np.float32),
  ]
  b = [x.copy() for x in a]
  b[2][3] += 0.25
  # The files as trax.layers.np_to_file writes them: np.save in one gzip.
  import gzip  # pylint: disable=g-import-not-at-top

  for name, arrays in (('a', a), ('b', b)):
    with gzip.open(tmp_path / f'{name}.npy.gz', 'wb') as f:
      for x in arrays:
        np.save(f, x, allow_pickle=False)
  read_a = compare.read_npy_gz(tmp_path / 'a.npy.gz')
  read_b = compare.read_npy_gz(tmp_path / 'b.npy.gz')
  assert [x.shape for x in read_a] == [x.shape for x in a]
  value, reason = compare.max_abs_diff(read_a, read_b)
  assert reason is None
  assert value == pytest.approx(float(np.abs(b[2][3] - a[2][3])))
  assert compare.max_abs_diff(read_a, read_a) == (0.0, None)
  assert compare.max_abs_diff(read_a, read_b[:2])[0] is None
  value, reason = compare.max_abs_diff(read_a, [b[0].T, b[1], b[2]])
  assert value is None and 'array 0: shape (3, 4)' in reason


def test_failure_reason_names_signal_or_last_line():
  assert compare.failure_reason(-9, 'step 1/3 ...\n') == (
    'killed by signal 9: step 1/3 ...'
  )
  assert compare.failure_reason(
    2, 'trax-revplus train: error: config file not found: x.gin\n'
  ) == ('exit 2: trax-revplus train: error: config file not found: x.gin')


def test_png_places_phase_records_where_plot_memory_does(tmp_path):
  lines = [
    {'step': 0, 'phase': 'start'},
    {'step': 1, 'phase': 'forward'},
    {'step': 1, 'phase': 'loss'},
    {'step': 1, 'phase': 'backward'},
    {'step': 1, 'phase': 'step'},
  ]
  (tmp_path / 'memory.jsonl').write_text(
    ''.join(json.dumps(r) + '\n' for r in lines)
  )
  points = compare.png._phase_records({'output_dir': str(tmp_path)})
  # Step 1's three phases inside (0, 1), at i / 4, as plot-memory draws them.
  assert [(r['phase'], x) for x, r in points] == [
    ('forward', 0.25),
    ('loss', 0.5),
    ('backward', 0.75),
  ]
  assert [x for x, _ in points] == step_axis.x_positions(lines)[1:4]


def test_a_run_entry_takes_the_classes_that_ran_from_run_stats(tmp_path):
  """compare.json's trainer and reversible layers of a run are those its
  run_stats.json holds; what the run printed is not read for them."""
  stats = {
    'trainer': 'trax_revplus.trainer.ReversibleSerialTrainer',
    'reversible_layers': 'trax_revplus.layers.ReversibleHalfResidual '
    'x2, trax_revplus.layers.ReversibleSwap x2',
    'steps': [1],
  }
  (tmp_path / 'run_stats.json').write_text(json.dumps(stats))
  output = 'step 1/1  loss 2.000\n\n== summary ==\ntrainer  something else\n'
  run = compare.collect_run(
    'revplus', 0, output, str(tmp_path), str(tmp_path / 'revplus.log'), 1.0
  )
  assert run['trainer'] == stats['trainer']
  assert run['reversible_layers'] == stats['reversible_layers']
  assert run['stats'] == stats


def test_the_train_loss_row_is_the_last_step_s(tmp_path):
  """The table's train loss is each run's last step's, as its summary's
  'train loss, last step' row: n/a where that step's loss was not finite,
  never an earlier step's."""
  losses = {'stock': [5.5, 5.25, 5.125], 'revplus': [5.5, 5.25, None]}
  runs = {}
  for side, loss in losses.items():
    run_dir = tmp_path / side
    run_dir.mkdir()
    stats = {'trainer': None, 'steps': [1, 2, 3], 'loss': loss}
    (run_dir / 'run_stats.json').write_text(json.dumps(stats))
    runs[side] = compare.collect_run(
      side, 0, '', str(run_dir), str(tmp_path / f'{side}.log'), 1.0
    )
  table = compare.format_table(compare.build_report([], [], 3, 0, False, runs))
  (row,) = [line for line in table.splitlines() if 'train loss' in line]
  assert row.split('  ')[0] == 'train loss, last step (nats)'
  assert row.split()[-2:] == [f'{losses["stock"][-1]:.4f}', 'n/a']


def test_step_floor_rows_and_the_stock_baselines_fix(tmp_path):
  """Runs that measured their step floor get its rows: each side's floor,
  its median step over it and its TFLOP/s; the stock run names the one
  change current JAX required of it."""
  floors = {'stock': 0.5, 'revplus': 0.25}
  runs = {}
  for side, seconds in floors.items():
    run_dir = tmp_path / side
    run_dir.mkdir()
    stats = {
      'trainer': 'trax.optimizers.trainer.ReversibleSerialTrainer'
      if side == 'stock'
      else 'trax_revplus.trainer.ReversibleSerialTrainer',
      'trainer_fix': "its Loop's RNG on the step's device"
      if side == 'stock'
      else None,
      'steps': [1, 2, 3],
      'loss': [5.0, 4.0, 3.0],
      'median_step_seconds': 1.0,
      'step_floor': {'step_floor_seconds': seconds, 'flops_per_step': 2e12},
    }
    (run_dir / 'run_stats.json').write_text(json.dumps(stats))
    runs[side] = compare.collect_run(
      side, 0, '', str(run_dir), str(tmp_path / f'{side}.log'), 1.0
    )
  table = compare.format_table(compare.build_report([], [], 3, 0, False, runs))
  rows = {line.split('  ')[0]: line.split()[-3:] for line in table.splitlines()}
  assert rows['step floor (s)'] == ['0.500', '0.250', '0.5']
  assert rows['median step / floor'] == ['floor', '2', '4']
  assert rows['TFLOP/s, median step'] == ['2', '2', '1']
  assert (
    "  trainer fix        its Loop's RNG on the step's device (as current "
    'JAX requires)'
  ) in table.splitlines()
