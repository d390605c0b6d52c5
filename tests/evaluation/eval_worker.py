"""Evaluates on N forced CPU devices and prints figures as one JSON line.

Run by tests/evaluation/test_evaluator.py (2 devices) in a fresh process,
because the device count is fixed when JAX starts:

  XLA_FLAGS=--xla_force_host_platform_device_count=N \\
      python tests/evaluation/eval_worker.py N

Printed (last line of stdout):
  local_devices, trainer_devices: JAX's local devices, the trainer's,
  eval_device, first_trainer_device: where the eval ran, the trainer's
    first device,
  parts: the eval's row parts with the default budget, then under a budget
    of one byte less than that plan's peak,
  max_relative_diffs: for each, the largest relative difference of the
    metrics from stock trax's CPU eval on the same weights and batch.
"""

import json
import os
import sys
import tempfile

from trax_revplus import trax_import

trax_import.import_trax()  # Before any trax module: see trax_import.

# tests/ (conftest's models) and tests/evaluation (eval_cases).
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [_HERE, os.path.dirname(_HERE)]
# pylint: disable=g-import-not-at-top,wrong-import-position
import jax
import numpy as np

import eval_cases as cases
# pylint: enable=g-import-not-at-top,wrong-import-position


def _relative_diff(ours, stock):
  return float(np.max(np.abs(ours - stock) / np.maximum(np.abs(stock), 1e-30)))


def main():
  with tempfile.TemporaryDirectory() as root:
    loop = cases.loop(root)
    trainer = loop._trainer_per_task[0]  # pylint: disable=protected-access
    metrics_fn = cases.evaluator(loop).metrics_fn
    whole = cases.ours(loop)
    plan = metrics_fn.planned(*cases.arguments(loop)).plan
    parts, plan_of_parts = cases.evaluate(loop, plan.peak_device_bytes - 1)
    stock = cases.stock(loop)
  print(
    json.dumps(
      {
        'local_devices': len(jax.local_devices()),
        'trainer_devices': len(trainer.placement.devices),
        'eval_device': str(metrics_fn.device),
        'first_trainer_device': str(trainer.placement.devices[0]),
        'parts': [plan.parts, plan_of_parts.parts],
        'max_relative_diffs': [
          _relative_diff(whole, stock),
          _relative_diff(parts, stock),
        ],
      }
    )
  )


if __name__ == '__main__':
  main()
