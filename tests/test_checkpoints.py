"""Checkpoint sets under trax_revplus: consistent, exact to resume, and safe.

A Loop with dropout trains 6 steps uninterrupted; the reference for every
comparison is that run. A run of 3 steps + restart + 3 steps must reach the
same weights (which needs the Loop's RNG and the data counters resumed from
the set loaded: stock trax restarts the RNG from the seed and takes the
counters from a file written apart from the set); a consistent set loads
bit-exactly; a set with a truncated weights file, a flipped byte in any of
its files, or an older `.pkl.gz` beside newer weights, is detected and the
previous set (step 3) loads instead, with a warning. A save onto a full
disk leaves the previous sets as they were and nothing of its own.
"""

import errno
import json
import os
import shutil
import subprocess

import numpy as np
import pytest

from absl import logging as absl_logging
from trax import fastmath
from trax import layers as tl
from trax import optimizers
from trax.data import inputs as trax_inputs
from trax.supervised import training

import trax_revplus
from trax_revplus import checkpoints
from trax_revplus import data
from trax_revplus.cli import errors
from trax_revplus.cli import failures


pytestmark = pytest.mark.usefixtures('stock_trax_and_empty_gin')


def _batches():
  k = 0
  while True:
    x = (np.arange(8).reshape((2, 4)) + k) % 9
    yield (x, (2 * x + 1) % 9, np.ones_like(x, dtype=np.float32))
    k += 1


def _model():
  return tl.Serial(
      tl.Embedding(9, 4), tl.Dropout(rate=0.5, mode='train'), tl.Dup(),
      tl.ReversibleHalfResidual(tl.Dense(4)), tl.ReversibleSwap(),
      tl.ReversibleHalfResidual(tl.Dense(4), tl.Relu()), tl.ReversibleSwap(),
      tl.Concatenate(), tl.Dropout(rate=0.5, mode='train'), tl.Dense(9),
      tl.LogSoftmax())


def _loop(output_dir, evals=False):
  trax_revplus.activate()
  # As in a fresh process; trax's count_and_skip makes the stream resumable
  # from the data counters a checkpoint restores.
  trax_inputs.data_counters = {}
  stream = trax_inputs.count_and_skip(_batches(), 'test_checkpoints')
  task = training.TrainTask(stream, tl.CrossEntropyLoss(),
                            optimizers.Adam, n_steps_per_checkpoint=3)
  # With evals, trax evaluates at its checkpoint steps (1, 3, 6), after it
  # saves, and each eval batch takes a key from the Loop's RNG.
  eval_tasks = ([training.EvalTask(_batches(), [tl.CrossEntropyLoss()],
                                   n_eval_batches=2)] if evals else None)
  return training.Loop(_model(), [task], eval_tasks=eval_tasks,
                       output_dir=str(output_dir), random_seed=0,
                       use_memory_efficient_trainer=True)


def _weights(loop):
  return [np.array(w) for w in fastmath.tree_flatten(loop.model.weights)]


def _slots(loop):
  return [np.array(s) for s in fastmath.tree_flatten(
      loop._trainer_per_task[0].slots)]  # pylint: disable=protected-access


def _assert_equal(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x, y)


@pytest.fixture(scope='module')
def continuous(tmp_path_factory):
  """6 uninterrupted steps: (dir, weights/slots at step 3, at step 6, rng)."""
  trax_revplus.deactivate()
  path = tmp_path_factory.mktemp('continuous')
  loop = _loop(path)
  loop.run(3)
  at3 = (_weights(loop), _slots(loop))
  loop.run(3)
  at6 = (_weights(loop), _slots(loop))
  rng = np.asarray(loop._rng)  # pylint: disable=protected-access
  trax_revplus.deactivate()
  return path, at3, at6, rng


def test_writes_sets_with_manifest_and_previous_set(continuous):
  path, *_ = continuous
  manifest = json.loads((path / 'model.manifest.json').read_text())
  assert manifest['step'] == 6 and manifest['state'] == 'complete'
  assert sorted(manifest['files']) == ['.opt_slots0.npy.gz', '.pkl.gz',
                                       '.weights.npy.gz']
  previous = json.loads((path / 'model.prev.manifest.json').read_text())
  assert previous['step'] == 3
  for suffix, entry in manifest['files'].items():
    assert os.path.getsize(path / f'model{suffix}') == entry['bytes']
  assert not [n for n in os.listdir(path) if '.tmp' in n or '_tmp_' in n]
  assert training.unpickle_from_file(str(path / 'model.pkl.gz'),
                                     gzip=True)['step'] == 6


def test_consistent_set_loads_bit_exactly(continuous):
  path, _, (weights6, slots6), rng = continuous
  loop = _loop(path)
  assert loop.step == 6
  _assert_equal(weights6, _weights(loop))
  _assert_equal(slots6, _slots(loop))
  np.testing.assert_array_equal(rng, np.asarray(loop._rng))  # pylint: disable=protected-access


def test_restart_with_dropout_reaches_the_same_weights(continuous, tmp_path):
  _, _, (weights6, slots6), _ = continuous
  _loop(tmp_path).run(3)
  resumed = _loop(tmp_path)
  assert resumed.step == 3
  resumed.run(3)
  for got, want in zip(_weights(resumed) + _slots(resumed),
                       weights6 + slots6):
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_restart_at_an_eval_step_reaches_the_same_weights(tmp_path):
  reference = _loop(tmp_path / 'reference', evals=True)
  reference.run(6)
  want = _weights(reference) + _slots(reference)
  _loop(tmp_path / 'run', evals=True).run(3)
  resumed = _loop(tmp_path / 'run', evals=True)
  assert resumed.step == 3
  resumed.run(3)
  got = _weights(resumed) + _slots(resumed)
  assert len(got) == len(want)
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


@pytest.fixture
def warnings_logged(monkeypatch):
  messages = []
  monkeypatch.setattr(absl_logging, 'warning',
                      lambda msg, *args: messages.append(msg % args))
  return messages


def _damaged_copy(continuous, tmp_path, damage):
  path = tmp_path / 'run'
  shutil.copytree(continuous[0], path)
  damage(path)
  return path


def _truncate(file_path):
  size = os.path.getsize(file_path)
  with open(file_path, 'r+b') as f:
    f.truncate(size // 2)


def test_truncated_weights_fall_back_to_previous_set(
    continuous, tmp_path, warnings_logged):
  _, (weights3, slots3), _, _ = continuous
  path = _damaged_copy(continuous, tmp_path,
                       lambda p: _truncate(p / 'model.weights.npy.gz'))
  loop = _loop(path)
  assert loop.step == 3
  _assert_equal(weights3, _weights(loop))
  _assert_equal(slots3, _slots(loop))
  assert len(warnings_logged) == 1
  assert 'model.weights.npy.gz has' in warnings_logged[0]
  assert 'loading the previous set model.prev (step 3)' in warnings_logged[0]


def test_mixed_set_falls_back_to_previous_set(continuous, tmp_path,
                                              warnings_logged):
  _, (weights3, _), _, _ = continuous
  # Newer weights beside an older .pkl.gz: what a crash between trax's
  # separate file writes leaves.
  path = _damaged_copy(continuous, tmp_path, lambda p: shutil.copy(
      p / 'model.prev.pkl.gz', p / 'model.pkl.gz'))
  loop = _loop(path)
  assert loop.step == 3
  _assert_equal(weights3, _weights(loop))
  assert 'model.pkl.gz' in warnings_logged[0]


def test_interrupted_install_falls_back_and_no_good_set_raises(
    continuous, tmp_path, warnings_logged):
  def mark_installing(p):
    (p / 'model.manifest.json').write_text(json.dumps(
        dict(format=checkpoints.FORMAT, state='installing', step=9)))
  path = _damaged_copy(continuous, tmp_path, mark_installing)
  assert _loop(path).step == 3
  assert 'writing the set of step 9 was interrupted' in warnings_logged[0]
  _truncate(path / 'model.prev.opt_slots0.npy.gz')
  with pytest.raises(checkpoints.CheckpointError,
                     match=r'checkpoint set model in .* is inconsistent .* no '
                           r'good previous set \(model\.prev\.opt_slots0\.'
                           r'npy\.gz has .*\); nothing was loaded'):
    _loop(path)


def test_deactivate_restores_the_loop_methods_found(monkeypatch):
  def patched_save(loop, basename):
    del loop, basename
  monkeypatch.setattr(training.Loop, 'save_checkpoint', patched_save)
  stock_load = training.Loop.load_checkpoint
  trax_revplus.activate()
  assert training.Loop.save_checkpoint is checkpoints.save_checkpoint
  assert training.Loop.load_checkpoint is checkpoints.load_checkpoint
  trax_revplus.deactivate()
  assert training.Loop.save_checkpoint is patched_save
  assert training.Loop.load_checkpoint is stock_load


def test_train_stream_resumes_from_data_counters(tmp_path, monkeypatch):
  (tmp_path / 'a.txt').write_bytes(bytes(range(32, 127)) * 20)
  monkeypatch.setattr(trax_inputs, 'data_counters', {})
  corpus = data.load_corpus(paths=str(tmp_path / 'a.txt'), split_by='bytes',
                            sequence_length=8, batch_size=2)
  stream = corpus.train_stream(1)
  first = [next(stream) for _ in range(5)]
  assert trax_inputs.data_counters[data.TRAIN_COUNTER] == 5
  resumed = corpus.train_stream(1)
  _assert_equal(first[0], next(resumed))
  # What Loop.load_checkpoint does: replace the counters dict.
  trax_inputs.data_counters = {data.TRAIN_COUNTER: 3}
  _assert_equal(first[3], next(resumed))
  _assert_equal(first[4], next(resumed))


@pytest.fixture(name='loader', scope='module')
def fixture_loader(tmp_path_factory):
  """A Loop (ours, fresh) into which sets of other dirs are loaded.

  Load with trax_revplus active: stock trax's `fastmath.tree_unflatten`
  fails on current JAX, and activation binds its fix.
  """
  trax_revplus.deactivate()
  loop = _loop(tmp_path_factory.mktemp('loader'))
  trax_revplus.deactivate()
  return loop


def _flip_middle_byte(file_path):
  data_ = bytearray(file_path.read_bytes())
  data_[len(data_) // 2] ^= 0xFF
  file_path.write_bytes(bytes(data_))


def test_flipped_byte_in_each_file_falls_back_to_previous_set(
    continuous, loader, tmp_path, warnings_logged):
  _, (weights3, slots3), (weights6, _), _ = continuous
  manifest = json.loads((continuous[0] / 'model.manifest.json').read_text())
  names = ['model' + suffix for suffix in manifest['files']]
  names.append('model.manifest.json')
  assert len(names) == 4
  for name in names:
    path = _damaged_copy(continuous, tmp_path / name,
                         lambda p, n=name: _flip_middle_byte(p / n))
    del warnings_logged[:]
    trax_revplus.activate()
    checkpoints.load_checkpoint(loader, str(path))
    assert loader.step == 3, name
    _assert_equal(weights3, _weights(loader))
    _assert_equal(slots3, _slots(loader))
    assert len(warnings_logged) == 1, warnings_logged
    assert name in warnings_logged[0]
    assert 'loading the previous set model.prev (step 3)' in (
        warnings_logged[0])
  # The undamaged set itself loads as written.
  checkpoints.load_checkpoint(loader, str(continuous[0]))
  assert loader.step == 6
  _assert_equal(weights6, _weights(loader))


def test_set_without_manifest_loads_as_stock_with_a_warning(
    continuous, loader, tmp_path, warnings_logged):
  _, _, (weights6, _), _ = continuous
  def strip_manifests(p):
    for name in os.listdir(p):
      if name.endswith('.manifest.json'):
        os.remove(p / name)
  path = _damaged_copy(continuous, tmp_path, strip_manifests)
  trax_revplus.activate()
  checkpoints.load_checkpoint(loader, str(path))
  assert loader.step == 6
  _assert_equal(weights6, _weights(loader))
  assert len(warnings_logged) == 1
  assert 'has no model.manifest.json (written by stock trax)' in (
      warnings_logged[0])
  assert 'cannot be verified' in warnings_logged[0]


def test_interrupted_first_save_is_removed_and_training_starts_over(
    continuous, tmp_path, warnings_logged):
  def first_save_killed_while_installing(p):
    for name in os.listdir(p):
      if name.startswith('model.prev.'):
        os.remove(p / name)
    os.remove(p / 'model.pkl.gz')  # Not installed yet; the others are.
    (p / 'model.manifest.json').write_text(json.dumps(
        dict(format=checkpoints.FORMAT, state='installing', step=1)))
    (p / 'model.tmp').mkdir()
    (p / 'model.tmp' / 'model.pkl.gz._tmp_').write_bytes(b'\x1f\x8b')
  path = _damaged_copy(continuous, tmp_path, first_save_killed_while_installing)
  loop = _loop(path)
  assert loop.step == 0
  assert not [n for n in os.listdir(path) if n.startswith('model.')]
  assert 'the first save of checkpoint model' in warnings_logged[0]
  assert 'was interrupted before it was complete' in warnings_logged[0]


def test_unreadable_data_counters_file_is_ignored(tmp_path, monkeypatch,
                                                  warnings_logged):
  monkeypatch.setattr(trax_inputs, 'data_counters', {'stream': 4})
  for content in (b'', b'\x80\x04not a pickle'):
    (tmp_path / 'data_counters0.pkl').write_bytes(content)
    with pytest.raises(Exception):  # As trax's own loader fails.
      checkpoints.stock_load_data_counters(str(tmp_path))
    checkpoints.load_data_counters(str(tmp_path))
    assert trax_inputs.data_counters == {'stream': 4}
    assert 'data_counters0.pkl is unreadable' in warnings_logged[-1]
    checkpoints.set_aside_unreadable_data_counters(str(tmp_path))
    assert not (tmp_path / 'data_counters0.pkl').exists()
    assert (tmp_path / 'data_counters0.pkl.unreadable').read_bytes() == (
        content)


@pytest.fixture(name='small_filesystem')
def fixture_small_filesystem(tmp_path):
  """(dir, real): a 4 MiB tmpfs when this runs as root, else a plain dir."""
  mount = tmp_path / 'small'
  mount.mkdir()
  real = hasattr(os, 'geteuid') and os.geteuid() == 0 and subprocess.run(
      ['mount', '-t', 'tmpfs', '-o', 'size=4m', 'tmpfs', str(mount)],
      capture_output=True, check=False).returncode == 0
  yield mount, real
  if real:
    subprocess.run(['umount', '-l', str(mount)], check=False)


def _fill(directory):
  """Writes a file into `directory` until its file system is full."""
  with open(directory / 'filler', 'wb') as f:
    try:
      while True:
        f.write(b'\0' * 65536)
        f.flush()
    except OSError as e:
      assert e.errno == errno.ENOSPC


def test_save_on_a_full_disk_keeps_the_sets_and_leaves_nothing(
    small_filesystem, monkeypatch):
  mount, real = small_filesystem
  run_dir = mount / 'run'
  loop = _loop(run_dir)
  loop.run(3)  # Sets of steps 1 and 3.
  weights3, slots3 = _weights(loop), _slots(loop)
  loop.run(1)
  before = {n: (run_dir / n).read_bytes() for n in os.listdir(run_dir)
            if n.startswith('model.')}
  if real:
    _fill(mount)
  else:
    def np_to_file_on_a_full_disk(arrays, file_path, compresslevel):
      del arrays, compresslevel
      with open(file_path + '._tmp_', 'wb') as f:
        f.write(b'\x1f\x8b\x08')
      raise OSError(errno.ENOSPC, 'No space left on device',
                    file_path + '._tmp_')
    monkeypatch.setattr(tl, 'np_to_file', np_to_file_on_a_full_disk)
  with pytest.raises(checkpoints.CheckpointWriteError) as info:
    loop.save_checkpoint('model')
  message = str(info.value)
  assert message.startswith(f'cannot write checkpoint model (step 4) in '
                            f'{run_dir}: no space left on the device (')
  assert ('MiB free); the last good checkpoint '
          f'{run_dir}/model.pkl.gz (step 3) is intact') in message
  # The sets are as they were; nothing of the failed save is left.
  after = {n: (run_dir / n).read_bytes() for n in os.listdir(run_dir)
           if n.startswith('model.')}
  assert after == before
  assert not [n for n in os.listdir(run_dir) if 'tmp' in n]
  ok, manifest, reason = checkpoints.verify(str(run_dir), 'model')
  assert ok and manifest['step'] == 3, reason
  checkpoints.load_checkpoint(loop, str(run_dir))
  assert loop.step == 3
  _assert_equal(weights3, _weights(loop))
  _assert_equal(slots3, _slots(loop))
  # What `trax-revplus train` prints: one line, exit status 1.
  error = failures.user_error(info.value, str(run_dir), True, [])
  assert error.exit_code == errors.EXIT_RUNTIME
  line = errors.error_line('train', str(error))
  assert len(line.splitlines()) == 1
  assert f'(step 3) is intact; free some space and run the same command to ' \
         f'resume' in line
