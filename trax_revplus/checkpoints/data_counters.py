"""trax's data position (`trax.data.inputs.data_counters`) across restarts.

trax counts the batches each counted stream has given
(`trax.data.inputs.count_and_skip`) and writes the counts to
`data_counters<host>.pkl` in the output dir, in place and not atomically,
reading the file back in `Loop.__init__` before any checkpoint is loaded.
Here the counts are part of each checkpoint set (its manifest) and restored
with it; the file is still written where stock trax reads it, and a file
that cannot be read no longer stops a run.

An eval stream that keeps its position in the counters (it names its key
in `data_counter`, as `trax_revplus.data.CountedStream` does) resumes too:
trax runs a step's evals after it saves the step's checkpoint, so the set
keeps the position those evals leave (`at_next_step`).
"""

import contextlib
import os
import pickle
from typing import Any, Iterator

from absl import logging
import jax

from trax.data import inputs as trax_inputs
from trax.supervised import training

from trax_revplus.checkpoints import pending_evals

# trax's own reader, as bound when this module was imported.
stock_load_data_counters = trax_inputs.load_data_counters

_COUNTERS_FROM_SET = (
  'the data counters come from the checkpoint set loaded '
  '(without one, the data stream starts from its first '
  'batch)'
)


def file_name(host_id: int | None = None) -> str:
  """'data_counters<host>.pkl', trax's name for a host's counters file.

  Args:
    host_id: int or None (this process's index, `jax.process_index()`).
  """
  host_id = jax.process_index() if host_id is None else host_id
  return 'data_counters%d.pkl' % host_id


def read(path: str) -> tuple[dict[str, Any] | None, str]:
  """Reads a counters file.

  Returns:
    (counters, problem): the pickled dict, or None and why not (the
    exception's type and message, or what the file holds instead of a
    dict).
  """
  try:
    with open(path, 'rb') as f:
      counters = pickle.load(f)
  except Exception as e:  # pylint: disable=broad-except
    return None, f'{type(e).__name__}: {e}'
  if not isinstance(counters, dict):
    return None, f'it holds a {type(counters).__name__}, not a dict'
  return counters, ''


def as_json() -> dict[str, int]:
  """trax's data counters now, as a manifest keeps them: {name: count}."""
  return {str(k): int(v) for k, v in trax_inputs.data_counters.items()}


def at_next_step(loop: training.Loop) -> dict[str, int]:
  """trax's data counters as a run without restart has them when its next
  step begins: {name: count}.

  The counter of each eval task's stream that keeps one (`data_counter`)
  is moved past the batches the evals still to come at the Loop's step
  take from it (`pending_evals`).
  """
  counters = as_json()
  for task in pending_evals.tasks(loop):
    name = getattr(task.labeled_data, 'data_counter', None)
    if name in counters:
      counters[name] += int(task.n_eval_batches)
  return counters


@contextlib.contextmanager
def bound(counters: dict[str, int]) -> Iterator[None]:
  """Binds trax's data counters to a copy of `counters` inside the block.

  trax's `save_data_counters` writes the module's dict; the dict bound
  before (which the streams keep counting in) is bound again after.
  """
  before = trax_inputs.data_counters
  trax_inputs.data_counters = dict(counters)
  try:
    yield
  finally:
    trax_inputs.data_counters = before


def restore(
  loop: training.Loop,
  counters: dict[str, int],
  basename: str,
  step: Any,
  fell_back: bool,
) -> None:
  """Sets trax's data counters to those of the set loaded.

  Warns when `data_counters<host>.pkl` in the Loop's output dir disagrees
  with the set, unless the previous set was loaded (`fell_back`): that
  warning already said the run resumes from an earlier step.

  Args:
    loop: the `training.Loop`.
    counters: the set manifest's `data_counters`.
    basename: the set loaded, for the warning.
    step: the set's step, for the warning.
    fell_back: whether the previous set was loaded.
  """
  output_dir = getattr(loop, 'output_dir', None)
  path = os.path.join(output_dir or '', file_name())
  found, _ = read(path) if output_dir and os.path.exists(path) else (None, '')
  if (
    found is not None
    and not fell_back
    and ({str(k): v for k, v in found.items()} != counters)
  ):
    logging.warning(
      '%s holds data counters %s, but checkpoint set %s (step %s) was '
      "written at %s; the set's are used.",
      path,
      found,
      basename,
      step,
      counters,
    )
  trax_inputs.data_counters = dict(counters)


def load_data_counters(output_dir: str, host_id: int | None = None) -> None:
  """`trax.data.inputs.load_data_counters` that an unreadable file cannot stop.

  trax reads `data_counters<host>.pkl` before any checkpoint is loaded; an
  empty or damaged file (a kill while stock trax wrote it in place) made
  every later start fail. Here it is skipped with a warning: a verified
  checkpoint set restores the counters from its manifest anyway.

  Args:
    output_dir: the Loop's output dir.
    host_id: int or None (this process's index).
  """
  path = os.path.join(output_dir, file_name(host_id))
  if not os.path.exists(path):
    logging.info('Did not load data counters as %s does not exist.', path)
    return
  counters, problem = read(path)
  if counters is None:
    logging.warning(
      '%s is unreadable (%s); it is ignored: %s.',
      path,
      problem,
      _COUNTERS_FROM_SET,
    )
    return
  trax_inputs.data_counters = counters


def set_aside_unreadable_data_counters(
  output_dir: str, host_id: int | None = None
) -> None:
  """Renames an unreadable `data_counters<host>.pkl` to `<name>.unreadable`.

  For a Loop that reads the file with trax's own `load_data_counters`
  (stock trax), which an unreadable file stops; a warning says so.

  Args:
    output_dir: the Loop's output dir.
    host_id: int or None (this process's index).

  Raises:
    OSError: the file cannot be renamed.
  """
  path = os.path.join(output_dir, file_name(host_id))
  if not os.path.exists(path):
    return
  counters, problem = read(path)
  if counters is not None:
    return
  os.replace(path, path + '.unreadable')
  logging.warning(
    '%s is unreadable (%s); it was moved to %s: %s.',
    path,
    problem,
    os.path.basename(path) + '.unreadable',
    _COUNTERS_FROM_SET,
  )
