"""End-to-end check of `trax-revplus compare` with its real processes.

Runs `trax-revplus compare` on the tiny main job (gin_configs/
reformer_char_lm.gin with a 1-layer model, 2 steps) as a user would: it
trains stock trax, then trax_revplus, each in a fresh process, then runs
`trax-revplus estimate` on the same config. The suite checks compare's
orchestration with stand-in runs (tests/cli/test_compare_command.py); this
checks the real runs:

  1. compare exits 0; both runs ended 'ok' with exit status 0 and a
     non-empty log;
  2. the stock run trained with stock classes (trainer and reversible
     layers), though the config activates trax_revplus; ours with
     trax_revplus's; the seed is the config's (0); 2 steps;
  3. same seed, same data: the losses agree at both steps (atol 1e-5) and
     the final weights and slots too (max abs difference < 1e-5);
  4. each run's figures: a step time per step, the first and the median
     step time, peak host RSS and peak device bytes at least the per-step
     figures; H2D bytes counted for ours only (stock's null, not zero);
  5. the printed table (final weights line, H2D row with n/a) and a
     compare.png of at least 600x400 pixels;
  6. device accounting from estimate: stock's XLA step peak > 0, ours equal
     to the peak in our memory log, and the table's "peak device, XLA" row
     shows both and their ratio;
  7. the same config trained with trax's default Trainer
     (tests/gin_configs/configs/default_trainer_tiny.gin): both runs ran
     that trainer, and the "peak device, XLA" row shows its figure from
     estimate on both sides, not the memory-efficient trainers'.

Both compares run on a simulated one-chip host (tests/one_chip/: a process
that opens JAX's backend while another holds it fails, as on a TPU), so
that compare's own process must hold none and its runs must run one after
another.

Prints one PASS or FAIL line per check; exit status 0 when all pass, 1
otherwise.

Usage:
  python tools/compare_smoke.py [--work_dir=DIR]

Takes minutes: each of the 10 processes imports trax (~20-60 s on a busy
machine).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from smoke_checks import Checks

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(_REPO, 'tests'))
import one_chip_host  # pylint: disable=g-import-not-at-top,wrong-import-position

_CONFIG = os.path.join(_REPO, 'gin_configs', 'reformer_char_lm.gin')
# trax's default Trainer on the tiny main job.
_DEFAULT_TRAINER_CONFIG = os.path.join(
  _REPO, 'tests', 'gin_configs', 'configs', 'default_trainer_tiny.gin'
)
# The config has the activation line, so the stock run trains with stock
# classes only because of --implementation=stock. compare binds train.steps
# itself.
_TINY = [
  'train.eval_frequency = 2',
  'sequence_length = 32',
  'eval_steps = 1',
  'local_text_inputs.batch_size = 2',
  'local_text_inputs.eval_batch_size = 2',
  'ReformerLM.n_layers = 1',
  'ReformerLM.d_model = 16',
  'ReformerLM.d_ff = 32',
  'ReformerLM.n_heads = 2',
  'ReformerLM.d_attention_key = 8',
  'ReformerLM.d_attention_value = 8',
]
_PNG_MAGIC = b'\x89PNG\r\n\x1a\n'
_STOCK_TRAINER = 'trax.optimizers.trainer.ReversibleSerialTrainer'
_DEFAULT_TRAINER = 'trax.optimizers.trainer.Trainer'
_OUR_TRAINER = 'trax_revplus.trainer.ReversibleSerialTrainer'
_TOLERANCE = 1e-5
_MIB = 1 << 20


def _png_size(path):
  """(height, width) of the PNG at `path`, or None if it is not a PNG."""
  with open(path, 'rb') as f:
    if f.read(8) != _PNG_MAGIC:
      return None
  from matplotlib import image  # pylint: disable=g-import-not-at-top

  return image.imread(path).shape[:2]


def _check_runs(checks, report):
  stock, ours = report['runs']['stock'], report['runs']['revplus']
  for name, run in (('stock', stock), ('revplus', ours)):
    checks.check(
      f'{name} run ok with exit status 0',
      run['status'] == 'ok' and run['exit_code'] == 0,
      str(run['error']),
    )
    checks.check(
      f'{name} run wrote its log',
      os.path.exists(run['log']) and os.path.getsize(run['log']) > 0,
      run['log'],
    )
  checks.check(
    "stock run trained with stock trax's trainer",
    stock['trainer'] == _STOCK_TRAINER,
    str(stock['trainer']),
  )
  layers = stock['reversible_layers'] or ''
  checks.check(
    'stock run used stock reversible layers only',
    'trax.layers.reversible.ReversibleHalfResidual x2' in layers
    and 'trax_revplus' not in layers,
    layers,
  )
  checks.check(
    'revplus run trained with our trainer',
    ours['trainer'] == _OUR_TRAINER,
    str(ours['trainer']),
  )
  checks.check(
    'revplus run used our reversible layers',
    'trax_revplus.layers.ReversibleHalfResidual x2'
    in (ours['reversible_layers'] or ''),
    str(ours['reversible_layers']),
  )
  checks.check(
    "the config's seed 0 and 2 steps",
    report['seed'] == 0 and report['seed_from_config'] and report['steps'] == 2,
    f'seed {report["seed"]} ({report["seed_from_config"]}), '
    f'steps {report["steps"]}',
  )


def _check_same_training(checks, report):
  """Same seed, same data: same losses, final weights and slots."""
  stock, ours = report['runs']['stock'], report['runs']['revplus']
  checks.check(
    'both runs recorded steps [1, 2]',
    stock['stats']['steps'] == ours['stats']['steps'] == [1, 2],
    f'{stock["stats"]["steps"]}, {ours["stats"]["steps"]}',
  )
  checks.check(
    f'losses agree at every step (atol {_TOLERANCE})',
    np.allclose(
      ours['stats']['loss'], stock['stats']['loss'], rtol=0, atol=_TOLERANCE
    )
    and report['loss_steps_compared'] == 2
    and report['loss_max_abs_diff'] < _TOLERANCE,
    f'{ours["stats"]["loss"]} vs {stock["stats"]["loss"]}; '
    f'{report["loss_steps_compared"]} compared, max diff '
    f'{report["loss_max_abs_diff"]}',
  )
  for key in ('final_weights', 'final_slots'):
    r = report[key]
    checks.check(
      f'{key} agree (max abs difference < {_TOLERANCE})',
      r['reason'] is None
      and r['n_arrays'] > 0
      and r['max_abs_diff'] < _TOLERANCE,
      str(r),
    )


def _check_figures(checks, report):
  stock, ours = report['runs']['stock'], report['runs']['revplus']
  for name, run in (('stock', stock), ('revplus', ours)):
    s = run['stats']
    checks.check(
      f'{name}: a step time per step, first and median',
      len(s['step_seconds']) == 2
      and s['first_step_seconds'] == s['step_seconds'][0] > 0
      and s['median_step_seconds'] == s['step_seconds'][1] > 0,
      f'{s["step_seconds"]}, {s["first_step_seconds"]}, '
      f'{s["median_step_seconds"]}',
    )
    checks.check(
      f"{name}: peak host RSS at least every step's",
      s['peak_host_rss_bytes'] >= max(s['host_rss_bytes']) > 0,
      f'{s["peak_host_rss_bytes"]} vs {s["host_rss_bytes"]}',
    )
    checks.check(
      f"{name}: peak device bytes > 0 and at least every step's",
      s['peak_device_bytes'] >= max(s['device_bytes_in_use'])
      and s['peak_device_bytes'] > 0,
      f'{s["peak_device_bytes"]} vs {s["device_bytes_in_use"]}',
    )
  # Only trax_revplus counts its copies; stock has no figure, not a zero.
  checks.check(
    'stock has no H2D figure (null, not zero)',
    stock['stats']['total_h2d_bytes'] is None
    and stock['stats']['h2d_bytes'] is None,
    f'{stock["stats"]["total_h2d_bytes"]}',
  )
  checks.check(
    'revplus counts its H2D bytes, total = sum per step > 0',
    ours['stats']['total_h2d_bytes'] == sum(ours['stats']['h2d_bytes'])
    and ours['stats']['total_h2d_bytes'] > 0,
    f'{ours["stats"]["total_h2d_bytes"]} vs {ours["stats"]["h2d_bytes"]}',
  )


def _check_output(checks, report, out, output_dir):
  """The printed table, the PNG and estimate's device accounting."""
  checks.check(
    'the final weights line is printed',
    'final weights: max abs difference' in out,
    out[-2000:],
  )
  table = out.split('== compare:', 1)[1] if '== compare:' in out else ''
  checks.check(
    'the table has an H2D row with n/a for stock',
    'H2D copied (MiB)' in table and 'n/a' in table,
    table,
  )
  png = os.path.join(output_dir, 'compare.png')
  size = _png_size(png) if os.path.exists(png) else None
  checks.check(
    'compare.png is a PNG of at least 600x400',
    size is not None and size[0] >= 400 and size[1] >= 600,
    str(size),
  )
  # Stock's step peak as XLA computes it, from estimate on the same config;
  # ours as its memory log recorded it, which is estimate's too.
  accounted = report['device_accounting']
  if not checks.check(
    'estimate accounted both trainers',
    accounted['status'] == 'ok',
    str(accounted['error']),
  ):
    return
  stock_peak = accounted['trainers']['stock']['peak_device_bytes']
  ours_peak = report['runs']['revplus']['memory_log']['peak_device_bytes']
  checks.check("stock's XLA step peak > 0", stock_peak > 0, str(stock_peak))
  checks.check(
    "ours' memory log peak equals estimate's",
    ours_peak == accounted['trainers']['revplus']['peak_device_bytes'],
    f'{ours_peak} vs {accounted["trainers"]["revplus"]["peak_device_bytes"]}',
  )
  row = next(
    (
      line
      for line in table.splitlines()
      if line.startswith('peak device, XLA (MiB)')
    ),
    '',
  )
  want = (
    [
      f'{stock_peak / _MIB:.4g}',
      f'{ours_peak / _MIB:.4g}',
      f'{ours_peak / stock_peak:.3g}',
    ]
    if stock_peak
    else None
  )
  checks.check(
    "the table's XLA peak row: stock, ours and their ratio",
    row.split()[4:7] == want,
    f'{row!r}, want {want}',
  )


def _check_default_trainer(checks, work):
  """compare where both sides run trax's default Trainer."""
  output_dir = os.path.join(work, 'cmp_default')
  proc = _compare(
    work,
    [
      f'--config_file={_CONFIG}',
      f'--config_file={_DEFAULT_TRAINER_CONFIG}',
      '--steps=2',
      f'--output_dir={output_dir}',
    ],
  )
  if not checks.check(
    'default Trainer: compare exits 0',
    proc.returncode == 0,
    f'status {proc.returncode}',
  ):
    print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
    return
  with open(os.path.join(output_dir, 'compare.json')) as f:
    report = json.load(f)
  runs = report['runs']
  checks.check(
    "default Trainer: both runs ran trax's default Trainer",
    [runs[k]['trainer'] for k in ('stock', 'revplus')]
    == [_DEFAULT_TRAINER] * 2,
    str([runs[k]['trainer'] for k in ('stock', 'revplus')]),
  )
  accounted = report['device_accounting']
  if not checks.check(
    'default Trainer: estimate accounted it',
    accounted['status'] == 'ok',
    str(accounted['error']),
  ):
    return
  peak = accounted['trainers']['default']['peak_device_bytes']
  want = {'trainer': 'default', 'peak_device_bytes': peak, 'source': 'estimate'}
  checks.check(
    "default Trainer: each side's XLA peak is that trainer's",
    bool(peak) and report['xla_peaks'] == {'stock': want, 'revplus': want},
    str(report['xla_peaks']),
  )
  row = next(
    (
      line
      for line in proc.stdout.splitlines()
      if line.startswith('peak device, XLA')
    ),
    '',
  )
  name = "peak device, XLA (MiB, trax's default Trainer)"
  cells = row[len(name) :].split()
  checks.check(
    'default Trainer: the row names it, its figure on both sides',
    row.startswith(name)
    and bool(peak)
    and cells == [f'{peak / _MIB:.4g}'] * 2 + ['1'],
    repr(row),
  )


def _compare(work, args):
  """`trax-revplus compare` with `args`, on a simulated one-chip host."""
  env = one_chip_host.env(os.path.join(work, 'one_chip.lock'))
  return subprocess.run(
    [sys.executable, '-m', 'trax_revplus.cli', 'compare'] + args,
    capture_output=True,
    text=True,
    cwd=_REPO,
    check=False,
    env=env,
  )


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument(
    '--work_dir',
    default=None,
    help='Where compare writes (default: a temporary '
    'directory, removed at the end).',
  )
  flags = parser.parse_args()
  checks = Checks()
  with tempfile.TemporaryDirectory() as tmp:
    work = flags.work_dir or tmp
    os.makedirs(work, exist_ok=True)
    output_dir = os.path.join(work, 'cmp')
    proc = _compare(
      work,
      [f'--config_file={_CONFIG}', '--steps=2', f'--output_dir={output_dir}']
      + [f'--config={b}' for b in _TINY],
    )
    if checks.check(
      'compare exits 0', proc.returncode == 0, f'status {proc.returncode}'
    ):
      with open(os.path.join(output_dir, 'compare.json')) as f:
        report = json.load(f)
      _check_runs(checks, report)
      if all(r['status'] == 'ok' for r in report['runs'].values()):
        _check_same_training(checks, report)
        _check_figures(checks, report)
        _check_output(checks, report, proc.stdout, output_dir)
    else:
      print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
    _check_default_trainer(checks, work)
  print(
    f'{"FAIL" if checks.failed else "PASS"} compare smoke: '
    f'{len(checks.failed)} check(s) failed',
    flush=True,
  )
  return 1 if checks.failed else 0


if __name__ == '__main__':
  sys.exit(main())
