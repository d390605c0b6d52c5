"""`save_checkpoint`: bound by `activate()`, safe on a full disk.

A save onto a full disk (a 4 MiB tmpfs when the tests run as root, else a
writer that raises ENOSPC) leaves the previous sets as they were and
nothing of its own, and `trax-revplus train` reports it in one line.
"""

import errno
import os
import subprocess

import pytest

from trax import layers as tl
from trax.supervised import training

import checkpoint_cases as cases
import trax_revplus
from trax_revplus import checkpoints
from trax_revplus import errors
from trax_revplus.cli import failures
from trax_revplus.cli import messages


pytestmark = pytest.mark.usefixtures('stock_trax_and_empty_gin')


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


@pytest.fixture(name='small_filesystem')
def fixture_small_filesystem(tmp_path):
  """(dir, real): a 4 MiB tmpfs when this runs as root, else a plain dir."""
  mount = tmp_path / 'small'
  mount.mkdir()
  real = (
    hasattr(os, 'geteuid')
    and os.geteuid() == 0
    and subprocess.run(
      ['mount', '-t', 'tmpfs', '-o', 'size=4m', 'tmpfs', str(mount)],
      capture_output=True,
      check=False,
    ).returncode
    == 0
  )
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
  small_filesystem, monkeypatch
):
  mount, real = small_filesystem
  run_dir = mount / 'run'
  loop = cases.make_loop(run_dir)
  loop.run(3)  # Sets of steps 1 and 3.
  weights3, slots3 = cases.weights_of(loop), cases.slots_of(loop)
  loop.run(1)
  before = {
    n: (run_dir / n).read_bytes()
    for n in os.listdir(run_dir)
    if n.startswith('model.')
  }
  if real:
    _fill(mount)
  else:

    def np_to_file_on_a_full_disk(arrays, file_path, compresslevel):
      del arrays, compresslevel
      with open(file_path + '._tmp_', 'wb') as f:
        f.write(b'\x1f\x8b\x08')
      raise OSError(
        errno.ENOSPC, 'No space left on device', file_path + '._tmp_'
      )

    monkeypatch.setattr(tl, 'np_to_file', np_to_file_on_a_full_disk)
  with pytest.raises(checkpoints.CheckpointWriteError) as info:
    loop.save_checkpoint('model')
  message = str(info.value)
  assert message.startswith(
    f'cannot write checkpoint model (step 4) in '
    f'{run_dir}: no space left on the device ('
  )
  assert (
    'MiB free); the last good checkpoint '
    f'{run_dir}/model.pkl.gz (step 3) is intact'
  ) in message
  # The sets are as they were; nothing of the failed save is left.
  after = {
    n: (run_dir / n).read_bytes()
    for n in os.listdir(run_dir)
    if n.startswith('model.')
  }
  assert after == before
  assert not [n for n in os.listdir(run_dir) if 'tmp' in n]
  ok, manifest, reason = checkpoints.verify(str(run_dir), 'model')
  assert ok and manifest['step'] == 3, reason
  checkpoints.load_checkpoint(loop, str(run_dir))
  assert loop.step == 3
  cases.assert_equal(weights3, cases.weights_of(loop))
  cases.assert_equal(slots3, cases.slots_of(loop))
  # What `trax-revplus train` prints: one line, exit status 1.
  error = failures.user_error(info.value, str(run_dir), True, [])
  assert error.exit_code == errors.EXIT_RUNTIME
  line = messages.error_line('train', str(error))
  assert len(line.splitlines()) == 1
  assert (
    '(step 3) is intact; free some space and run the same command to '
    'resume' in line
  )
