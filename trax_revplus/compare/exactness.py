"""Why trax_revplus's final weights differ from stock's: one line.

trax_revplus computes stock trax's step in stock's float32 summation order
wherever its plan keeps that order, and then gives stock's weights bit for
bit. Five plan dimensions can change the order (docs/compatibility.md,
"Same weights"): batch slices, micro-batches and sequence chunks add
partial sums in another order, attention layers computing fewer (example,
head) pairs at once than configured run other matrix shapes, and the whole
step compiled as one program lets XLA fuse a sum across layers. Their
results differ by float32 rounding, which grows from step to step; on a
model whose layers hash their activations (LSH attention) a rounding
difference can move a position to another bucket, and the weights then
differ by far more.

`explanation` reads which of them a run's plans used (the trainer keeps,
beside each plan in its output directory, what in it can change the order,
in words: `trainer._search.plan_store`, `trainer._plan.dimensions`) and says so,
with the setting that runs stock's order (`device_memory_budget_bytes =
None`: the settings as given, one program per segment, no slices, chunks
or micro-batches, the attention layers as configured), wherever the final
weights differ by more than `TOLERANCE`.
"""

import json
import os
from typing import Any, Sequence

# Largest final weight difference from stock's left unexplained: float32
# rounding of the same step in another order stays below it over a short
# run (docs/compatibility.md).
TOLERANCE = 1e-5
# `trainer._search.plan_store.FILENAME` and `REORDERINGS`, not imported from
# there: that would import trax (seconds of CPU), which compare does not
# need.
PLANS_FILENAME = 'plans.json'
REORDERINGS = 'summation_order_changes'
_SETTING = 'trax_revplus.ReversibleSerialTrainer'


def stored_reorderings(output_dir: str | os.PathLike) -> list[list[str]]:
  """What in each plan a trax_revplus run kept in its output directory can
  change stock's float32 summation order, in words.

  Args:
    output_dir: the run's output directory.

  Returns:
    list over the plans kept of lists of str, as
    `trainer._plan.dimensions.reorderings` words them (e.g. ['2 batch
    slices', 'the step as one program']; [] for a plan in stock's order);
    empty where the file is missing, unreadable or holds none (a run
    without a budget keeps none).
  """
  try:
    with open(os.path.join(output_dir, PLANS_FILENAME)) as f:
      entries = json.load(f)['plans'].values()
    return [
      [str(words) for words in entry[REORDERINGS]]
      for entry in entries
      if isinstance(entry.get(REORDERINGS), list)
    ]
  except (OSError, ValueError, KeyError, TypeError, AttributeError):
    return []


def _setting(name: str, value: Any) -> str:
  return f"--config='{_SETTING}.{name} = {value}'"


def explanation(
  plans: Sequence[Sequence[str]], max_abs_diff: float | None
) -> str | None:
  """One line on why the final weights differ from stock's, or None.

  Args:
    plans: what in each of the trax_revplus run's plans can change stock's
      summation order (`stored_reorderings`).
    max_abs_diff: the largest |stock - trax_revplus| over the final
      weights, or None where there is none (a run failed).

  Returns:
    None where `max_abs_diff` is None or at most `TOLERANCE`; else a line
    naming the plan dimensions that changed stock's summation order (none:
    the plan is not the cause; no plan kept: it cannot tell) and the
    setting that runs stock's order, `device_memory_budget_bytes = None`.
  """
  if max_abs_diff is None or max_abs_diff <= TOLERANCE:
    return None
  head = (
    f"final weights differ from stock's by {max_abs_diff:.3g} "
    f'(over {TOLERANCE:g})'
  )
  setting = _setting('device_memory_budget_bytes', None)
  if not plans:
    return (
      f'{head}; trax_revplus kept no plan ({PLANS_FILENAME}) to tell '
      f"which plan dimension changed stock's float32 summation order: "
      f'{setting}, with every setting the planner chooses left at '
      f"'auto', runs it."
    )
  reorderings = []
  for plan in plans:
    reorderings += [r for r in plan if r not in reorderings]
  if not reorderings:
    return (
      f"{head}, although trax_revplus ran stock's float32 summation "
      f'order (one program per segment, no batch slices, micro-batches '
      f'or sequence chunks, the attention layers as configured): the '
      f'plan is not the cause.'
    )
  return (
    f'{head}: trax_revplus ran {", ".join(reorderings)}, which can sum '
    f'in another float32 order than stock (where a layer hashes its '
    f'activations, as LSH attention does, rounding can change a bucket '
    f"and grow); {setting} runs stock's order."
  )
