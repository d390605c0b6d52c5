"""Checkpoint sets written and read as a unit, and resumed exactly.

trax's `Loop.save_checkpoint(basename)` writes a checkpoint as separate
files, `<basename>.weights.npy.gz`, `<basename>.opt_slots<i>.npy.gz` and
`<basename>.pkl.gz` (step, state, history), each atomically but not as a set:
a crash between them leaves weights of one step beside metadata of another,
and `Loop.load_checkpoint` loads such a mix (or a truncated weights file, of
which `tl.np_from_file` silently reads the arrays before the cut) without a
word. Two more things a restarted trax run does not resume: the Loop's RNG
(`Loop.new_rng` splits it once per step, from the seed again after a
restart, so dropout masks differ) and, unless the data stream uses trax's
data counters, the position in the training data.

`activate()` binds `save_checkpoint` and `load_checkpoint` here in place of
the Loop's methods (`deactivate()` restores them). Saving:

  1. stock trax writes the files under `<basename>.tmp` in the output dir;
     each is flushed to disk (fsync);
  2. the current set, if complete, becomes the previous one,
     `<basename>.prev.*`, by hard links (no copy; a copy where links fail);
  3. `<basename>.manifest.json` is marked "installing", the new files are
     renamed into place (os.replace), then the manifest is written (atomic
     rename): step, each file's size and gzip trailer (CRC-32 and length of
     its content, which gzip computes while writing), the Loop's RNG and
     trax's data counters.

Loading verifies the manifest against the files (8 bytes read per file): a
truncated file, a file of another set, or an interrupted install makes the
set inconsistent, and the previous set is loaded instead, with a warning.
The Loop's RNG and `trax.data.inputs.data_counters` are restored from the
manifest of the set loaded. A set without a manifest (written by stock trax)
loads as stock trax loads it; stock trax loads our sets unchanged.
"""

import json
import os
import shutil

from absl import logging
import numpy as np

from trax import layers as tl
from trax.data import inputs as trax_inputs
from trax.fastmath import numpy as jnp
from trax.supervised import callbacks
from trax.supervised import training

FORMAT = 'trax_revplus.checkpoint_set/1'
MANIFEST_SUFFIX = '.manifest.json'
PREVIOUS = '.prev'
_TMP = '.tmp'

# trax's own methods, as bound when this module was imported; `activate()`
# binds `save_checkpoint` / `load_checkpoint` below in their place.
stock_save_checkpoint = training.Loop.save_checkpoint
stock_load_checkpoint = training.Loop.load_checkpoint


class CheckpointError(RuntimeError):
  """No consistent checkpoint set to resume from, though one was written."""


def manifest_path(directory, basename):
  """Path of the manifest of set `basename` in `directory` (str)."""
  return os.path.join(directory, basename + MANIFEST_SUFFIX)


def _describe_file(path):
  """Size (bytes) and gzip trailer (CRC-32 + length of content, hex)."""
  with open(path, 'rb') as f:
    f.seek(0, os.SEEK_END)
    size = f.tell()
    f.seek(max(size - 8, 0))
    trailer = f.read(8)
  return {'bytes': size, 'gzip_trailer': trailer.hex()}


def _fsync(path):
  fd = os.open(path, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


def _fsync_dir(directory):
  try:
    _fsync(directory)
  except OSError:
    pass  # Some platforms cannot open or fsync a directory.


def _write_json_atomic(path, obj):
  tmp = path + '._tmp_'
  with open(tmp, 'w') as f:
    json.dump(obj, f, indent=1, sort_keys=True)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)
  _fsync_dir(os.path.dirname(path))


def _remove(path):
  try:
    os.remove(path)
  except FileNotFoundError:
    pass


def _set_files(directory, basename):
  """Suffixes of the finished files of set `basename` in `directory`."""
  prefix = basename + '.'
  return sorted(
      name[len(basename):] for name in os.listdir(directory)
      if name.startswith(prefix) and name.endswith('.gz') and
      not name.startswith(prefix + 'prev.') and
      not name.startswith(prefix + 'tmp.'))


def verify(directory, basename):
  """Checks set `basename` in `directory` against its manifest.

  Args:
    directory: str.
    basename: str, e.g. 'model'.

  Returns:
    (ok, manifest, reason): ok a bool; manifest the parsed dict, {} if
    unreadable, None if there is none (a set written by stock trax, or no
    set); reason a str saying what is inconsistent ('' if ok).
  """
  path = manifest_path(directory, basename)
  if not os.path.exists(path):
    return False, None, f'no {os.path.basename(path)}'
  try:
    with open(path) as f:
      manifest = json.load(f)
  except (OSError, ValueError) as e:
    return False, {}, f'{os.path.basename(path)} is unreadable ({e})'
  if not isinstance(manifest, dict) or manifest.get('format') != FORMAT:
    return False, {}, f'{os.path.basename(path)} is not a {FORMAT} manifest'
  if manifest.get('state') != 'complete':
    return False, manifest, (f'writing the set of step '
                             f'{manifest.get("step")} was interrupted')
  for suffix, expected in sorted(manifest.get('files', {}).items()):
    name = basename + suffix
    file_path = os.path.join(directory, name)
    if not os.path.exists(file_path):
      return False, manifest, f'{name} is missing'
    found = _describe_file(file_path)
    if found['bytes'] != expected['bytes']:
      return False, manifest, (f'{name} has {found["bytes"]} bytes, the set '
                               f'of step {manifest["step"]} wrote '
                               f'{expected["bytes"]} (truncated or replaced)')
    if found != expected:
      return False, manifest, (f'{name} is not the file the set of step '
                               f'{manifest["step"]} wrote (gzip CRC differs)')
  return True, manifest, ''


def describe_last_good(directory, basename='model'):
  """One clause naming the checkpoint a resumed run would load.

  Args:
    directory: str or None, the run's output dir.
    basename: str.

  Returns:
    str, e.g. 'the last good checkpoint /run/model.pkl.gz (step 10) is
    intact'.
  """
  if directory is None:
    return 'no checkpoint directory is set'
  for name in (basename, basename + PREVIOUS):
    ok, manifest, _ = verify(directory, name)
    if ok:
      pkl = os.path.join(directory, name + '.pkl.gz')
      return (f'the last good checkpoint {pkl} (step {manifest["step"]}) is '
              f'intact')
  pkl = os.path.join(directory, basename + '.pkl.gz')
  if os.path.exists(pkl):
    return f'the checkpoint {pkl} was not touched'
  return f'no checkpoint was written to {directory} yet'


def _link_set(directory, source, target, manifest):
  """Makes set `target` a copy of consistent set `source` (hard links)."""
  _remove(manifest_path(directory, target))  # Incomplete until rewritten.
  for suffix in manifest['files']:
    src = os.path.join(directory, source + suffix)
    dst = os.path.join(directory, target + suffix)
    _remove(dst)
    try:
      os.link(src, dst)
    except OSError:
      shutil.copy2(src, dst)
      _fsync(dst)
  _fsync_dir(directory)
  _write_json_atomic(manifest_path(directory, target), manifest)


def _loop_extras(loop):
  """The Loop's RNG and trax's data counters, as JSON values."""
  rng = getattr(loop, '_rng', None)
  return {
      'loop_rng': (None if rng is None else
                   np.asarray(rng).astype(np.uint32).tolist()),
      'data_counters': {str(k): int(v)
                        for k, v in trax_inputs.data_counters.items()},
  }


def _restore_extras(loop, manifest):
  rng = manifest.get('loop_rng')
  if rng is not None:
    key = jnp.asarray(np.asarray(rng, dtype=np.uint32))
    # As `Loop.new_rng` keeps it: in host memory for the memory-efficient
    # trainer.
    if getattr(loop, '_use_memory_efficient_trainer', False):
      key = tl.on_cpu(key)
    loop._rng = key  # pylint: disable=protected-access
  counters = manifest.get('data_counters')
  if counters is not None:
    trax_inputs.data_counters = dict(counters)


def save_checkpoint(loop, basename):
  """`training.Loop.save_checkpoint`, writing a consistent set.

  Writes the files trax writes (same names and contents), plus
  `<basename>.manifest.json`, and keeps the set it replaces as
  `<basename>.prev.*`; see the module docstring. Without an output dir, or
  on a non-chief host, behaves as trax.

  Args:
    loop: the `training.Loop`.
    basename: str, e.g. 'model' or 'model_1000'.

  Raises:
    OSError: if the output dir cannot be written (the previous set stays
      loadable).
  """
  directory = loop.output_dir
  if directory is None or not loop.is_chief:
    return stock_save_checkpoint(loop, basename)
  tmp = basename + _TMP
  for suffix in _set_files(directory, tmp):
    _remove(os.path.join(directory, tmp + suffix))
  stock_save_checkpoint(loop, tmp)
  files = {}
  for suffix in _set_files(directory, tmp):
    path = os.path.join(directory, tmp + suffix)
    _fsync(path)
    files[suffix] = _describe_file(path)
  manifest = dict(format=FORMAT, state='complete', step=int(loop.step),
                  files=files, **_loop_extras(loop))

  current_ok, current, _ = verify(directory, basename)
  if current_ok:
    _link_set(directory, basename, basename + PREVIOUS, current)
  _write_json_atomic(manifest_path(directory, basename),
                     dict(format=FORMAT, state='installing',
                          step=int(loop.step)))
  for suffix in files:
    os.replace(os.path.join(directory, tmp + suffix),
               os.path.join(directory, basename + suffix))
  _fsync_dir(directory)
  _write_json_atomic(manifest_path(directory, basename), manifest)


def load_checkpoint(loop, directory=None, filename=None):
  """`training.Loop.load_checkpoint`, loading only a consistent set.

  A set with a manifest loads if its files match it; otherwise the previous
  set (`<filename>.prev`) loads, with a warning. The Loop's RNG and trax's
  data counters are restored from the manifest of the set loaded. A set
  without a manifest (written by stock trax) and no set at all behave as in
  trax.

  Args:
    loop: the `training.Loop`.
    directory: str or None (the Loop's output dir).
    filename: str or None ('model'), the set's basename.

  Raises:
    CheckpointError: if the set has a manifest but neither it nor the
      previous set is consistent; the message names the files and the fix.
  """
  directory = directory or loop.output_dir
  filename = filename or 'model'
  if directory is None:
    return stock_load_checkpoint(loop, directory, filename)
  ok, manifest, reason = verify(directory, filename)
  if manifest is None:
    return stock_load_checkpoint(loop, directory, filename)
  if not ok:
    previous = filename + PREVIOUS
    ok, manifest, previous_reason = verify(directory, previous)
    if not ok:
      raise CheckpointError(
          f'checkpoint set {filename} in {directory} is inconsistent '
          f'({reason}) and there is no good previous set ({previous_reason}); '
          f'nothing was loaded. To start from scratch, move {filename}.* '
          f'out of {directory}; to load it anyway, use stock trax '
          f'(trax_revplus.deactivate()).')
    logging.warning('checkpoint set %s in %s is inconsistent (%s); loading '
                    'the previous set %s (step %s) instead.', filename,
                    directory, reason, previous, manifest['step'])
    filename = previous
  stock_load_checkpoint(loop, directory, filename)
  _restore_extras(loop, manifest)


class Interrupted(Exception):
  """A run stopped at a step boundary after SIGINT or SIGTERM.

  Attributes:
    signum: int, the signal received.
    step: int or None, the Loop's step when it stopped (None: before the
      first step).
    checkpoint: str or None, path of the `.pkl.gz` saved at that step.
    loop: the `training.Loop`, or None if it stopped while being built.
  """

  def __init__(self, signum, step=None, checkpoint=None, loop=None):
    super().__init__(f'interrupted by signal {signum} at step {step}')
    self.signum = signum
    self.step = step
    self.checkpoint = checkpoint
    self.loop = loop


class StopOnSignal:
  """Stops a `training.Loop` at the next step boundary on SIGINT / SIGTERM.

  A context manager: while entered, SIGINT and SIGTERM only set a flag (a
  second one of either does what it did before, e.g. a plain Ctrl-C). Pass
  `callback` in the Loop's callbacks; at the end of the step during which
  the signal came, it saves the checkpoint `basename` and raises
  `Interrupted` out of `Loop.run`. Use from the main thread (signal handlers
  can only be installed there).

  Attributes:
    signum: int or None, the first signal received.
  """

  SIGNALS = ('SIGINT', 'SIGTERM')

  def __init__(self, basename='model'):
    self.basename = basename
    self.signum = None
    self._previous = {}

  def __enter__(self):
    import signal  # pylint: disable=g-import-not-at-top
    for name in self.SIGNALS:
      signum = getattr(signal, name)
      self._previous[signum] = signal.signal(signum, self._handle)
    return self

  def __exit__(self, *exc_info):
    self._restore()
    return False

  def _restore(self):
    import signal  # pylint: disable=g-import-not-at-top
    previous, self._previous = self._previous, {}
    for signum, handler in previous.items():
      signal.signal(signum, handler)

  def _handle(self, signum, frame):
    del frame
    if self.signum is not None:
      # Asked twice: stop now, as without this handler.
      self._restore()
      os.kill(os.getpid(), signum)
      return
    self.signum = signum
    logging.warning('signal %d received: stopping after this step with a '
                    'checkpoint (send it again to stop at once).', signum)

  def callback(self, loop):
    """The Loop callback (trax calls `callback(loop)` for each class)."""
    return _StopOnSignalCallback(loop, self)


class _StopOnSignalCallback(callbacks.TrainingStepCallback):
  """The Loop callback of `StopOnSignal`."""

  def __init__(self, loop, owner):
    super().__init__(loop)
    self._owner = owner
    if owner.signum is not None:  # Came while the Loop was being built.
      raise Interrupted(owner.signum, loop=loop)

  def call_at(self, step):
    del step
    return True

  def on_step_begin(self, step):
    del step

  def on_step_end(self, step):
    owner = self._owner
    if owner.signum is None:
      return
    checkpoint = None
    if self._loop.output_dir is not None:
      self._loop.save_checkpoint(owner.basename)
      checkpoint = os.path.join(self._loop.output_dir,
                                owner.basename + '.pkl.gz')
    raise Interrupted(owner.signum, step=step, checkpoint=checkpoint,
                      loop=self._loop)
