"""Committing a checkpoint set as a unit, and cleaning up after a kill.

As orbax commits a checkpoint directory (`orbax.checkpoint` `atomicity`:
write under a temporary name, then mark the checkpoint complete in one
atomic step), a set staged in `<basename>.tmp/` is installed by
`commit_set`:

  1. the current set, if complete, becomes the previous one,
     `<basename>.prev.*`, by hard links (a copy where links fail);
  2. `<basename>.manifest.json` is marked "installing", the staged files
     are renamed into place (`.pkl.gz` last, as stock trax loads a set only
     once its `.pkl.gz` exists), then the complete manifest is written
     (atomic rename);
  3. `data_counters<host>.pkl` is renamed into the output dir, where stock
     trax reads it.

A kill at any moment leaves either a complete set or one marked
"installing", which verification never accepts, beside a complete previous
set. `clean_staging` and `remove_interrupted_first_save` remove what a kill
left where nothing complete can be made of it.
"""

import os
import shutil
from typing import Any

from absl import logging

from trax_revplus.checkpoints import data_counters
from trax_revplus.checkpoints import files
from trax_revplus.checkpoints import integrity
from trax_revplus.checkpoints import manifest as manifest_lib


def link_set(
  directory: str, source: str, target: str, manifest: dict[str, Any]
) -> None:
  """Makes set `target` a copy of complete set `source` (hard links).

  `target`'s manifest is removed first and written last, so `target` is
  never a complete set of mixed files.

  Args:
    directory: the output dir.
    source: the complete set, e.g. 'model'.
    target: e.g. 'model.prev'.
    manifest: `source`'s manifest.

  Raises:
    OSError: a file could be neither linked nor copied.
  """
  files.remove(manifest_lib.manifest_path(directory, target))
  for suffix in manifest['files']:
    src = os.path.join(directory, source + suffix)
    dst = os.path.join(directory, target + suffix)
    files.remove(dst)
    try:
      os.link(src, dst)
    except OSError:
      try:
        shutil.copy2(src, dst)
        files.fsync(dst)
      except BaseException:
        files.remove(dst)
        raise
  files.fsync_dir(directory)
  files.write_json_atomic(
    manifest_lib.manifest_path(directory, target), manifest
  )


def commit_set(
  directory: str, basename: str, staging: str, manifest: dict[str, Any]
) -> None:
  """Installs the set `basename` staged in `staging` (steps 1-3 above).

  Args:
    directory: the output dir.
    basename: e.g. 'model'.
    staging: the staging directory holding the set's files and
      `data_counters<host>.pkl`.
    manifest: the complete manifest of the staged set.

  Raises:
    OSError: a file could not be moved or written; the previous set stays
      complete.
  """
  current_ok, current, _ = integrity.verify(directory, basename, contents=False)
  if current_ok and current is not None:
    link_set(directory, basename, basename + manifest_lib.PREVIOUS, current)
  files.write_json_atomic(
    manifest_lib.manifest_path(directory, basename),
    dict(format=manifest_lib.FORMAT, state='installing', step=manifest['step']),
  )
  # The .pkl.gz last: stock trax loads a set only once its .pkl.gz exists.
  for suffix in sorted(manifest['files'], key=lambda s: s == '.pkl.gz'):
    os.replace(
      os.path.join(staging, basename + suffix),
      os.path.join(directory, basename + suffix),
    )
  files.fsync_dir(directory)
  files.write_json_atomic(
    manifest_lib.manifest_path(directory, basename), manifest
  )
  name = data_counters.file_name()
  counters = os.path.join(staging, name)
  if os.path.exists(counters):
    os.replace(counters, os.path.join(directory, name))
    files.fsync_dir(directory)


def clean_staging(directory: str, basename: str) -> None:
  """Removes what a killed save left: `<basename>.tmp/` (and older forms)."""
  staging = manifest_lib.staging_path(directory, basename)
  if os.path.isdir(staging):
    shutil.rmtree(staging, ignore_errors=True)
  prefix = basename + manifest_lib.STAGING_SUFFIX + '.'
  try:
    names = os.listdir(directory)
  except OSError:
    return
  for name in names:
    if name.startswith(prefix):
      files.remove(os.path.join(directory, name))


def remove_interrupted_first_save(
  directory: str, basename: str, manifest: dict[str, Any]
) -> bool:
  """Removes a first save that was interrupted while being installed.

  Args:
    directory: the output dir.
    basename: e.g. 'model'.
    manifest: the set's manifest, as read.

  Returns:
    Whether `basename` was such a save: its manifest says "installing" and
    there is no previous set at all. Its files (some may be installed) are
    then removed, the manifest last, with a warning.
  """
  if manifest.get('state') != 'installing':
    return False
  previous = basename + manifest_lib.PREVIOUS
  if os.path.exists(
    manifest_lib.manifest_path(directory, previous)
  ) or manifest_lib.set_files(directory, previous):
    return False
  for suffix in manifest_lib.set_files(directory, basename):
    files.remove(os.path.join(directory, basename + suffix))
  files.remove(manifest_lib.manifest_path(directory, basename))
  logging.warning(
    'the first save of checkpoint %s in %s (step %s) was interrupted '
    'before it was complete; its files were removed and training starts '
    'from the beginning.',
    basename,
    directory,
    manifest.get('step'),
  )
  return True
