"""tools/attention_speed.py: each attention layer timed at each number of
(example, head) pairs at once, on the main job's config shrunk."""

import os

import gin
import pytest

import trax_revplus
from tools import attention_speed

MAIN = os.path.join(
  os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
  'gin_configs',
  'reformer_char_lm.gin',
)


@pytest.fixture(autouse=True)
def _clean_gin():
  yield
  gin.clear_config()
  trax_revplus.deactivate()


def test_each_attention_layer_at_each_number_of_pairs():
  # 4 heads, configured all pairs at once; 2 rows a call: 1 to 8 pairs.
  figures = attention_speed.measure(
    [MAIN],
    [
      'sequence_length = 32',
      'ReformerLM.n_layers = 1',
      'local_text_inputs.batch_size = 2',
    ],
    rows_list=[2],
    max_seconds=120,
  )
  entries = figures['layers']
  assert figures['backend'] == 'cpu'
  assert [e['parallel_heads'] for e in entries] == [1, 2, 4, 8]
  assert {e['attention'] for e in entries} == {'SelfAttention'}
  assert all(e['seconds'] > 0 and 'refused' not in e for e in entries)
  # All pairs at once hold every pair's attention weights: more
  # temporaries than one pair at a time.
  assert entries[-1]['temp_bytes'] > entries[0]['temp_bytes']
  # The arithmetic is counted whole at any number at once (XLA would count
  # a loop's body once): seconds x rate is one count.
  counts = [e['seconds'] * e['tflops_per_second'] for e in entries]
  assert counts == pytest.approx([counts[-1]] * len(counts), rel=1e-6)
  assert counts[-1] > 0
