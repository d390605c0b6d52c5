"""Where each record of a memory log sits on a figure's training-step axis.

Step k occupies (k - 1, k]: its phase records (forward, loss, backward,
free, per layer or not) are spread over it in file order, at
k - 1 + i / (n + 1) for the i-th of its n records, and its 'step' record,
with the step's true host peak, sits at k; an 'end' record sits half a step
after its step. Each process that wrote to the log is a segment of its own
(a run resumed from a checkpoint, or the processes of a multi-process run,
told apart by their 'start' records and `process_index`): its 'start'
record sits at the step it started from, its 'init' records just before it.

`trax-revplus plot-memory` (`plot`) and `compare.png` (`compare.png`) both
place records with `x_positions`, so a phase record sits at the same x in
both figures.
"""

import collections
from typing import Any, Sequence

# Records of a process rather than of one of its steps' phases.
PROCESS_PHASES = ('start', 'step', 'end')

Record = dict[str, Any]


def segments(records: Sequence[Record]) -> list[list[Record]]:
  """Splits a log's records into one list per process, in file order.

  A process's records begin with its 'init' records or its 'start' record;
  records that carry a `process_index` go to that process's current
  segment. Logs written before 'start' records existed are split where
  the step goes back (a restarted process's 'init' records at step 0).

  Returns:
    list of lists of records; each record in exactly one.
  """
  out: list[list[dict[str, Any]]] = []
  current = {}  # process_index -> index into out
  last_index = 0

  def open_segment(index):
    out.append([])
    current[index] = len(out) - 1

  for r in records:
    index = r.get('process_index', last_index)
    if not isinstance(index, int):
      index = 0
    last_index = index
    seg = out[current[index]] if index in current else None
    if seg is None:
      open_segment(index)
    else:
      began = any(
        x['phase'] == 'start' or (x['phase'] not in ('init',) and x['step'] > 0)
        for x in seg
      )
      went_back = r['step'] < max(x['step'] for x in seg)
      if (r['phase'] == 'start' and began) or (
        went_back and r['phase'] != 'end'
      ):
        open_segment(index)
    out[current[index]].append(r)
  return out


def _start_step(segment):
  """The step a process started from: its 'start' record's, or before its
  first step's."""
  for r in segment:
    if r['phase'] == 'start':
      return r['step']
  steps = [r['step'] for r in segment if r['phase'] != 'init']
  return (min(steps) - 1) if steps else 0


def x_positions(segment: Sequence[Record]) -> list[float]:
  """The x of each record of one process (see the module docstring)."""
  start = _start_step(segment)
  before = [
    r
    for r in segment
    if r['phase'] == 'init'
    or (r['step'] <= start and r['phase'] not in PROCESS_PHASES)
  ]
  per_step = collections.Counter(
    r['step']
    for r in segment
    if r['phase'] not in PROCESS_PHASES and not any(r is b for b in before)
  )
  seen: collections.Counter[int] = collections.Counter()
  xs = []
  n_before = 0
  for r in segment:
    if r['phase'] in ('start', 'step'):
      x = start if r['phase'] == 'start' else r['step']
    elif r['phase'] == 'end':
      x = r['step'] + 0.5
    elif any(r is b for b in before):
      n_before += 1
      x = start - 0.45 + 0.45 * n_before / len(before)
    else:
      seen[r['step']] += 1
      x = r['step'] - 1 + seen[r['step']] / (per_step[r['step']] + 1)
    xs.append(float(x))
  return xs
