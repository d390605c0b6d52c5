"""Every gin config parses; the full-size model builds abstractly."""

import glob
import os
import re

import gin
import jax
import numpy as np
import pytest
from trax import fastmath
from trax import models
from trax import shapes
from trax.layers import reversible as stock_reversible

import trax_revplus
from trax_revplus import cli
from trax_revplus import layers as revplus_layers

CONFIG_DIR = os.path.join(
  os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
  'gin_configs',
)
CONFIGS = sorted(glob.glob(os.path.join(CONFIG_DIR, '*.gin')))
MAIN = os.path.join(CONFIG_DIR, 'reformer_char_lm.gin')
STOCK = os.path.join(CONFIG_DIR, 'reformer_char_lm_stock.gin')
FULL = os.path.join(CONFIG_DIR, 'reformer_enwik8_full.gin')
ACTIVATION_LINE = 'import trax_revplus.activate'


@pytest.fixture(autouse=True)
def _clean_gin():
  cli.import_trax_quietly()
  yield
  gin.clear_config()
  trax_revplus.deactivate()


def test_the_required_configs_exist():
  for path in (MAIN, STOCK, FULL):
    assert path in CONFIGS


@pytest.mark.parametrize('path', CONFIGS, ids=os.path.basename)
def test_config_parses(path):
  cli.parse_configs([path], [])
  assert gin.query_parameter('train.model') is not None
  with open(path) as f:
    activates = ACTIVATION_LINE in f.read()
  if os.path.basename(path) != 'reformer_char_lm_base.gin':
    assert trax_revplus.is_active() == activates


def _code_lines(path):
  with open(path) as f:
    lines = [re.sub(r'#.*', '', line).strip() for line in f]
  return [line for line in lines if line]


def test_main_job_and_stock_twin_differ_only_by_the_activation_line():
  main_lines = _code_lines(MAIN)
  assert ACTIVATION_LINE in main_lines
  main_lines.remove(ACTIVATION_LINE)
  assert main_lines == _code_lines(STOCK)

  def bindings():
    return [
      line
      for line in gin.config_str().splitlines()
      if not line.startswith('import ')
    ]

  cli.parse_configs([MAIN], [])
  main_bindings = bindings()
  assert trax_revplus.is_active()
  assert gin.query_parameter('train.use_memory_efficient_trainer') is True
  cli.parse_configs([STOCK], [])
  assert not trax_revplus.is_active()
  assert bindings() == main_bindings


def _value(name):
  """gin.query_parameter, following macros (`%name`) to their values."""
  value = gin.query_parameter(name)
  while str(value).startswith('%'):
    value = gin.query_parameter(str(value))
  return value


def test_main_job_is_the_specified_model():
  cli.parse_configs([MAIN], [])
  query = _value
  assert query('ReformerLM.n_layers') == 4
  assert query('ReformerLM.d_model') == 128
  assert query('local_text_inputs.sequence_length') == 256
  assert query('local_text_inputs.batch_size') == 8
  assert query('train.steps') == 300
  assert query('train.eval_frequency') == 100
  assert query('train.random_seed') == 0
  assert query('train.inputs').configurable.name == 'local_text_inputs'


def _to_struct(tree):
  return fastmath.nested_map(
    lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype), tree
  )


def test_full_size_enwik8_model_builds_abstractly():
  cli.parse_configs([FULL], ["local_text_inputs.paths = '/data/enwik8'"])
  assert trax_revplus.is_active()
  length = _value('local_text_inputs.sequence_length')
  vocab = _value('ReformerLM.vocab_size')
  d_model = _value('ReformerLM.d_model')
  n_layers = _value('ReformerLM.n_layers')
  model = models.ReformerLM()  # mode='train' from the config.

  found = []

  def walk(layer):
    if isinstance(
      layer,
      (
        stock_reversible.ReversibleSerial,
        stock_reversible.ReversibleHalfResidual,
      ),
    ):
      found.append(type(layer))
    for sub in layer.sublayers:
      walk(sub)

  walk(model)
  assert found.count(revplus_layers.ReversibleHalfResidual) == 2 * n_layers
  assert set(found) == {
    revplus_layers.ReversibleSerial,
    revplus_layers.ReversibleHalfResidual,
  }

  tokens = shapes.ShapeDtype((1, length), np.int32)
  # unsafe: an uninitialized model cannot take back its empty state.
  weights, state = model.weights_and_state_signature(tokens, unsafe=True)
  weight_shapes = [w.shape for w in jax.tree_util.tree_leaves(weights)]
  assert (vocab, d_model) in weight_shapes
  n_weights = sum(int(np.prod(s)) for s in weight_shapes)
  assert n_weights > 12 * d_model * d_model  # Not a toy model.
  logits = jax.eval_shape(
    lambda w, s, x: model.pure_fn(x, w, s, jax.random.PRNGKey(0))[0],
    _to_struct(weights),
    _to_struct(state),
    jax.ShapeDtypeStruct((1, length), np.int32),
  )
  assert logits.shape == (1, length, vocab)


def test_includes_are_found_next_to_their_includer_at_any_depth(tmp_path):
  """A config in another directory that includes the main job's config,
  which includes its base next to itself: both directories are searched."""
  from trax_revplus.cli import gin_config  # pylint: disable=g-import-not-at-top

  top = tmp_path / 'mine.gin'
  top.write_text(f"include '{MAIN}'\ntrain.steps = 3\n")
  assert gin_config._include_dirs([str(top)]) == [str(tmp_path), CONFIG_DIR]  # pylint: disable=protected-access
  cli.parse_configs([str(top)], [])
  assert gin.query_parameter('train.steps') == 3
  assert gin.query_parameter('train.model') is not None
