"""The evals of a checkpoint's step that trax runs after saving it.

trax's `Loop.run` saves the checkpoint of step k before it runs the evals
of step k. A run resumed from that checkpoint starts with step k + 1, so
what those evals take (a key from the Loop's RNG and a batch from its eval
stream per eval batch) a checkpoint set keeps as taken: as an uninterrupted
run has it when its next step begins.
"""

from trax.supervised import training

from trax_revplus.trax_door import loop as loop_door


def tasks(loop: training.Loop) -> list[training.EvalTask]:
  """The Loop's eval tasks whose evals of its current step are still to come.

  Returns:
    Every eval task of the Loop when its current step is an eval step whose
    evals have not been recorded in the Loop's history yet, else [].
  """
  eval_tasks = [t for t in loop_door.eval_tasks(loop) if t is not None]
  eval_at = loop_door.eval_at(loop)
  if not eval_tasks or eval_at is None or not eval_at(loop.step):
    return []
  name = f'metrics/{eval_tasks[0].metric_names[0]}'
  if any(step == loop.step for step, _ in loop.history.get('eval', name)):
    return []
  return eval_tasks


def batches(loop: training.Loop) -> int:
  """The eval batches the evals still to come at the Loop's step take
  (`tasks`), over all its eval tasks."""
  return sum(int(t.n_eval_batches) for t in tasks(loop))
