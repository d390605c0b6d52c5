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
import numpy as np
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


def _flat_state(loop):
  from trax import fastmath  # pylint: disable=g-import-not-at-top

  return [np.asarray(s) for s in fastmath.tree_flatten(loop.model.state)]


@pytest.mark.slow
def test_a_terraformer_compiles_at_step_1_only_and_resumes_its_state(tmp_path):
  # trax's ConfigurableTerraformer returns its ConcatWithPadding layers'
  # state in another shape than it initializes it.
  from trax.supervised import trainer_lib  # pylint: disable=g-import-not-at-top

  from trax_revplus.progress.compiles import CompileCounter  # pylint: disable=g-import-not-at-top
  from trax_revplus.trax_door import loop as loop_door  # pylint: disable=g-import-not-at-top

  cli.parse_configs([_cpu_config('terraformer_copy')], [])
  output_dir = str(tmp_path / 'run')
  CompileCounter.snapshot()  # Listens from now on.
  trained = trainer_lib.train(output_dir, steps=1)
  initial_shapes = [x.shape for x in _flat_state(trained)]
  # What each step compiles (trax's Loop adds the losses up between steps,
  # and compiles that addition once of its own).
  compiled_in_steps = []

  def counted(run_one_step):
    def run(*args, **kwargs):
      before = CompileCounter.snapshot()[0]
      result = run_one_step(*args, **kwargs)
      compiled_in_steps.extend(CompileCounter.names_since(before))
      return result

    return run

  loop_door.wrap_run_one_step(trained, counted)
  trained.run(2)  # Steps 2 and 3: no eval, no new shapes.
  assert compiled_in_steps == []
  trained.save_checkpoint('model')
  saved = _flat_state(trained)
  assert [x.shape for x in saved] == initial_shapes
  # A Loop on the same output dir loads step 3 and has nothing to run.
  resumed = trainer_lib.train(output_dir, steps=3)
  assert resumed.step == 3
  loaded = _flat_state(resumed)
  assert len(loaded) == len(saved)
  for x, y in zip(saved, loaded):
    assert x.dtype == y.dtype
    np.testing.assert_array_equal(x, y)
