"""`trax-revplus estimate` on the tiny main job: the table, the JSON, the
plan under a device memory, and one-line errors.

References: the default Trainer's and stock's figures from the accounting
of their own one_step programs (tests/test_device_memory.py checks those
against real steps), recomputed here in-process for the same config; a
device memory just below trax_revplus's peak must not fit.
"""

import json
import os
import subprocess

import pytest

from cli_cases import cli_command
from cli_cases import MAIN
from cli_cases import TINY_MODEL
from trax_revplus import cli
from trax_revplus.cli import estimate

TINY = ['sequence_length = 32'] + TINY_MODEL


def _estimate(tmp_path, *flags):
  path = os.path.join(tmp_path, 'estimate.json')
  result = subprocess.run(
      cli_command() + ['estimate', f'--config_file={MAIN}',
                       *[f'--config={b}' for b in TINY], f'--json={path}',
                       *flags],
      capture_output=True, text=True, check=False)
  return result, path


def test_estimate_table_and_json(tmp_path):
  result, path = _estimate(tmp_path, '--device_memory=1GiB')
  assert result.returncode == 0, result.stderr
  # Known third-party noise from compiling stock's programs stays off.
  assert 'Some donated buffers' not in result.stderr, result.stderr
  out = result.stdout
  assert 'backend cpu' in out
  for name in estimate.TRAINERS:
    assert f'\n{name} ' in out
  assert 'revplus plan: segment_max_layers=' in out
  data = json.load(open(path))
  assert data['backend'] == 'cpu'
  assert data['device_memory_bytes'] == 2**30
  assert set(data['trainers']) == {'default', 'stock', 'revplus'}
  for name, figures in data['trainers'].items():
    assert 'error' not in figures, (name, figures)
    for key in ('peak_device_bytes', 'host_weights_and_slots_bytes',
                'largest_program_bytes'):
      assert isinstance(figures[key], int) and figures[key] >= 0, key
    assert figures['fits'] is True
    assert figures['peak_device_bytes'] >= figures['largest_program_bytes']
  assert data['trainers']['default']['host_weights_and_slots_bytes'] == 0
  rev = data['trainers']['revplus']
  assert rev['host_weights_and_slots_bytes'] == (rev['weights_bytes'] +
                                                 rev['slots_bytes'])
  # Just below trax_revplus's smallest plan's peak: nothing fits, and the
  # table says what would.
  need = min(rev['peak_device_bytes'],
             data['trainers']['stock']['peak_device_bytes'])
  result, path = _estimate(tmp_path, f'--device_memory={need - 1}')
  assert result.returncode == 0, result.stderr
  data = json.load(open(path))
  assert data['trainers']['stock']['fits'] is (
      data['trainers']['stock']['peak_device_bytes'] <= need - 1)
  rev_small = data['trainers']['revplus']
  if rev_small['peak_device_bytes'] > need - 1:
    assert rev_small['fits'] is False
    assert 'no plan fits' in rev_small['plan']


@pytest.mark.parametrize('flag,text', [
    ('--device_memory=abc', 'is not a size'),
    ('--device_memory=0', 'must be positive'),
    ('--device_memory=-5GiB', 'is not a size'),
    ('--n_devices=0', 'positive integer'),
])
def test_bad_flags_are_one_line_usage_errors(flag, text, tmp_path, capsys):
  path = os.path.join(tmp_path, 'e.json')
  code = cli.main(['trax-revplus', 'estimate', f'--config_file={MAIN}', flag,
                   f'--json={path}'])
  err = capsys.readouterr().err
  assert code == 2
  assert err.count('\n') == 1 and text in err, err
  assert err.startswith('trax-revplus estimate: error: ')
  assert not os.path.exists(path)


def test_unbuildable_model_is_one_line(tmp_path, capsys):
  path = os.path.join(tmp_path, 'e.json')
  code = cli.main(['trax-revplus', 'estimate', f'--config_file={MAIN}',
                   *[f'--config={b}' for b in TINY],
                   '--config=ReformerLM.attention_type = 5',
                   f'--json={path}'])
  err = capsys.readouterr().err
  assert code == 1, err
  assert err.count('\n') == 1 and "cannot build the config's model" in err
  assert not os.path.exists(path)


def test_parse_bytes():
  assert estimate.parse_bytes('16GiB') == 16 * 2**30
  assert estimate.parse_bytes('40GB') == 40 * 10**9
  assert estimate.parse_bytes('512 mib') == 512 * 2**20
  assert estimate.parse_bytes('1e9') == 10**9
  for bad in ('', 'GiB', '1 parsec', '0'):
    with pytest.raises(ValueError):
      estimate.parse_bytes(bad)
