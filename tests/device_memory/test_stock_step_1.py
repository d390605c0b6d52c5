"""Stock's first step fails on a model with a weight shared inside a layer,
and its accounting says so (`stock_trainer.step_1_failure`).

Reference: stock trax's own `one_step` on the same trainer, which raises
"Attempt to donate the same buffer twice" (its backward programs donate a
layer's weights, and a ConfigurableTerraformer's encoder and decoder share
their embedding). The model is trax's terraformer_wmt_ende.gin shrunk in
size only (tests/gin_configs/configs/terraformer_wmt_ende_tiny.gin).
"""

import os

import numpy as np
import pytest

from trax import fastmath
from trax_revplus import device_memory
from trax_revplus import three_trainers
from trax_revplus.cli import estimate_report
from trax_revplus.cli import gin_config
from trax_revplus.cli import parsed_config
from trax_revplus.device_memory import stock_trainer

pytestmark = pytest.mark.usefixtures('stock_trax_and_empty_gin')

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
TERRAFORMER = os.path.join(
  REPO, 'tests', 'gin_configs', 'configs', 'terraformer_wmt_ende_tiny.gin'
)
MAIN = os.path.join(REPO, 'gin_configs', 'reformer_char_lm.gin')
TINY_LM = [
  'sequence_length = 32',
  'local_text_inputs.batch_size = 2',
  'ReformerLM.n_layers = 1',
  'ReformerLM.d_model = 16',
  'ReformerLM.d_ff = 32',
  'ReformerLM.n_heads = 1',
  'ReformerLM.d_attention_key = 8',
  'ReformerLM.d_attention_value = 8',
]


def _stock_trainer(config_file, bindings=()):
  """(stock's trainer of the config's model, the config) on one device."""
  from trax.optimizers import trainer as stock_lib  # pylint: disable=g-import-not-at-top

  gin_config.import_trax_quietly()
  gin_config.parse_configs([config_file], list(bindings))
  import trax_revplus  # pylint: disable=g-import-not-at-top

  trax_revplus.deactivate()
  cfg = parsed_config.check_inputs_and_batch(list(bindings), 1)
  blocks, loss_layer = three_trainers.reversible_blocks(stock_lib, cfg)
  return stock_lib.ReversibleSerialTrainer(
    blocks, loss_layer, cfg.optimizer, n_devices=1
  ), cfg


def test_a_model_without_shared_weights_has_no_step_1_failure():
  trainer, _ = _stock_trainer(MAIN, TINY_LM)
  assert stock_trainer.step_1_failure(trainer) is None


@pytest.mark.slow
def test_stock_fails_at_step_1_where_its_accounting_says_so():
  trainer, cfg = _stock_trainer(TERRAFORMER)
  failure = stock_trainer.step_1_failure(trainer)
  assert failure is not None
  assert failure.startswith(
    stock_trainer.DONATED_TWICE + ' (its update of layer 0 (Serial) donates'
  ), failure
  # estimate's stock row: figures with the error, runs False, fits no.
  memory = device_memory.trainer_memory('stock', trainer, cfg.batch, 'cpu')
  assert memory.step_error == failure and memory.runs is False
  assert memory.fits(2**40) is False
  figures = memory.to_json(2**40)
  assert figures['runs'] is False and figures['error'] == failure
  assert figures['n_devices'] == 1 and figures['max_devices'] == 1
  report = estimate_report.table(
    'cpu',
    {'default': memory, 'stock': memory, 'revplus': memory},
    None,
    cfg.batch,
    2**40,
    1,
  )
  assert f'\nstock    fails at step 1: {failure}' in report
  # The reference: stock's own first step on the same trainer.
  batch = tuple(np.zeros(x.shape, x.dtype) for x in cfg.batch)
  with pytest.raises(Exception) as e:
    trainer.one_step(batch, fastmath.random.get_prng(0), step=1)
  assert stock_trainer.DONATED_TWICE in str(e.value)
