"""trax's own reversible gin configs (gin_configs/trax/) with trax_revplus.

Each `<name>_cpu.gin` includes trax 1.4.1's `<name>.gin` unchanged and
shrinks it for a CPU; here each parses, with trax_revplus active. They
train, against stock trax, in tools/trax_configs_smoke.py (minutes each;
`.ci/run` runs it): trax_revplus's losses and eval losses fall, each run
trains with its own trainer and saves its final checkpoint.
"""

import glob
import os

import gin
import pytest

import trax_revplus
from trax_revplus import cli

CONFIG_DIR = os.path.join(
  os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
  'gin_configs',
  'trax',
)
# trax config -> the model it trains.
TRAX_CONFIGS = {
  'reformer_copy': 'ReformerLM',
  'reformer_wmt_ende': 'Reformer',
  'scientific_papers_terraformer': 'ConfigurableTerraformer',
  'terraformer_copy': 'ConfigurableTerraformer',
  'terraformer_copy_self_attn': 'ConfigurableTerraformer',
  'terraformer_purelsh_copy': 'ConfigurableTerraformer',
}

pytestmark = pytest.mark.usefixtures('stock_trax_and_empty_gin')


def _cpu_config(name):
  return os.path.join(CONFIG_DIR, f'{name}_cpu.gin')


def test_every_trax_config_has_a_cpu_override():
  found = sorted(
    os.path.basename(p) for p in glob.glob(os.path.join(CONFIG_DIR, '*.gin'))
  )
  assert found == sorted(
    [f'{n}.gin' for n in TRAX_CONFIGS] + [f'{n}_cpu.gin' for n in TRAX_CONFIGS]
  )
  for name in TRAX_CONFIGS:
    with open(os.path.join(CONFIG_DIR, f'{name}.gin')) as f:
      assert f.readline() == '# Copyright 2021 The Trax Authors.\n'


@pytest.mark.parametrize('name', sorted(TRAX_CONFIGS))
def test_cpu_override_parses_with_trax_revplus(name):
  cli.parse_configs([_cpu_config(name)], [])
  assert trax_revplus.is_active()
  assert gin.query_parameter('train.use_memory_efficient_trainer') is True
  model = gin.query_parameter('train.model')
  assert model.configurable.name == TRAX_CONFIGS[name]


@pytest.mark.parametrize('name', sorted(TRAX_CONFIGS))
def test_cpu_override_keeps_traxs_checkpoint_steps(name):
  # Shrunk in size only: a run keeps the steps trax checkpoints at (and
  # its final checkpoint, whatever they are).
  with open(_cpu_config(name)) as f:
    assert 'checkpoints_at' not in f.read()
