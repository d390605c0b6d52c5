"""Our trainer in one process matches trax's default `Trainer`.

tests/multiprocess/training_worker.py trains a tiny reversible model 3
steps on a global batch of 8 rows; here it runs in the test's own process
(1 process x 1 CPU device), and our dropout-free weights must agree with
trax's default `Trainer` trained the same way. The same worker as 2 real
processes (jax.distributed on loopback, through
`trax_revplus.multiprocess.launcher`) and as 1 process x 2 forced devices,
and the equality of all three, is tools/multiprocess_training_smoke.py's
(too long for the suite; `.ci/run` runs it); a real 2-process JAX job
through the launcher stays in tests/multiprocess/test_launcher.py.
"""

import numpy as np

import training_worker
import trax_revplus

_TOLERANCE = 1e-5


def _max_diff_to_reference(result):
  """Our dropout-free weights against trax's default Trainer's (`ref/`)."""
  keys = sorted(k for k in result if k.startswith('ref/'))
  assert keys
  return max(
    float(np.max(np.abs(result[k] - result['plain/w/' + k[4:]]))) for k in keys
  )


def test_one_process_matches_trax_default_trainer(tmp_path):
  try:
    training_worker.train(str(tmp_path))
  finally:
    trax_revplus.deactivate()
  with np.load(tmp_path / 'process0.npz') as data:
    result = dict(data)
  assert list(result['devices']) == [1, 1, 1]
  assert _max_diff_to_reference(result) < _TOLERANCE
