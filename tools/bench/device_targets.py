"""Device memory, parent side: the figures per config and their targets.

Every accounting runs in a fresh process (`device_account`), started
through the entry script; the targets compare their figures.
"""

import json
import os
import subprocess
import sys
import time

from tools.bench import configs
from tools.bench import protocol

_ROOT = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
# The main job `trax-revplus estimate` is timed on.
_MAIN_JOB = os.path.join(_ROOT, 'gin_configs', 'reformer_char_lm.gin')
# Gin configs planned under a budget of stock's own peak (by `estimate`):
# the main job and trax's copy-task Terraformers (their CPU overrides).
GIN_CONFIGS = (
  'gin_configs/reformer_char_lm.gin',
  'gin_configs/trax/terraformer_copy_cpu.gin',
  'gin_configs/trax/terraformer_copy_self_attn_cpu.gin',
  'gin_configs/trax/terraformer_purelsh_copy_cpu.gin',
)


def device_memory_run(request):
  """Runs `device_account.device_memory_child(request)` in a fresh process;
  returns its {spec: figures}."""
  proc = subprocess.Popen(
    protocol.command(f'--device_memory_child={json.dumps(request)}'),
    stdout=subprocess.PIPE,
    text=True,
  )
  result = protocol.receive(proc, f'device memory {request}')
  proc.wait()
  return result


def _longest_sequence(quick, budget, seq_lengths):
  """The longest l6-family sequence each trainer's step fits `budget` in:
  (longest {trainer: length}, per_length {length: figures}).

  Stops after the first length at which no trainer fits.
  """
  longest, per_length = {}, {}
  for length in [int(n) for n in seq_lengths]:
    spec = f'ours+device_memory_budget_bytes={budget}'
    r = device_memory_run(
      dict(
        config='l6',
        quick=quick,
        length=length,
        trainers=['default', 'stock', spec],
      )
    )
    per_length[length] = r
    fits_now = {}
    for trainer, key in (
      ('default', 'default'),
      ('stock', 'stock'),
      ('ours', spec),
    ):
      p = r.get(key, {}).get('peak_device_bytes')
      fits_now[trainer] = p is not None and p <= budget
      if fits_now[trainer]:
        longest[trainer] = length
    if not any(fits_now.values()):
      break
  return longest, per_length


def _estimate(config_file, device_memory_bytes=None):
  """`trax-revplus estimate --json` of a gin config: its JSON, or
  {'error': the last lines of its output}."""
  import tempfile  # pylint: disable=g-import-not-at-top

  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, 'estimate.json')
    args = [
      sys.executable,
      '-m',
      'trax_revplus.cli',
      'estimate',
      f'--config_file={os.path.join(_ROOT, config_file)}',
      f'--json={path}',
    ]
    if device_memory_bytes is not None:
      args.append(f'--device_memory={device_memory_bytes}')
    proc = subprocess.run(args, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
      return {'error': (proc.stderr or proc.stdout)[-500:]}
    with open(path) as f:
      return json.load(f)


def gin_configs_at_stock_peak(config_files=GIN_CONFIGS):
  """Per gin config: each trainer's peak and least bytes, and ours planned
  under a budget of stock's own peak: {config: {'stock_peak_device_bytes',
  'ours_at_stock_peak': revplus figures, 'fits': bool} or {'error'}}."""
  out = {}
  for config_file in config_files:
    first = _estimate(config_file)
    stock = first.get('trainers', {}).get('stock', {})
    if 'peak_device_bytes' not in stock:
      out[config_file] = {'error': first.get('error') or stock.get('error')}
      continue
    budget = stock['peak_device_bytes']
    second = _estimate(config_file, budget)
    ours = second.get('trainers', {}).get('revplus', {'error': 'no figures'})
    out[config_file] = {
      'trainers': {
        name: {
          k: t.get(k)
          for k in ('peak_device_bytes', 'min_peak_device_bytes', 'error')
        }
        for name, t in first['trainers'].items()
      },
      'stock_peak_device_bytes': budget,
      'ours_at_stock_peak': ours,
      'fits': bool(ours.get('fits')),
    }
  return out


def _time_estimate(targets):
  """Times `trax-revplus estimate` on the main job into `targets`."""
  t0 = time.perf_counter()
  proc = subprocess.run(
    [
      sys.executable,
      '-m',
      'trax_revplus.cli',
      'estimate',
      f'--config_file={_MAIN_JOB}',
    ],
    capture_output=True,
    text=True,
    check=False,
  )
  targets['estimate_main_job_seconds'] = time.perf_counter() - t0
  targets['estimate_main_job_ok'] = proc.returncode == 0
  targets['estimate_main_job_output'] = (
    proc.stdout if proc.returncode == 0 else proc.stderr[-2000:]
  )


def device_memory_targets(
  names, quick, seq_device_memory_bytes, seq_lengths, estimate_main_job
):
  """The device-memory figures and targets (bytes per device, XLA CPU).

  * per config: each trainer's peak and least; ours under a budget of
    stock's own peak (must fit); ours' least on l6 <= 0.5x stock's peak;
  * depth: ours' peak at l24 / l6 (same plan) <= 1.05, the default
    Trainer's ratio beside;
  * longest sequence of the l6 family whose step fits
    `seq_device_memory_bytes`: ours (planning under that budget) at least
    4x stock's and 4x the default Trainer's;
  * ours' accounted peak == the peak_device_bytes its memory log records
    for a real step;
  * `trax-revplus estimate` on the main job config: wall seconds (< 60),
    with `estimate_main_job`.

  Args:
    names: config names.
    quick: whether configs are scaled down (`--quick`).
    seq_device_memory_bytes: the longest-sequence target's device memory.
    seq_lengths: the lengths tried for it (str or int).
    estimate_main_job: whether to time `trax-revplus estimate`.

  Returns:
    {'configs': {name: {spec: figures}}, 'targets': {...}}.
  """
  out = {'configs': {}, 'targets': {}}
  for name in names:
    request = dict(
      config=name, quick=quick, trainers=list(configs.TRAINERS), memory_log=True
    )
    figures = device_memory_run(request)
    stock_peak = figures.get('stock', {}).get('peak_device_bytes')
    if stock_peak:
      spec = f'ours+device_memory_budget_bytes={stock_peak}'
      figures['ours_at_stock_peak'] = device_memory_run(
        dict(config=name, quick=quick, trainers=[spec])
      )[spec]
    out['configs'][name] = figures
  t = out['targets']
  c = out['configs']
  peak = lambda name, trainer: (
    c.get(name, {}).get(trainer, {}).get('peak_device_bytes')
  )
  if peak('l6', 'ours') and peak('l24', 'ours'):
    t['depth_ours_l24_over_l6'] = peak('l24', 'ours') / peak('l6', 'ours')
    t['depth_ours_met'] = t['depth_ours_l24_over_l6'] <= 1.05
    if peak('l6', 'default') and peak('l24', 'default'):
      t['depth_default_l24_over_l6'] = peak('l24', 'default') / peak(
        'l6', 'default'
      )
  t['ours_fits_stock_peak'] = {
    name: 'error' not in f.get('ours_at_stock_peak', {'error': 1})
    for name, f in c.items()
  }
  least = lambda name, trainer: (
    c.get(name, {}).get(trainer, {}).get('min_peak_device_bytes')
  )
  if least('l6', 'ours') and peak('l6', 'stock'):
    t['least_ours_over_stock_l6'] = least('l6', 'ours') / peak('l6', 'stock')
    t['least_ours_over_stock_l6_met'] = t['least_ours_over_stock_l6'] <= 0.5
  t['estimate_equals_memory_log'] = {
    name: f.get('ours', {}).get('peak_device_bytes')
    == f.get('ours', {}).get('logged_peak_device_bytes')
    for name, f in c.items()
  }
  budget = seq_device_memory_bytes
  longest, per_length = _longest_sequence(quick, budget, seq_lengths)
  t['longest_sequence'] = dict(
    device_memory_bytes=budget, longest=longest, per_length=per_length
  )
  if longest.get('ours') and longest.get('default'):
    t['longest_sequence_met'] = (
      longest['ours'] >= 4 * longest.get('stock', 0)
      and longest['ours'] >= 4 * longest['default']
    )
  if not quick:  # full-size configs: minutes of compiling
    out['gin_configs'] = gin_configs_at_stock_peak()
    t['gin_configs_fit_stock_peak'] = {
      name: g.get('fits', False) for name, g in out['gin_configs'].items()
    }
  if estimate_main_job:
    _time_estimate(t)
  return out
