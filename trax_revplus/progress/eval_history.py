"""Eval losses kept with a run's output directory, across resumes.

trax's `Loop` saves the checkpoint of a step before it runs that step's
eval (`trax.supervised.training.Loop.run`), so the history a resumed run
restores from that checkpoint lacks the eval of the checkpoint's own step:
a run checkpointed and evaluated at step 300, resumed, would report its
step-200 eval as the last. `merged` keeps every eval loss the runs of an
output directory saw in `<output_dir>/eval_losses.json` and merges it
with the history the Loop holds.

Evals kept for steps after the Loop's current step come from a run whose
checkpoints are gone (the directory was started over) and are dropped. A
damaged file is ignored with one warning line and written afresh: it only
ever adds what the history lacks, never decides a result.
"""

import json
import os
from typing import Sequence

from absl import logging

from trax_revplus import output_files

FILENAME = 'eval_losses.json'
FORMAT = 'trax_revplus eval losses 1'


def _read(path: str) -> dict[int, float]:
  """{step: eval loss} kept at `path`; {} where there is none or it is
  damaged (with one warning line)."""
  try:
    with open(path, encoding='utf-8') as f:
      data = json.load(f)
    if not isinstance(data, dict) or data.get('format') != FORMAT:
      raise ValueError('not an eval losses file of this version')
    return {int(step): float(loss) for step, loss in data['losses']}
  except FileNotFoundError:
    return {}
  except (OSError, ValueError, KeyError, TypeError) as e:
    logging.warning(
      "eval losses %s ignored (%s); the run's own history is reported.", path, e
    )
    return {}


def merged(
  output_dir: str | None,
  history_losses: Sequence[tuple[int, float]],
  current_step: int,
  write: bool,
) -> list[tuple[int, float]]:
  """The eval losses of the run so far: those kept in `output_dir` up to
  `current_step`, and the Loop's history (which wins where both hold a
  step).

  Args:
    output_dir: the Loop's output directory, or None (nothing kept).
    history_losses: (step, loss) pairs of the Loop's history.
    current_step: int, the Loop's step.
    write: bool, whether this process keeps the result (the chief of a
      multi-process run, whose output directory the others share).

  Returns:
    list of (step, loss), by step.
  """
  history = {int(step): float(loss) for step, loss in history_losses}
  if not output_dir:
    return sorted(history.items())
  path = os.path.join(output_dir, FILENAME)
  kept = {
    step: loss for step, loss in _read(path).items() if step <= current_step
  }
  kept.update(history)
  losses = sorted(kept.items())
  if write and losses:
    text = json.dumps({'format': FORMAT, 'losses': losses}, indent=1)
    try:
      output_files.write(path, lambda f: f.write(text.encode('utf-8')))
    except output_files.OutputFileError as e:
      logging.warning('eval losses not kept: %s', e)
  return losses
