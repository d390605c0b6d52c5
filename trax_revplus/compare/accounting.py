"""Each trainer's XLA-computed device peak: `estimate` on the compared config.

Only trax_revplus's memory-efficient trainer writes a memory log, so the
step's peak device bytes of the other trainers as XLA computes them come
from `trax-revplus estimate` on the same config files and bindings, run in
a fresh process after both trainings (its figures depend on the config
alone, and running it after keeps it out of the runs' timings); its output
goes to estimate.log only, and a failure is one line of the table. Each
side's figure is that of the trainer the side ran (`xla_peak`): a config
with `train.use_memory_efficient_trainer = False` runs trax's default
`Trainer` on both sides. The entry estimate gives compare.json,
`DeviceAccounting`:

  status (str): 'ok', 'failed' (estimate exited non-zero: `error` says why)
    or 'skipped' (`compare --nodevice_accounting`).
  error (str or null): one line.
  backend (str or null): the platform whose figures these are.
  log (str or null): what estimate printed.
  trainers: {'default' | 'stock' | 'revplus': {'peak_device_bytes': int or
    null, 'min_peak_device_bytes': int or null, 'error': str or null}}, empty
    unless 'ok'.
"""

import json
import os
import sys
from typing import Any, Sequence

from trax_revplus.compare import runs

DeviceAccounting = dict[str, Any]
XlaPeak = dict[str, Any]
ESTIMATE_JSON = 'estimate.json'
ESTIMATE_LOG = 'estimate.log'


def estimate_command(
  config_files: Sequence[str], bindings: Sequence[str], json_path: str
) -> list[str]:
  """The `trax-revplus estimate` command line for the compared config."""
  command = [
    sys.executable,
    '-m',
    'trax_revplus.cli',
    'estimate',
    f'--json={json_path}',
  ]
  command += [f'--config_file={os.path.abspath(p)}' for p in config_files]
  command += [f'--config={b}' for b in bindings]
  return command


def skipped() -> DeviceAccounting:
  return {
    'status': 'skipped',
    'error': None,
    'backend': None,
    'log': None,
    'trainers': {},
  }


def run_estimate(
  config_files: Sequence[str], bindings: Sequence[str], output_dir: str
) -> DeviceAccounting:
  """Runs estimate on the config; returns its `DeviceAccounting` entry.

  Args:
    config_files, bindings: as both runs got them.
    output_dir: str, compare's output dir; estimate.json and estimate.log
      (all estimate printed) are written there.

  Returns:
    dict, see the module docstring. An estimate that fails is reported in
    it, not raised: the runs' figures stand without it.
  """
  json_path = os.path.join(output_dir, ESTIMATE_JSON)
  log_path = os.path.join(output_dir, ESTIMATE_LOG)
  exit_code, output = runs.run_streaming(
    estimate_command(config_files, bindings, json_path), log_path, '', None
  )
  entry: dict[str, Any] = {
    'status': 'failed',
    'error': None,
    'backend': None,
    'log': log_path,
    'trainers': {},
  }
  if exit_code != 0:
    entry['error'] = runs.failure_reason(exit_code, output)
    return entry
  try:
    with open(json_path, encoding='utf-8') as f:
      figures = json.load(f)
    trainers = figures['trainers']
  except (OSError, ValueError, KeyError, TypeError) as e:
    entry['error'] = f'cannot read {json_path}: {e}'
    return entry
  entry.update(status='ok', backend=figures.get('backend'))
  for name, row in trainers.items():
    row = row if isinstance(row, dict) else {}
    entry['trainers'][name] = {
      key: row.get(key)
      for key in ('peak_device_bytes', 'min_peak_device_bytes', 'error')
    }
  return entry


def peak_device_bytes(
  accounting: DeviceAccounting | None, trainer: str
) -> int | None:
  """The accounted peak of trainer 'default', 'stock' or 'revplus', or
  None."""
  if not accounting or accounting.get('status') != 'ok':
    return None
  return (accounting['trainers'].get(trainer) or {}).get('peak_device_bytes')


# The trainer class a run reports (its summary's `trainer`), by estimate's
# name for that trainer.
TRAINER_CLASSES = {
  'trax.optimizers.trainer.Trainer': 'default',
  'trax.optimizers.trainer.ReversibleSerialTrainer': 'stock',
  'trax_revplus.trainer.ReversibleSerialTrainer': 'revplus',
}
TRAINER_LABELS = {
  'default': "trax's default Trainer",
  'stock': "stock trax's ReversibleSerialTrainer",
  'revplus': "trax_revplus's ReversibleSerialTrainer",
}


def xla_peak(
  run: dict[str, Any], accounting: DeviceAccounting | None
) -> XlaPeak:
  """The XLA-computed step peak of the trainer `run` ran.

  Args:
    run: a run's entry of compare.json (`runs.collect_run`).
    accounting: `run_estimate`'s entry, or None.

  Returns:
    {'trainer': 'default' | 'stock' | 'revplus' | None (the run failed or
    its trainer is none of the three), 'peak_device_bytes': int or None,
    'source': 'memory_log' (trax_revplus's trainer records it), 'estimate'
    or None}. A failed run has no figure.
  """
  trainer = TRAINER_CLASSES.get(run.get('trainer') or '')
  entry: dict[str, Any] = {
    'trainer': trainer,
    'peak_device_bytes': None,
    'source': None,
  }
  if run['status'] != 'ok' or trainer is None:
    return entry
  logged = (run.get('memory_log') or {}).get('peak_device_bytes')
  if trainer == 'revplus' and logged is not None:
    return dict(entry, peak_device_bytes=logged, source='memory_log')
  accounted = peak_device_bytes(accounting, trainer)
  if accounted is not None:
    entry.update(peak_device_bytes=accounted, source='estimate')
  return entry
