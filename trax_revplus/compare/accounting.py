"""Each trainer's XLA-computed device peak: `estimate` on the compared config.

Stock trax writes no memory log, so its step's peak device bytes as XLA
computes them come from `trax-revplus estimate` on the same config files and
bindings, run in a fresh process after both trainings (its figures depend on
the config alone, and running it after keeps it out of the runs' timings).
The entry it gives compare.json, `DeviceAccounting`:

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
from typing import Any, Sequence, TextIO

from trax_revplus.compare import runs

DeviceAccounting = dict[str, Any]
ESTIMATE_JSON = 'estimate.json'
ESTIMATE_LOG = 'estimate.log'


def estimate_command(config_files: Sequence[str], bindings: Sequence[str],
                     json_path: str) -> list[str]:
  """The `trax-revplus estimate` command line for the compared config."""
  command = [sys.executable, '-m', 'trax_revplus.cli', 'estimate',
             f'--json={json_path}']
  command += [f'--config_file={os.path.abspath(p)}' for p in config_files]
  command += [f'--config={b}' for b in bindings]
  return command


def skipped() -> DeviceAccounting:
  return {'status': 'skipped', 'error': None, 'backend': None, 'log': None,
          'trainers': {}}


def run_estimate(config_files: Sequence[str], bindings: Sequence[str],
            output_dir: str, stream: TextIO) -> DeviceAccounting:
  """Runs estimate on the config; returns its `DeviceAccounting` entry.

  Args:
    config_files, bindings: as both runs got them.
    output_dir: str, compare's output dir; estimate.json and estimate.log
      are written there.
    stream: where estimate's output is copied, each line prefixed
      '[estimate] '.

  Returns:
    dict, see the module docstring. An estimate that fails is reported in
    it, not raised: the runs' figures stand without it.
  """
  json_path = os.path.join(output_dir, ESTIMATE_JSON)
  log_path = os.path.join(output_dir, ESTIMATE_LOG)
  exit_code, output = runs.run_streaming(
      estimate_command(config_files, bindings, json_path), log_path,
      '[estimate] ', stream)
  entry = {'status': 'failed', 'error': None, 'backend': None,
           'log': log_path, 'trainers': {}}
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
        key: row.get(key) for key in ('peak_device_bytes',
                                      'min_peak_device_bytes', 'error')}
  return entry


def peak_device_bytes(accounting: DeviceAccounting | None,
                      implementation: str) -> int | None:
  """The accounted peak of 'stock' or 'revplus' (estimate's name for ours
  is 'revplus' too), or None."""
  if not accounting or accounting.get('status') != 'ok':
    return None
  return (accounting['trainers'].get(implementation) or {}).get(
      'peak_device_bytes')
