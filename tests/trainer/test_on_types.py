"""Device memory of trax_revplus's trainer (`on_types`): the programs a real
step calls, what it holds across them, and the memory log's figure.

References: XLA's memory analysis of the very functions a real `one_step`
calls (recorded by wrapping them, with the arguments it passed); byte
counts of the real arrays (weights, slots, activations from running the
layers); trax's default `Trainer` for the values trained under a budget.
"""

import jax
import pytest
from trax import fastmath
from trax import layers as tl
from trax import optimizers

import trax_revplus
from trax_revplus.device_memory import program
from trax_revplus.trainer._step import copy_back
import trainer_cases as cases


def _trainer(**kwargs):
  batch = cases.batch()
  first, revs, loss = cases.basic_model()
  model = tl.Serial([first] + revs + [loss])
  model.init(batch, rng=fastmath.random.get_prng(12))
  trainer = trax_revplus.ReversibleSerialTrainer(
    [(first.sublayers, revs)], loss, optimizers.Adam, **kwargs
  )
  return model, trainer


def _recording(fn, calls):
  def call(*args):
    calls.append((fn, args))
    return fn(*args)

  return call


def _record_step(trainer):
  """Runs one real step, recording each compiled call and its arguments."""
  units = trainer.planned(cases.batch()).units
  calls = []
  for unit in units.forward_units:
    unit.forward_fn = _recording(unit.forward_fn, calls)
  loss_fn = units.loss_unit.fn
  units.loss_unit.fn = _recording(loss_fn, calls)
  for unit in {id(u): u for u in units.backward_units}.values():
    unit.backward_fn = _recording(unit.backward_fn, calls)
  trainer.one_step(cases.batch(), cases.RNGS[0])
  return calls


_UNPLANNED = {'device_memory_budget_bytes': None}  # the settings as given


@pytest.mark.parametrize(
  'kwargs',
  [
    _UNPLANNED,
    {'segment_max_layers': 1, **_UNPLANNED},
    {'segment_max_layers': 4, 'backward_segment_max_layers': 2, **_UNPLANNED},
    {'batch_slices': 2, 'n_async_layers': 0, **_UNPLANNED},
    # Any budget that fits it chooses the fused program first.
    {'device_memory_budget_bytes': 2**40},
  ],
)
def test_accounted_programs_are_those_one_step_calls(kwargs):
  _, trainer = _trainer(**kwargs)
  memory = trainer.device_memory_of(cases.batch())
  calls = _record_step(trainer)
  assert len(memory.calls) == len(calls)
  for accounted, (fn, args) in zip(memory.calls, calls):
    real = program.analyze(fn, *program.abstract(args)).memory
    assert accounted.program == real, accounted.name
  names = [c.name for c in memory.calls]
  assert names[0].startswith(
    'loss program, layers 0..5'
    if kwargs['device_memory_budget_bytes']
    else 'forward layer 0'
  )
  assert [c.phase for c in memory.calls].count('loss') == 1


def _nbytes(tree):
  """Bytes of the leaves as device arrays (int64 batches become int32)."""
  return sum(
    jax.numpy.asarray(x).nbytes for x in jax.tree_util.tree_leaves(tree)
  )


def test_held_parts_match_the_real_arrays():
  model, trainer = _trainer(segment_max_layers=4, n_async_layers=8)
  memory = trainer.device_memory_of(cases.batch())
  layers = trainer.all_layers
  batch = cases.batch()
  # The model's own forward gives the loss layer's inputs: the stack the
  # loss call sees holds them, plus the targets and weights below.
  loss_call = next(c for c in memory.calls if c.phase == 'loss')
  sub = tl.Serial(layers[:-1])
  sub_out = sub(
    batch, weights=sub.weights, state=sub.state, rng=fastmath.random.get_prng(0)
  )
  held = {h.name: h.size_bytes for h in loss_call.held}
  assert held['stack'] == _nbytes(sub_out)
  # Before the first backward call, the loss layer's update waits to be
  # copied back (n_async_layers=8 > its 1 layer): its weights, slots and
  # state, as the host keeps them.
  loss_layer = layers[-1]
  first_bwd = next(c for c in memory.calls if c.phase == 'backward')
  held = {h.name: h.size_bytes for h in first_bwd.held}
  opt = trainer._store.optimizers[-1]  # pylint: disable=protected-access
  assert held['updates not yet copied back'] == (
    _nbytes(loss_layer.weights) + _nbytes(opt.slots) + _nbytes(loss_layer.state)
  )
  # At the first forward call the next unit's weights are placed ahead:
  # the segment of reversible layers 1..4.
  first_fwd = memory.calls[0]
  held = {h.name: h.size_bytes for h in first_fwd.held}
  assert held['weights placed ahead'] == _nbytes(
    [l.weights for l in layers[1:5]]
  )
  assert held['stack'] == _nbytes(batch)
  # Saved for the backward pass at the loss: the standard layers' inputs
  # (the batch's first leaf, then each one's outputs) and every state.
  held = {h.name: h.size_bytes for h in loss_call.held}
  assert held['saved block inputs and states'] >= _nbytes(batch[0])
  del model


def test_commit_waits_follows_n_async_layers():
  assert copy_back.commit_waits([1], 8) == 1
  assert copy_back.commit_waits([1, 4, 4], 8) == 2
  assert copy_back.commit_waits([4, 4, 4], 8) == 2
  assert copy_back.commit_waits([3], 0) == 0
  assert copy_back.commit_waits([8, 1], 1) == 1


@pytest.mark.parametrize(
  'kwargs', [{'n_async_layers': 0}, {'n_async_layers': 2}]
)
def test_updates_leave_the_device_when_the_step_commits_them(
  kwargs, monkeypatch
):
  """The accounting's updates not yet copied back are, at each call, the
  updates the real step has pushed and not yet committed."""
  _, trainer = _trainer(segment_max_layers=1, **kwargs)
  memory = trainer.device_memory_of(cases.batch())
  commits = trainer._commits  # pylint: disable=protected-access
  start, commit = commits.start, commits.commit
  pending = {}  # id(token) -> bytes of the update on the device
  at_calls = []

  def logged_start(updates):
    token = start(updates)
    pending[id(token)] = _nbytes(
      (updates.weights, updates.slots, updates.states)
    )
    return token

  def logged_commit(token):
    del pending[id(token)]
    return commit(token)

  monkeypatch.setattr(commits, 'start', logged_start)
  monkeypatch.setattr(commits, 'commit', logged_commit)
  units = trainer.planned(cases.batch()).units
  for unit in {id(u): u for u in units.backward_units}.values():
    fn = unit.backward_fn

    def wrapped(*args, fn=fn):
      at_calls.append(sum(pending.values()))
      return fn(*args)

    unit.backward_fn = wrapped
  trainer.one_step(cases.batch(), cases.RNGS[0])
  accounted = [
    dict((h.name, h.size_bytes) for h in c.held).get(
      'updates not yet copied back', 0
    )
    for c in memory.calls
    if c.phase == 'backward'
  ]
  assert accounted == at_calls
  assert not pending


def test_memory_log_records_the_accounted_peak(tmp_path):
  _, trainer = _trainer(
    memory_log_every_n_steps=1,
    output_dir=str(tmp_path),
    memory_log_tensorboard=False,
    **_UNPLANNED,
  )
  cases.check_logged_peaks(trainer, cases.batch(), tmp_path)
