"""Checkpoint sets written and committed as a unit, verified, resumed exactly.

trax's `Loop.save_checkpoint(basename)` writes a checkpoint as separate
files, `<basename>.weights.npy.gz`, `<basename>.opt_slots<i>.npy.gz` and
`<basename>.pkl.gz` (step, state, history), each atomically but not as a
set, and `data_counters<host>.pkl` (the data position) in place, not
atomically; `Loop.load_checkpoint` loads a mix of sets, or a damaged file
(`tl.np_from_file` silently keeps the arrays before a cut or a CRC error),
without a word. Two more things a restarted trax run does not resume: the
Loop's RNG (split once per step, from the seed again after a restart, so
dropout masks differ) and, unless the data counters file survived, the
position in the training data.

`activate()` binds `save_checkpoint` and `load_checkpoint` here in place of
the Loop's methods (`deactivate()` restores them). Saving commits a set the
way orbax commits a checkpoint directory (`orbax.checkpoint` `atomicity`:
write under a temporary name, then mark the set complete in one atomic
step):

  1. stock trax writes the set's files, and `data_counters<host>.pkl`, into
     the staging directory `<basename>.tmp/` (removed first if a killed save
     left it); each file is flushed to disk (fsync);
  2. the current set, if complete, becomes the previous one,
     `<basename>.prev.*`, by hard links (a copy where links fail);
  3. `<basename>.manifest.json` is marked "installing", the staged files
     are renamed into place (`.pkl.gz` last), then the manifest is written
     complete (atomic rename): step, each file's size and CRC-32 of its
     bytes, the Loop's RNG as its next step will find it (after the evals
     of this step, which trax runs after the save) and the data counters;
     the manifest carries a CRC-32 of its own content;
  4. `data_counters<host>.pkl` is renamed into the output dir, where stock
     trax reads it, and the staging directory is removed.

A failed save (e.g. a full disk) removes the staging directory and raises
`CheckpointWriteError`; the sets already there are untouched.

Loading verifies the manifest and recomputes each file's CRC-32: a damaged
or truncated file, a file of another set, or an interrupted install makes
the set inconsistent, and the previous set is loaded instead, with a warning
naming the file. The Loop's RNG and `trax.data.inputs.data_counters` are
restored from the manifest of the set loaded; a `data_counters<host>.pkl`
that disagrees with it is ignored with a warning. A first save that was
interrupted before any set was complete is removed, with a warning, and the
run starts from scratch. A set without a manifest (written by stock trax)
loads as stock trax loads it, with a warning that it cannot be verified;
stock trax loads our sets unchanged.
"""

import errno
import json
import os
import pickle
import shutil
import zlib
from typing import Any

from absl import logging
import numpy as np

from trax import fastmath
from trax import layers as tl
from trax.data import inputs as trax_inputs
from trax.fastmath import numpy as jnp
from trax.supervised import training
from trax_revplus import memory

FORMAT = 'trax_revplus.checkpoint_set/2'
# Sets written before file contents were checksummed: verified by size and
# gzip trailer only.
FORMAT_1 = 'trax_revplus.checkpoint_set/1'
MANIFEST_SUFFIX = '.manifest.json'
PREVIOUS = '.prev'
STAGING_SUFFIX = '.tmp'
_CHUNK_BYTES = 1 << 20

# trax's own methods, as bound when this module was imported; `activate()`
# binds `save_checkpoint` / `load_checkpoint` below in their place.
stock_save_checkpoint = training.Loop.save_checkpoint
stock_load_checkpoint = training.Loop.load_checkpoint
stock_load_data_counters = trax_inputs.load_data_counters


class CheckpointError(RuntimeError):
  """No checkpoint set to resume from, though one was written.

  Attributes:
    directory: str, the output dir.
    basename: str, the set, e.g. 'model'.
    problem: str, what is wrong, without the fix.
  """

  def __init__(self, message: str, directory: str = '', basename: str = '',
               problem: str = ''):
    super().__init__(message)
    self.directory = directory
    self.basename = basename
    self.problem = problem or message


class CheckpointMismatchError(CheckpointError):
  """A verified checkpoint set that does not fit the Loop's model."""


class CheckpointWriteError(CheckpointError):
  """A checkpoint set could not be written; the sets already there are kept.

  Attributes:
    free_bytes: int or None, space left on the output dir's file system.
    step: int, the step whose set was not written.
  """

  def __init__(self, message: str, directory: str = '', basename: str = '',
               problem: str = '', free_bytes: int | None = None,
               step: int = 0):
    super().__init__(message, directory, basename, problem)
    self.free_bytes = free_bytes
    self.step = step


def manifest_path(directory: str, basename: str) -> str:
  """Path of the manifest of set `basename` in `directory`."""
  return os.path.join(directory, basename + MANIFEST_SUFFIX)


def staging_path(directory: str, basename: str) -> str:
  """Path of the directory where set `basename` is written before commit."""
  return os.path.join(directory, basename + STAGING_SUFFIX)


def file_crc32(path: str) -> str:
  """CRC-32 of a file's bytes, as 8 hex digits (`zlib.crc32`)."""
  crc = 0
  with open(path, 'rb') as f:
    while chunk := f.read(_CHUNK_BYTES):
      crc = zlib.crc32(chunk, crc)
  return f'{crc:08x}'


def _describe_file(path: str) -> dict[str, Any]:
  return {'bytes': os.path.getsize(path), 'crc32': file_crc32(path)}


def _gzip_trailer(path: str) -> str:
  """The last 8 bytes of a gzip file (CRC-32 + length of its content)."""
  with open(path, 'rb') as f:
    f.seek(0, os.SEEK_END)
    f.seek(max(f.tell() - 8, 0))
    return f.read(8).hex()


def _manifest_crc32(manifest: dict[str, Any]) -> str:
  body = {k: v for k, v in manifest.items() if k != 'manifest_crc32'}
  text = json.dumps(body, sort_keys=True, separators=(',', ':'))
  return f'{zlib.crc32(text.encode("utf-8")):08x}'


def _fsync(path: str) -> None:
  fd = os.open(path, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


def _fsync_dir(directory: str) -> None:
  try:
    _fsync(directory)
  except OSError:
    pass  # Some platforms cannot open or fsync a directory.


def _remove(path: str) -> None:
  try:
    os.remove(path)
  except FileNotFoundError:
    pass


def _write_json_atomic(path: str, obj: dict[str, Any]) -> None:
  tmp = path + '._tmp_'
  try:
    with open(tmp, 'w', encoding='utf-8') as f:
      json.dump(obj, f, indent=1, sort_keys=True)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    _remove(tmp)
    raise
  _fsync_dir(os.path.dirname(path))


def _set_files(directory: str, basename: str) -> list[str]:
  """Suffixes of the files of set `basename` in `directory` (sorted)."""
  prefix = basename + '.'
  return sorted(
      name[len(basename):] for name in os.listdir(directory)
      if name.startswith(prefix) and name.endswith('.gz') and
      not name.startswith(prefix + 'prev.') and
      not name.startswith(prefix + 'tmp.'))


def _read_manifest(directory: str, basename: str
                   ) -> tuple[dict[str, Any] | None, str]:
  """(manifest, reason): None if there is none, {} if it is unusable."""
  path = manifest_path(directory, basename)
  name = os.path.basename(path)
  if not os.path.exists(path):
    return None, f'no {name}'
  try:
    with open(path, encoding='utf-8') as f:
      manifest = json.load(f)
  except (OSError, ValueError) as e:
    return {}, f'{name} is unreadable ({e})'
  if not isinstance(manifest, dict) or manifest.get('format') not in (
      FORMAT, FORMAT_1):
    return {}, f'{name} is not a {FORMAT} manifest'
  # A complete set's manifest carries a CRC-32 of its content; the short
  # "installing" marker has none.
  checked = manifest.get('format') == FORMAT and (
      manifest.get('state') == 'complete' or 'manifest_crc32' in manifest)
  if checked and manifest.get('manifest_crc32') != _manifest_crc32(manifest):
    return {}, f'{name} is damaged (its CRC-32 differs)'
  return manifest, ''


def verify(directory: str, basename: str, contents: bool = True
           ) -> tuple[bool, dict[str, Any] | None, str]:
  """Checks set `basename` in `directory` against its manifest.

  Args:
    directory: the output dir.
    basename: e.g. 'model'.
    contents: also recompute each file's CRC-32 (reads every byte); False
      checks sizes only.

  Returns:
    (ok, manifest, reason): ok a bool; manifest the parsed dict, {} if
    unusable, None if there is none (a set written by stock trax, or no
    set); reason says what is inconsistent ('' if ok), naming the file.
  """
  manifest, reason = _read_manifest(directory, basename)
  if not manifest:
    return False, manifest, reason
  if manifest.get('state') != 'complete':
    return False, manifest, (f'writing the set of step '
                             f'{manifest.get("step")} was interrupted')
  step = manifest.get('step')
  for suffix, expected in sorted(manifest.get('files', {}).items()):
    name = basename + suffix
    path = os.path.join(directory, name)
    if not os.path.exists(path):
      return False, manifest, f'{name} is missing'
    size = os.path.getsize(path)
    if size != expected.get('bytes'):
      return False, manifest, (f'{name} has {size} bytes, the set of step '
                               f'{step} wrote {expected.get("bytes")} '
                               f'(truncated or replaced)')
    if not contents:
      continue
    if 'crc32' in expected:
      found, what = file_crc32(path), 'CRC-32 of its bytes'
      wanted = expected['crc32']
    else:  # FORMAT_1
      found, what = _gzip_trailer(path), 'gzip trailer'
      wanted = expected.get('gzip_trailer')
    if found != wanted:
      return False, manifest, (f'{name} is damaged or not the file the set '
                               f'of step {step} wrote ({what} differs)')
  return True, manifest, ''


def describe_last_good(directory: str | None, basename: str = 'model') -> str:
  """One clause naming the checkpoint a resumed run would load.

  Checks sizes against the manifests (not contents: cheap enough for an
  error message).

  Args:
    directory: the run's output dir, or None.
    basename: the set.

  Returns:
    e.g. 'the last good checkpoint /run/model.pkl.gz (step 10) is intact'.
  """
  if directory is None:
    return 'no checkpoint directory is set'
  for name in (basename, basename + PREVIOUS):
    ok, manifest, _ = verify(directory, name, contents=False)
    if ok:
      pkl = os.path.join(directory, name + '.pkl.gz')
      return (f'the last good checkpoint {pkl} (step {manifest["step"]}) is '
              f'intact')
  pkl = os.path.join(directory, basename + '.pkl.gz')
  if os.path.exists(pkl):
    return f'the checkpoint {pkl} was not touched'
  return f'no checkpoint was written to {directory} yet'


def _link_set(directory: str, source: str, target: str,
              manifest: dict[str, Any]) -> None:
  """Makes set `target` a copy of complete set `source` (hard links)."""
  _remove(manifest_path(directory, target))  # Incomplete until rewritten.
  for suffix in manifest['files']:
    src = os.path.join(directory, source + suffix)
    dst = os.path.join(directory, target + suffix)
    _remove(dst)
    try:
      os.link(src, dst)
    except OSError:
      try:
        shutil.copy2(src, dst)
        _fsync(dst)
      except BaseException:
        _remove(dst)
        raise
  _fsync_dir(directory)
  _write_json_atomic(manifest_path(directory, target), manifest)


def _data_counters_name(host_id: int | None = None) -> str:
  import jax  # pylint: disable=g-import-not-at-top
  host_id = jax.process_index() if host_id is None else host_id
  return 'data_counters%d.pkl' % host_id


def _evals_to_come(loop: training.Loop) -> int:
  """Keys the evals of the Loop's current step will still take from its RNG.

  trax's `Loop.run` saves the checkpoint of step k before it runs the evals
  of step k, and each eval batch takes a key from the Loop's RNG
  (`Loop.new_rng`). Returns their number when the step is an eval step
  whose evals have not been recorded in the Loop's history yet, else 0.
  """
  # pylint: disable=protected-access
  eval_tasks = [t for t in getattr(loop, '_eval_tasks', ()) if t is not None]
  eval_at = getattr(loop, '_eval_at', None)
  if not eval_tasks or eval_at is None or not eval_at(loop.step):
    return 0
  # pylint: enable=protected-access
  name = f'metrics/{eval_tasks[0].metric_names[0]}'
  if any(step == loop.step for step, _ in loop.history.get('eval', name)):
    return 0
  return sum(int(t.n_eval_batches) for t in eval_tasks)


def _rng_at_next_step(loop: training.Loop) -> Any:
  """The Loop's RNG as a run without restart has it when its next step begins.

  A run resumed from this checkpoint starts with the next step, so the keys
  the evals of this step would still take (`_evals_to_come`) are taken here,
  as `Loop.new_rng` takes them, for dropout after a restart to be what it
  would have been without one.
  """
  rng = getattr(loop, '_rng', None)
  if rng is None:
    return None
  for _ in range(_evals_to_come(loop)):
    rng, _ = fastmath.random.split(rng)
  return rng


def _loop_extras(loop: training.Loop) -> dict[str, Any]:
  """The Loop's RNG at its next step and trax's data counters, as JSON."""
  rng = _rng_at_next_step(loop)
  return {
      'loop_rng': (None if rng is None else
                   np.asarray(rng).astype(np.uint32).tolist()),
      'data_counters': {str(k): int(v)
                        for k, v in trax_inputs.data_counters.items()},
  }


def _restore_extras(loop: training.Loop, manifest: dict[str, Any],
                    basename: str, fell_back: bool) -> None:
  """Restores the Loop's RNG and trax's data counters from `manifest`.

  Warns when `data_counters<host>.pkl` in the Loop's output dir disagrees
  with the set loaded, unless the previous set was loaded (`fell_back`):
  that warning already said the run resumes from an earlier step.
  """
  rng = manifest.get('loop_rng')
  if rng is not None:
    key = jnp.asarray(np.asarray(rng, dtype=np.uint32))
    # As `Loop.new_rng` keeps it: in host memory for the memory-efficient
    # trainer.
    if getattr(loop, '_use_memory_efficient_trainer', False):
      key = tl.on_cpu(key)
    loop._rng = key  # pylint: disable=protected-access
  counters = manifest.get('data_counters')
  if counters is None:
    return
  output_dir = getattr(loop, 'output_dir', None)
  path = os.path.join(output_dir or '', _data_counters_name())
  found, _ = (_read_data_counters(path) if output_dir and
              os.path.exists(path) else (None, ''))
  if found is not None and not fell_back and (
      {str(k): v for k, v in found.items()} != counters):
    logging.warning(
        '%s holds data counters %s, but checkpoint set %s (step %s) was '
        'written at %s; the set\'s are used.', path, found, basename,
        manifest.get('step'), counters)
  trax_inputs.data_counters = dict(counters)


def is_disk_full(error: BaseException) -> bool:
  """Whether `error` (OSError or TensorFlow's) means the disk is full."""
  if isinstance(error, OSError) and error.errno in (errno.ENOSPC,
                                                    errno.EDQUOT):
    return True
  # TensorFlow's file API (tf.io.gfile) raises its own errors, e.g.
  # ResourceExhaustedError, whose message carries the system's.
  text = str(error)
  return 'No space left on device' in text or 'Disk quota exceeded' in text


def free_bytes(directory: str) -> int | None:
  """Bytes free on the file system of `directory`, or None if unknown."""
  try:
    return shutil.disk_usage(directory).free
  except OSError:
    return None


def _stage(loop: training.Loop, staging: str, basename: str) -> None:
  """Has stock trax write set `basename` and the data counters in `staging`.

  trax writes `data_counters<host>.pkl` into the Loop's output dir in place,
  so the Loop's output dir is `staging` during the call.
  """
  output_dir = loop._output_dir  # pylint: disable=protected-access
  loop._output_dir = staging  # pylint: disable=protected-access
  try:
    stock_save_checkpoint(loop, basename)
  finally:
    loop._output_dir = output_dir  # pylint: disable=protected-access


def _commit(directory: str, basename: str, staging: str,
            manifest: dict[str, Any]) -> None:
  """Installs the staged set `basename` (steps 2-4 of the module docstring)."""
  current_ok, current, _ = verify(directory, basename, contents=False)
  if current_ok:
    _link_set(directory, basename, basename + PREVIOUS, current)
  _write_json_atomic(manifest_path(directory, basename),
                     dict(format=FORMAT, state='installing',
                          step=manifest['step']))
  # The .pkl.gz last: stock trax loads a set only once its .pkl.gz exists.
  for suffix in sorted(manifest['files'], key=lambda s: s == '.pkl.gz'):
    os.replace(os.path.join(staging, basename + suffix),
               os.path.join(directory, basename + suffix))
  _fsync_dir(directory)
  _write_json_atomic(manifest_path(directory, basename), manifest)
  counters = os.path.join(staging, _data_counters_name())
  if os.path.exists(counters):
    os.replace(counters, os.path.join(directory, _data_counters_name()))
    _fsync_dir(directory)


def save_checkpoint(loop: training.Loop, basename: str) -> None:
  """`training.Loop.save_checkpoint`, committing a verified set.

  Writes the files trax writes (same names and contents), plus
  `<basename>.manifest.json`, and keeps the set it replaces as
  `<basename>.prev.*`; see the module docstring. Without an output dir, or
  on a non-chief host, behaves as trax.

  Args:
    loop: the `training.Loop`.
    basename: e.g. 'model' or 'model_1000'.

  Raises:
    CheckpointWriteError: the disk is full (or over quota); the message
      says what could not be written, the space left and the last good
      checkpoint. Nothing of this save is left behind.
    OSError: another failure to write; the sets already there stay
      loadable and nothing of this save is left behind.
  """
  directory = loop.output_dir
  if directory is None or not loop.is_chief:
    return stock_save_checkpoint(loop, basename)
  step = int(loop.step)
  staging = staging_path(directory, basename)
  try:
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    _stage(loop, staging, basename)
    files = {}
    for suffix in _set_files(staging, basename):
      path = os.path.join(staging, basename + suffix)
      _fsync(path)
      files[suffix] = _describe_file(path)
    manifest = dict(format=FORMAT, state='complete', step=step, files=files,
                    **_loop_extras(loop))
    manifest['manifest_crc32'] = _manifest_crc32(manifest)
    _commit(directory, basename, staging, manifest)
  except Exception as e:  # pylint: disable=broad-except
    shutil.rmtree(staging, ignore_errors=True)
    if not is_disk_full(e):
      raise
    free = free_bytes(directory)
    free_text = ('unknown space' if free is None else
                 f'{free / memory.BYTES_PER_MIB:.1f} MiB')
    problem = (f'cannot write checkpoint {basename} (step {step}) in '
               f'{directory}: no space left on the device ({free_text} '
               f'free); {describe_last_good(directory)}')
    raise CheckpointWriteError(
        f'{problem}; free some space and run again to resume from it.',
        directory, basename, problem, free, step) from e
  finally:
    shutil.rmtree(staging, ignore_errors=True)


def _read_data_counters(path: str) -> tuple[dict[str, Any] | None, str]:
  """(counters, problem): the pickled counters of `path`, or why not."""
  try:
    with open(path, 'rb') as f:
      counters = pickle.load(f)
  except Exception as e:  # pylint: disable=broad-except
    return None, f'{type(e).__name__}: {e}'
  if not isinstance(counters, dict):
    return None, f'it holds a {type(counters).__name__}, not a dict'
  return counters, ''


_COUNTERS_FROM_SET = ('the data counters come from the checkpoint set loaded '
                      '(without one, the data stream starts from its first '
                      'batch)')


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
  path = os.path.join(output_dir, _data_counters_name(host_id))
  if not os.path.exists(path):
    logging.info('Did not load data counters as %s does not exist.', path)
    return
  counters, problem = _read_data_counters(path)
  if counters is None:
    logging.warning('%s is unreadable (%s); it is ignored: %s.', path,
                    problem, _COUNTERS_FROM_SET)
    return
  trax_inputs.data_counters = counters


def set_aside_unreadable_data_counters(output_dir: str,
                                       host_id: int | None = None) -> None:
  """Renames an unreadable `data_counters<host>.pkl` to `<name>.unreadable`.

  For a Loop that reads the file with trax's own `load_data_counters`
  (stock trax), which an unreadable file stops; a warning says so.

  Args:
    output_dir: the Loop's output dir.
    host_id: int or None (this process's index).
  """
  path = os.path.join(output_dir, _data_counters_name(host_id))
  if not os.path.exists(path):
    return
  counters, problem = _read_data_counters(path)
  if counters is not None:
    return
  os.replace(path, path + '.unreadable')
  logging.warning('%s is unreadable (%s); it was moved to %s: %s.', path,
                  problem, os.path.basename(path) + '.unreadable',
                  _COUNTERS_FROM_SET)


def _clean_staging(directory: str, basename: str) -> None:
  """Removes what a killed save left: `<basename>.tmp/` (and older forms)."""
  staging = staging_path(directory, basename)
  if os.path.isdir(staging):
    shutil.rmtree(staging, ignore_errors=True)
  prefix = basename + STAGING_SUFFIX + '.'
  try:
    names = os.listdir(directory)
  except OSError:
    return
  for name in names:
    if name.startswith(prefix):
      _remove(os.path.join(directory, name))


def _remove_first_save(directory: str, basename: str,
                       manifest: dict[str, Any]) -> bool:
  """Removes a first save that was interrupted while being installed.

  Returns:
    Whether `basename` was such a save: its manifest says "installing" and
    there is no previous set at all. Its files (some may be installed) are
    then removed, the manifest last.
  """
  if manifest.get('state') != 'installing':
    return False
  previous = basename + PREVIOUS
  if (os.path.exists(manifest_path(directory, previous)) or
      _set_files(directory, previous)):
    return False
  for suffix in _set_files(directory, basename):
    _remove(os.path.join(directory, basename + suffix))
  _remove(manifest_path(directory, basename))
  logging.warning(
      'the first save of checkpoint %s in %s (step %s) was interrupted '
      'before it was complete; its files were removed and training starts '
      'from the beginning.', basename, directory, manifest.get('step'))
  return True


def _load_verified(loop: training.Loop, directory: str, basename: str,
                   step: Any) -> None:
  """stock `load_checkpoint` of a set; errors named as checkpoint errors."""
  pkl = os.path.join(directory, basename + '.pkl.gz')
  try:
    stock_load_checkpoint(loop, directory, basename)
  except (IndexError, ValueError, KeyError) as e:
    detail = f': {e}' if str(e) else ''
    problem = (f'checkpoint {pkl} (step {step}) does not fit this model '
               f'({type(e).__name__}{detail}): it was written by a model of '
               f'another shape or configuration')
    raise CheckpointMismatchError(
        f'{problem}; resume with the configuration it was written with, or '
        f'train in another output dir.', directory, basename,
        problem) from None
  except (EOFError, OSError, zlib.error, pickle.UnpicklingError) as e:
    problem = (f'checkpoint {pkl} (step {step}) cannot be read '
               f'({type(e).__name__}: {e}): a file of it is damaged')
    raise CheckpointError(
        f'{problem}; to start from scratch, move {basename}.* out of '
        f'{directory}.', directory, basename, problem) from None


def load_checkpoint(loop: training.Loop, directory: str | None = None,
                    filename: str | None = None) -> None:
  """`training.Loop.load_checkpoint`, loading only a verified set.

  A set with a manifest loads if its files match it (sizes and CRC-32s);
  otherwise the previous set (`<filename>.prev`) loads, with a warning
  naming the file. The Loop's RNG and trax's data counters are restored
  from the manifest of the set loaded. A set without a manifest (written by
  stock trax) loads as in trax, with a warning that it cannot be verified;
  no set at all loads nothing, as in trax.

  Args:
    loop: the `training.Loop`.
    directory: str or None (the Loop's output dir).
    filename: str or None ('model'), the set's basename.

  Raises:
    CheckpointError: the set has a manifest but neither it nor the previous
      set is consistent; the message names the files and the fix. Nothing
      was loaded.
    CheckpointMismatchError: the set loaded is consistent but holds weights
      of another model (e.g. the config changed).
  """
  directory = directory or loop.output_dir
  filename = filename or 'model'
  if directory is None:
    return stock_load_checkpoint(loop, directory, filename)
  _clean_staging(directory, filename)
  ok, manifest, reason = verify(directory, filename)
  if manifest is None:
    pkl = os.path.join(directory, filename + '.pkl.gz')
    if os.path.exists(pkl):
      logging.warning(
          'checkpoint %s has no %s (written by stock trax): loading it as '
          'stock trax does; its files cannot be verified.', pkl,
          os.path.basename(manifest_path(directory, filename)))
    return _load_verified(loop, directory, filename, 'unknown')
  if not ok:
    if manifest and _remove_first_save(directory, filename, manifest):
      return
    previous = filename + PREVIOUS
    ok, manifest, previous_reason = verify(directory, previous)
    if not ok:
      problem = (f'checkpoint set {filename} in {directory} is inconsistent '
                 f'({reason}) and there is no good previous set '
                 f'({previous_reason}); nothing was loaded')
      raise CheckpointError(
          f'{problem}. To start from scratch, move {filename}.* out of '
          f'{directory}; to load it anyway, unverified, use stock trax '
          f'(trax_revplus.deactivate()).', directory, filename, problem)
    logging.warning('checkpoint set %s in %s is inconsistent (%s); loading '
                    'the previous set %s (step %s) instead.', filename,
                    directory, reason, previous, manifest['step'])
    filename = previous
  _load_verified(loop, directory, filename, manifest['step'])
  _restore_extras(loop, manifest, filename, filename.endswith(PREVIOUS))
