"""ReversibleSerialTrainer on 2 forced CPU devices.

Runs tests/placement/multidevice_worker.py in a fresh process with
XLA_FLAGS=--xla_force_host_platform_device_count=2 set before JAX starts.
The same checks on 4 devices: tools/multidevice_smoke.py (`.ci/run` runs
it after the suite).
The reference is trax's default Trainer on one device (trax 1.4.1 cannot run
on 2+ devices with current JAX: `jax.device_put_replicated` is gone).
"""

import pytest

from conftest import run_multidevice_worker


# Every plan kind on 2 forced devices in a subprocess (about a minute): with
# the tests marked slow, which CI runs; the default suite keeps other
# 2-device runs (attention heads, evals, the placement rules).
@pytest.mark.slow
@pytest.mark.parametrize('n_devices', [2])
def test_n_devices_match_one_device(n_devices):
  result = run_multidevice_worker(n_devices)
  assert result['local_devices'] == n_devices
  assert result['max_diff_vs_default_1dev'] <= 1e-5, result
  assert result['max_diff_vs_ours_1dev'] <= 1e-5, result
  assert result['max_diff_free'] <= 1e-5, result
  assert result['max_diff_slices_vs_default_1dev'] <= 1e-5, result
  assert result['max_diff_chunks_vs_default_1dev'] <= 1e-5, result
  assert result['max_diff_fused_vs_default_1dev'] <= 1e-5, result
  assert result['fused_layers'] == 5, result  # every layer before the loss
  assert result['max_diff_saved_on_host_vs_default_1dev'] <= 1e-5, result
  assert result['saved_on_host'] is True, result
  assert result['max_diff_lsh_slices'] <= 1e-5, result
  assert result['loss_shape'] == [n_devices], result
  assert result['adasum_finite'], result
  assert result['adasum_diff_vs_mean'] > 0, result
  assert result['weights_are_numpy'], result
  # A budget plans on N devices (every candidate accounted from XLA), and
  # what it chose trains as the default Trainer: the fastest plan under a
  # large budget, the least plan under the least plan's own peak.
  assert result['max_diff_budget_vs_default_1dev'] <= 1e-5, result
  assert result['budget_plan']['fused_layers'] == 5, result
  least_bytes, least_plan = result['least_budget']
  assert least_bytes > 0 and least_plan['fused_layers'] == 0, result
  assert result['max_diff_least_vs_default_1dev'] <= 1e-5, result
  # Every function of the step compiles ahead on N CPU devices, those
  # whose calls wait for their collectives (`Placement.sync_collectives`)
  # too, on the helper threads, and none of them compiles again.
  helper, total = result['compiles_ahead']
  assert helper == total == result['compiles_when_called'], result
