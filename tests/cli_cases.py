"""What the CLI tests share: the configs, a tiny model, the command."""

import os
import shutil
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The main job (with the activation line) and its stock twin.
MAIN = os.path.join(REPO, 'gin_configs', 'reformer_char_lm.gin')
STOCK = os.path.join(REPO, 'gin_configs', 'reformer_char_lm_stock.gin')

# Bindings that shrink the main job's model and batches to seconds a step.
TINY_MODEL = [
  'eval_steps = 1',
  'local_text_inputs.batch_size = 2',
  'local_text_inputs.eval_batch_size = 2',
  'ReformerLM.n_layers = 1',
  'ReformerLM.d_model = 16',
  'ReformerLM.d_ff = 32',
  'ReformerLM.n_heads = 2',
  'ReformerLM.d_attention_key = 8',
  'ReformerLM.d_attention_value = 8',
]


def cli_command():
  """argv prefix that runs `trax-revplus` from this Python's installation."""
  script = os.path.join(os.path.dirname(sys.executable), 'trax-revplus')
  if os.path.exists(script):
    return [script]
  script = shutil.which('trax-revplus')
  return [script] if script else [sys.executable, '-m', 'trax_revplus.cli']
