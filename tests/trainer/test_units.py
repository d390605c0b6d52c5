"""Units and the segment plan: segments run forward and backward exactly as
one call per layer would (trax's default Trainer is the reference)."""

import numpy as np
import pytest

from trax import fastmath
from trax import layers as tl
from trax import optimizers

import trainer_cases as cases
from trax_revplus import trainer as rev_trainer
from trax_revplus.trainer._plan import segment_lengths

pytestmark = pytest.mark.usefixtures('stock_trax')


@pytest.mark.parametrize(
  'backward_segment_max_layers,activation_bound_bytes,backward_lengths',
  [
    (1, None, [1, 1, 1, 1]),
    ('auto', None, [2, 2]),  # kilobyte activations
    ('auto', 0, [4]),
  ],
)  # as if activation-bound
def test_backward_segments_split_forward_ones(
  backward_segment_max_layers,
  activation_bound_bytes,
  backward_lengths,
  monkeypatch,
):
  """One forward segment of the 4 reversible layers, run backward as one
  call or as shorter segments: the same updates as trax's default Trainer,
  and the commits of each call wait for `n_async_layers` layers."""
  if activation_bound_bytes is not None:
    monkeypatch.setattr(
      segment_lengths, 'ACTIVATION_BOUND_BYTES', activation_bound_bytes
    )
  batch = cases.batch()
  ref_weights, ref_slots, ref_state = cases.basic_adam_reference_3_steps()
  first, revs, loss = cases.basic_model()
  model = tl.Serial([first] + revs + [loss])
  model.init(batch, rng=fastmath.random.get_prng(12))
  trainer = rev_trainer.ReversibleSerialTrainer(
    [(first.sublayers, revs)],
    loss,
    optimizers.Adam,
    segment_max_layers=4,
    backward_segment_max_layers=backward_segment_max_layers,
    n_async_layers=2,
    device_memory_budget_bytes=None,
  )
  events = []  # ('dispatch' | 'commit', layer indices of a call)
  commits = trainer._commits  # pylint: disable=protected-access
  start, commit = commits.start, commits.commit

  def logged_start(updates):
    events.append(('dispatch', list(updates.layers)))
    return start(updates)

  def logged_commit(entry):
    events.append(('commit', list(entry.layers)))
    return commit(entry)

  monkeypatch.setattr(commits, 'start', logged_start)
  monkeypatch.setattr(commits, 'commit', logged_commit)
  cases.train(trainer, batch, 3)
  units = trainer.planned(batch).units
  segment = units.forward_units[1]
  assert segment.layers == [1, 2, 3, 4]
  assert [
    len(u.layers) for u in units.backward_units[::-1] if u.layers != [0]
  ] == backward_lengths
  cases.assert_all_close(ref_weights, model.weights)
  cases.assert_all_close(ref_slots, trainer.slots)
  cases.assert_all_close(ref_state, model.state)
  # Backward calls of one step: loss, reversible calls last to first,
  # standard layer; each committed as soon as calls of >= 2 layers were
  # dispatched after it, the rest at the end of the step.
  calls = (
    [[5]]
    + [
      sorted(c, reverse=True)
      for c in reversed(
        [
          list(range(k, k + n))
          for k, n in zip(
            np.cumsum([1] + backward_lengths[:-1]), backward_lengths
          )
        ]
      )
    ]
    + [[0]]
  )
  step_events = events[: 2 * len(calls)]
  assert [c for kind, c in step_events if kind == 'dispatch'] == calls
  assert [c for kind, c in step_events if kind == 'commit'] == calls
  last_dispatch = max(
    k for k, (kind, _) in enumerate(step_events) if kind == 'dispatch'
  )
  for k, (kind, call) in enumerate(step_events[:last_dispatch]):
    if kind != 'commit':
      continue
    start = step_events.index(('dispatch', call))
    after = [
      len(c) for kind, c in step_events[start + 1 : k] if kind == 'dispatch'
    ]
    assert sum(after) >= 2 and sum(after) - after[-1] < 2, (call, after)
