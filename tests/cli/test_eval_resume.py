"""A resumed run's evals score the batches an uninterrupted run's do.

trax's `Loop` (stock trax's own, the reference) evaluates every step here
on the next batch of the eval stream; a run resumed from step 3, or from
`model.prev` (step 3) after the step-4 set was damaged, must report the
eval loss of step 4 that the run without restart reports.
"""

import re
import shutil

import pytest

from trax_revplus import cli

from cli_cases import MAIN
from cli_cases import TINY_MODEL

# Every step evaluates one batch; the eval stream cycles over 10 different
# batches, so a stream restarted from its first batch scores another one.
_EVERY_STEP = TINY_MODEL + [
  'sequence_length = 32',
  'train.eval_frequency = 1',
  'train.eval_steps = 1',
  'local_text_inputs.eval_cycle_batches = 10',
]


def _train(capsys, output_dir, steps):
  code = cli.main(
    [
      'trax-revplus',
      'train',
      f'--config_file={MAIN}',
      f'--output_dir={output_dir}',
    ]
    + [f'--config={b}' for b in _EVERY_STEP + [f'train.steps = {steps}']]
  )
  out, err = capsys.readouterr()
  import trax_revplus  # pylint: disable=g-import-not-at-top

  trax_revplus.deactivate()
  assert code == 0, err[-3000:]
  assert 'holds data counters' not in err  # The set and its file agree.
  return out, err


def _eval_losses(out):
  """{step: eval loss} as the run printed them (trax's Loop prints them)."""
  return {
    int(step): float(loss)
    for step, loss in re.findall(
      r'^Step +(\d+): eval +loss \| +(\S+)$', out, re.MULTILINE
    )
  }


def _flip_middle_byte(file_path):
  data = bytearray(file_path.read_bytes())
  data[len(data) // 2] ^= 0xFF
  file_path.write_bytes(bytes(data))


@pytest.mark.usefixtures('stock_trax_and_empty_gin')
def test_resumed_evals_score_the_batches_of_the_uninterrupted_run(
  tmp_path, capsys
):
  uninterrupted = tmp_path / 'uninterrupted'
  want = _eval_losses(_train(capsys, uninterrupted, steps=4)[0])
  assert sorted(want) == [1, 2, 3, 4]
  assert len(set(want.values())) == 4  # Each step scored its own batch.

  resumed = tmp_path / 'resumed'
  _train(capsys, resumed, steps=3)
  out, _ = _train(capsys, resumed, steps=4)
  assert _eval_losses(out) == {4: want[4]}

  from_prev = tmp_path / 'from_prev'
  shutil.copytree(uninterrupted, from_prev)
  _flip_middle_byte(from_prev / 'model.weights.npy.gz')
  out, err = _train(capsys, from_prev, steps=4)
  assert 'loading the previous set model.prev (step 3)' in err
  assert _eval_losses(out) == {4: want[4]}
