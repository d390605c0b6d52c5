"""`Loop.load_checkpoint` that loads only a verified set, else `.prev`.

How a load chooses a set:

  1. what a killed save left (`<basename>.tmp/`) is removed;
  2. the set's manifest is read and every file's size and CRC-32 compared
     with it (`integrity.verify`); if all match, the set loads;
  3. otherwise the previous set `<basename>.prev` is checked the same way
     and loads, with a warning naming the file that did not match;
  4. if neither matches, nothing is loaded: `CheckpointError`;
  5. the Loop's RNG and trax's data counters are restored from the manifest
     of the set loaded. The set loads into the structure it was saved from
     (`model_state`: trax's own load misplaces the arrays after a layer
     that stands at two places).

A set marked "installing" with no previous set at all is a first save that
was killed: it is removed, with a warning, and training starts from step 0.
A set without a manifest (written by stock trax) loads as stock trax loads
it, with a warning that it cannot be verified.
"""

import os
import pickle
import zlib
from typing import Any

from absl import logging

from trax.supervised import training

from trax_revplus.checkpoints import atomicity
from trax_revplus.checkpoints import data_counters
from trax_revplus.checkpoints import errors
from trax_revplus.checkpoints import integrity
from trax_revplus.checkpoints import loop_rng
from trax_revplus.checkpoints import manifest as manifest_lib
from trax_revplus.checkpoints import model_state

# trax's own method, as bound when this module was imported; `activate()`
# binds `load_checkpoint` below in its place.
stock_load_checkpoint = training.Loop.load_checkpoint


def _load_verified(
  loop: training.Loop, directory: str, basename: str, step: Any
) -> None:
  """stock `load_checkpoint` of a set; errors named as checkpoint errors."""
  pkl = os.path.join(directory, basename + '.pkl.gz')
  try:
    with (
      model_state.own_structure(loop),
      model_state.train_state_kept(loop),
      model_state.fitted_shapes(loop) as fitting,
    ):
      stock_load_checkpoint(loop, directory, basename)
  except (IndexError, ValueError, KeyError) as e:
    detail = f': {e}' if str(e) else ''
    problem = (
      f'checkpoint {pkl} (step {step}) does not fit this model '
      f'({type(e).__name__}{detail}): it was written by a model of '
      f'another shape or configuration'
    )
    raise errors.CheckpointMismatchError(
      f'{problem}; resume with the configuration it was written with, or '
      f'train in another output dir.',
      directory,
      basename,
      problem,
    ) from None
  except (EOFError, OSError, zlib.error, pickle.UnpicklingError) as e:
    problem = (
      f'checkpoint {pkl} (step {step}) cannot be read '
      f'({type(e).__name__}: {e}): a file of it is damaged'
    )
    raise errors.CheckpointError(
      f'{problem}; to start from scratch, move {basename}.* out of '
      f'{directory}.',
      directory,
      basename,
      problem,
    ) from None
  _report_fitting(fitting, pkl, step)


def _report_fitting(fitting: model_state.Fitting, pkl: str, step: Any) -> None:
  """One warning line for the arrays loaded reshaped, one for a state that
  did not fit (trax then loaded the weights and slots only)."""
  if fitting.reshaped:
    name, there, here = fitting.reshaped[0]
    more = len(fitting.reshaped) - 1
    others = (
      f' and {more} more array{"s" if more > 1 else ""} alike' if more else ''
    )
    logging.warning(
      'checkpoint %s (step %s): %s is %s there and %s in this model (the '
      'same values, an axis of size 1 apart, as trax layers that reshape '
      'their state at their first call write it)%s: loaded reshaped.',
      pkl,
      step,
      name,
      there,
      here,
      others,
    )
  if fitting.not_fitting is not None:
    name, there, here = fitting.not_fitting
    logging.warning(
      'checkpoint %s (step %s): %s is %s there and %s in this model: '
      "loaded the weights and optimizer slots, the layers' state starts "
      'afresh (it holds per-batch values, e.g. after a change of batch size).',
      pkl,
      step,
      name,
      there,
      here,
    )


def _restore_extras(
  loop: training.Loop, manifest: dict[str, Any], basename: str, fell_back: bool
) -> None:
  """Restores the Loop's RNG and trax's data counters from `manifest`."""
  rng = manifest.get('loop_rng')
  if rng is not None:
    loop_rng.restore(loop, rng)
  counters = manifest.get('data_counters')
  if counters is not None:
    data_counters.restore(
      loop, counters, basename, manifest.get('step'), fell_back
    )


def load_checkpoint(
  loop: training.Loop, directory: str | None = None, filename: str | None = None
) -> None:
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
  atomicity.clean_staging(directory, filename)
  ok, manifest, reason = integrity.verify(directory, filename)
  if manifest is None:
    pkl = os.path.join(directory, filename + '.pkl.gz')
    if os.path.exists(pkl):
      logging.warning(
        'checkpoint %s has no %s (written by stock trax, or the manifest '
        'was moved): loading it as stock trax does; its files cannot be '
        'verified.',
        pkl,
        os.path.basename(manifest_lib.manifest_path(directory, filename)),
      )
    return _load_verified(loop, directory, filename, 'unknown')
  if not ok:
    if manifest and atomicity.remove_interrupted_first_save(
      directory, filename, manifest
    ):
      return
    previous = filename + manifest_lib.PREVIOUS
    ok, manifest, previous_reason = integrity.verify(directory, previous)
    if not ok or manifest is None:
      problem = (
        f'checkpoint set {filename} in {directory} is inconsistent '
        f'({reason}) and there is no good previous set '
        f'({previous_reason}); nothing was loaded'
      )
      raise errors.CheckpointError(
        f'{problem}. To start from scratch, move {filename}.* out of '
        f'{directory}; to load it anyway, unverified, move '
        f'{filename}{manifest_lib.MANIFEST_SUFFIX} out of it (a set without '
        f'a manifest loads as stock trax loads it).',
        directory,
        filename,
        problem,
      )
    logging.warning(
      'checkpoint set %s in %s is inconsistent (%s); loading '
      'the previous set %s (step %s) instead.',
      filename,
      directory,
      reason,
      previous,
      manifest['step'],
    )
    filename = previous
  _load_verified(loop, directory, filename, manifest['step'])
  _restore_extras(
    loop, manifest, filename, filename.endswith(manifest_lib.PREVIOUS)
  )
