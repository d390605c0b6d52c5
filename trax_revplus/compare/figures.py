"""The figures compare.json holds: checkpoint differences, the report."""

import gzip
import os
from typing import Any, Sequence

import numpy as np

from trax_revplus.compare import accounting
from trax_revplus.compare import exactness
from trax_revplus.compare.accounting import DeviceAccounting
from trax_revplus.compare.common import IMPLEMENTATIONS
from trax_revplus.compare.common import LABELS
from trax_revplus.compare.common import Report
from trax_revplus.compare.common import Run


def read_npy_gz(path: str | os.PathLike) -> list[np.ndarray]:
  """Reads the arrays of a trax `.npy.gz` checkpoint file.

  Mirrors `trax.layers.np_from_file` (the same format: `np.save`d arrays
  one after another in one gzip stream) without importing trax (seconds of CPU).

  Args:
    path: str, e.g. `<output_dir>/model.weights.npy.gz`.

  Returns:
    list of numpy arrays, in file order.

  Raises:
    OSError: the file is missing or not gzip; ValueError: an entry is not
    an array saved by `np.save`.
  """
  arrays = []
  with gzip.open(path, 'rb') as f:
    while True:
      try:
        arrays.append(np.load(f, allow_pickle=False))
      except EOFError:
        break
  return arrays


def max_abs_diff(
  a_arrays: Sequence[np.ndarray], b_arrays: Sequence[np.ndarray]
) -> tuple[float | None, str | None]:
  """Max |a - b| over all elements of two equally shaped lists of arrays.

  Args:
    a_arrays, b_arrays: lists of numpy arrays.

  Returns:
    (value, reason): value is a float (0.0 for two empty lists) or None;
    reason (str or None) says why there is no value (the lists differ in
    length, or an array pair in shape).
  """
  if len(a_arrays) != len(b_arrays):
    return None, (
      f'different number of arrays: {len(a_arrays)} (stock) vs '
      f'{len(b_arrays)} (trax_revplus)'
    )
  worst = 0.0
  for i, (a, b) in enumerate(zip(a_arrays, b_arrays)):
    if a.shape != b.shape:
      return None, f'array {i}: shape {a.shape} (stock) vs {b.shape}'
    if a.size:
      diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
      worst = max(worst, float(np.max(diff)))
  return worst, None


def checkpoint_diff(runs: dict[str, Run], filename: str) -> dict[str, Any]:
  """Compares one checkpoint file of the two runs.

  Args:
    runs: {'stock': RUN, 'revplus': RUN} (see `collect_run`).
    filename: str, e.g. 'model.weights.npy.gz'.

  Returns:
    dict {'max_abs_diff', 'n_arrays', 'reason'}, see the module docstring.
  """
  failed = [LABELS[k] for k in IMPLEMENTATIONS if runs[k]['status'] != 'ok']
  if failed:
    return {
      'max_abs_diff': None,
      'n_arrays': None,
      'reason': f'{" and ".join(failed)} did not finish',
    }
  arrays = []
  for k in IMPLEMENTATIONS:
    path = os.path.join(runs[k]['output_dir'], filename)
    try:
      arrays.append(read_npy_gz(path))
    except (OSError, ValueError) as e:
      return {
        'max_abs_diff': None,
        'n_arrays': None,
        'reason': f'cannot read {path}: {e}',
      }
  value, reason = max_abs_diff(*arrays)
  return {'max_abs_diff': value, 'n_arrays': len(arrays[0]), 'reason': reason}


def _losses_by_step(run):
  stats = run.get('stats') or {}
  return {
    step: loss
    for step, loss in zip(stats.get('steps') or [], stats.get('loss') or [])
    if loss is not None
  }


def build_report(
  config_files: Sequence[str],
  bindings: Sequence[str],
  steps: int | None,
  seed: int | None,
  seed_from_config: bool,
  runs: dict[str, Run],
  device_accounting: DeviceAccounting | None = None,
) -> Report:
  """Assembles compare.json's content (see the module docstring).

  Args:
    config_files, bindings: the user's config (lists of str).
    steps: int or None, the bound `train.steps`.
    seed: int or None, the `train.random_seed` both runs used.
    seed_from_config: bool, the config set the seed and compare left it.
    runs: {'stock': RUN, 'revplus': RUN} from `collect_run`.
    device_accounting: `accounting.run_estimate`'s entry, or None (skipped).

  Returns:
    dict, plain JSON types.
  """
  stock, ours = (_losses_by_step(runs[k]) for k in IMPLEMENTATIONS)
  common = sorted(set(stock) & set(ours))
  final_weights = checkpoint_diff(runs, 'model.weights.npy.gz')
  ours_dir = runs['revplus'].get('output_dir')
  weights_note = exactness.explanation(
    exactness.stored_reorderings(ours_dir) if ours_dir else [],
    final_weights['max_abs_diff'],
  )
  loss_diff = max(abs(stock[s] - ours[s]) for s in common) if common else None
  return {
    'config_files': list(config_files),
    'bindings': list(bindings),
    'steps': steps,
    'seed': seed,
    'seed_from_config': seed_from_config,
    'runs': runs,
    'device_accounting': device_accounting or accounting.skipped(),
    'xla_peaks': {
      k: accounting.xla_peak(runs[k], device_accounting)
      for k in IMPLEMENTATIONS
    },
    'loss_max_abs_diff': loss_diff,
    'loss_steps_compared': len(common),
    'final_weights': final_weights,
    'final_weights_note': weights_note,
    'final_slots': checkpoint_diff(runs, 'model.opt_slots0.npy.gz'),
  }
