"""`Loop.save_checkpoint` that writes and commits a verified set.

Stock trax writes the set's files into the staging directory
`<basename>.tmp/` (removed first if a killed save left it); each file is
flushed to the disk and described in the manifest (size, CRC-32), with the
Loop's RNG and the data counters as its next step finds them (past the
evals trax runs after the save); `atomicity.commit_set` then installs the
set. A failed save (e.g. a full disk) removes the staging
directory; the sets already there are untouched.
"""

import os
import shutil

from trax.supervised import training

from trax_revplus.byte_sizes import format_bytes
from trax_revplus.checkpoints import atomicity
from trax_revplus.checkpoints import data_counters
from trax_revplus.checkpoints import errors
from trax_revplus.checkpoints import files
from trax_revplus.checkpoints import integrity
from trax_revplus.checkpoints import loop_rng
from trax_revplus.checkpoints import manifest as manifest_lib
from trax_revplus.trax_door import loop as loop_door

# trax's own method, as bound when this module was imported; `activate()`
# binds `save_checkpoint` below in its place.
stock_save_checkpoint = training.Loop.save_checkpoint


def _stage(loop: training.Loop, staging: str, basename: str) -> None:
  """Has stock trax write set `basename` and the data counters in `staging`.

  trax writes `data_counters<host>.pkl` into the Loop's output dir in place,
  so the Loop's output dir is `staging` during the call.
  """
  with loop_door.output_dir_set_to(loop, staging):
    stock_save_checkpoint(loop, basename)


def save_checkpoint(loop: training.Loop, basename: str) -> None:
  """`training.Loop.save_checkpoint`, committing a verified set.

  Writes the files trax writes (same names and contents), plus
  `<basename>.manifest.json`, and keeps the set it replaces as
  `<basename>.prev.*`; see `trax_revplus.checkpoints`. Without an output
  dir, or on a non-chief host, behaves as trax. On every host the data
  counters written (the manifest's and `data_counters<host>.pkl`) are
  those the Loop's next step finds (`data_counters.at_next_step`).

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
  # trax writes data_counters<host>.pkl from trax's counters, on every host.
  with data_counters.bound(data_counters.at_next_step(loop)):
    _save(loop, basename)


def _save(loop: training.Loop, basename: str) -> None:
  """`save_checkpoint` with the data counters to keep bound."""
  directory = loop.output_dir
  if directory is None or not loop.is_chief:
    stock_save_checkpoint(loop, basename)
    return
  step = int(loop.step)
  staging = manifest_lib.staging_path(directory, basename)
  try:
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    _stage(loop, staging, basename)
    described = {}
    for suffix in manifest_lib.set_files(staging, basename):
      path = os.path.join(staging, basename + suffix)
      files.fsync(path)
      described[suffix] = integrity.describe_file(path)
    manifest = dict(
      format=manifest_lib.FORMAT,
      state='complete',
      step=step,
      files=described,
      loop_rng=loop_rng.as_json(loop),
      data_counters=data_counters.as_json(),
    )
    manifest['manifest_crc32'] = manifest_lib.manifest_crc32(manifest)
    atomicity.commit_set(directory, basename, staging, manifest)
  except Exception as e:  # pylint: disable=broad-except
    shutil.rmtree(staging, ignore_errors=True)
    if not errors.is_disk_full(e):
      raise
    free = errors.free_bytes(directory)
    free_text = format_bytes(free, none='unknown space')
    problem = (
      f'cannot write checkpoint {basename} (step {step}) in '
      f'{directory}: no space left on the device ({free_text} '
      f'free); {integrity.describe_last_good(directory)}'
    )
    raise errors.CheckpointWriteError(
      f'{problem}; free some space and run again to resume from it.',
      directory,
      basename,
      problem,
      free,
      step,
    ) from e
  finally:
    shutil.rmtree(staging, ignore_errors=True)
