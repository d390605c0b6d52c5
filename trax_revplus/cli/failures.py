"""What `train` reports, in one line, for an error raised while it trains.

`user_error` maps an exception escaping `trainer_lib.train` to a
`UserError` (exit status 2 when the config or the output dir's contents
cannot work, 1 when running failed), or to None for an error nobody could
foresee, which then shows its traceback. Each line follows from the
error's type: trax_revplus's own errors, and `build_errors`' types for
trax's errors while the model, the trainer or the checkpoint was being
built (the part that raised it knows which).
"""

import glob
import os
import re
from typing import Sequence

import gin

import trax_revplus
from trax_revplus import validation
from trax_revplus.byte_sizes import format_bytes
from trax_revplus.cli import build_errors
from trax_revplus.cli import preflight
from trax_revplus.errors import EXIT_RUNTIME
from trax_revplus.errors import EXIT_USAGE
from trax_revplus.errors import one_line
from trax_revplus.errors import UserError


def _last_line(text: str) -> str:
  lines = [line.strip() for line in text.splitlines() if line.strip()]
  return lines[-1] if lines else ''


def _model_error(error: BaseException) -> str:
  """'TypeError: ... (in layer X, file.py line N)' for a trax layer error.

  A `tl.LayerError` carries the traceback of the error it wraps as text; its
  last exception line is that error. The text is read for the line's detail
  only (the error's type decided the line): it names the layers as trax
  shows them to the user, which following the exceptions' chain does not.
  """
  text = str(error)
  raised = [
    line.strip()
    for line in text.splitlines()
    if re.match(r'^\s*[\w.]+(Error|Exception)\b', line)
  ]
  cause = getattr(error, 'cause', error)  # A `build_errors.ModelError`'s.
  innermost = (
    raised[-1] if raised else (f'{type(cause).__name__}: {one_line(error)}')
  )
  where = []
  layers = re.findall(
    r'Exception passing through layer (\S+) \(in (\w+)\)', text
  )
  if layers:
    where.append(f'in layer {layers[-1][0]}')
  files = re.findall(r'File [^\n]*?([\w.]+\.py), line (\d+)', text)
  if files:
    where.append(f'{files[-1][0]} line {files[-1][1]}')
  return innermost + (f' ({", ".join(where)})' if where else '')


def _bindings_with_values() -> list[tuple[str, str]]:
  """(name, value text) of the simple one-line bindings gin holds."""
  found = []
  for line in gin.config_str().splitlines():
    match = re.match(r'^([\w./]+\.\w+) = (.+)$', line.strip())
    if match:
      found.append((match.group(1), match.group(2).strip()))
  return found


def suspect_bindings(error_text: str, command_line: Sequence[str]) -> list[str]:
  """The bindings most likely behind a model that cannot be built.

  A `NoneType` in the error points at bindings to None: those given with
  --config if any, else those of the config files; otherwise the --config
  bindings, the user's latest changes, are named.

  Args:
    error_text: the error's message.
    command_line: the --config bindings, as given.

  Returns:
    Up to 3 bindings as 'name = value' (str).
  """
  given = []
  for binding in command_line:
    name, _, value = binding.partition('=')
    given.append((name.strip(), value.strip()))
  if 'NoneType' in error_text:
    nones = [(n, v) for n, v in given if v == 'None'] or [
      (n, v) for n, v in _bindings_with_values() if v == 'None'
    ]
    return [f'{n} = {v}' for n, v in nones[:3]]
  return [f'{n} = {v}' for n, v in given[:3]]


def remove_partial_files(output_dir: str) -> None:
  """Removes the temporary files a failed stock trax save leaves (`*._tmp_`)."""
  for path in glob.glob(os.path.join(glob.escape(output_dir), '*._tmp_')):
    try:
      os.remove(path)
    except OSError:
      pass


def stock_failure(error: Exception, log_path: str) -> UserError:
  """The one line for an error raised in stock trax's own steps (stock's
  trainer or Loop, with trax_revplus not active): the error's type and
  message; its traceback is in the run's log.

  Args:
    error: the exception `trainer_lib.train` raised after the first step
      began.
    log_path: the run's log file, which holds the traceback.
  """
  # JAX's errors say why on their later lines.
  message = one_line(error, all_lines=True, typed=True, max_chars=600)
  return UserError(
    f'stock trax failed in its steps: {message} (its traceback is in '
    f'{log_path})',
    EXIT_RUNTIME,
  )


def user_error(
  error: Exception,
  output_dir: str,
  steps_started: bool,
  command_line: Sequence[str],
) -> UserError | None:
  """The one-line report of `error`, raised by `trainer_lib.train`.

  Args:
    error: the exception: one of trax_revplus's, reported by its type; a
      `build_errors.BuildError`, by the part of the build that raised the
      error it wraps (gin, having called `train`, may have re-raised either
      as a proxy of its type, with its context added to the message).
    output_dir: the run's output dir.
    steps_started: whether the Loop had begun its first step (before it,
      errors from the model, the trainer's constructor or checkpoint
      loading come from the config).
    command_line: the --config bindings, named when the model cannot be
      built.

  Returns:
    A `UserError`, or None for an error that is not the user's to fix.
  """
  # Here: they import trax, which `compare`'s parent process never does.
  # pylint: disable=g-import-not-at-top
  from trax_revplus import checkpoints
  from trax_revplus import data
  from trax_revplus import trainer
  from trax_revplus.device_memory import out_of_memory

  # pylint: enable=g-import-not-at-top
  if isinstance(error, checkpoints.CheckpointWriteError):
    remove_partial_files(output_dir)
    return UserError(
      f'{error.problem}; free some space and run the same command to resume',
      EXIT_RUNTIME,
    )
  if isinstance(error, checkpoints.CheckpointMismatchError):
    return UserError(
      f'{error.problem}; resume with the config it was '
      f'written with, or give another --output_dir',
      EXIT_USAGE,
    )
  if isinstance(error, checkpoints.CheckpointError):
    basename = error.basename or 'model'
    directory = error.directory or output_dir
    manifest = basename + checkpoints.MANIFEST_SUFFIX
    # A set already without its manifest has loaded unverified and failed.
    unverified = (
      f'; to load it anyway, unverified, move {manifest} out of it (a set '
      f'without a manifest loads as stock trax loads it)'
      if os.path.exists(os.path.join(directory, manifest))
      else ''
    )
    return UserError(
      f'{error.problem}; to start from scratch, move {basename}.* out of '
      f'{directory} or give another --output_dir{unverified}',
      EXIT_RUNTIME,
    )
  if isinstance(error, data.CorpusSettingError):
    return UserError(one_line(error), EXIT_USAGE)
  if isinstance(error, data.CorpusError):
    return UserError(one_line(error), EXIT_RUNTIME)
  if isinstance(error, validation.TrainerOptionError):
    return UserError(preflight.trainer_option_line(error), EXIT_USAGE)
  if isinstance(
    error, (validation.ConfigurationError, validation.OptimizerFactoryError)
  ):
    # Its message names the setting; gin's "In call to configurable
    # 'train'" adds nothing (and `estimate`, which raises it outside gin,
    # prints the same line).
    return UserError(
      f'{type(error).__name__}: {one_line(error, context=False)}', EXIT_USAGE
    )
  if isinstance(error, validation.NonFiniteError):
    return UserError(f'{type(error).__name__}: {one_line(error)}', EXIT_RUNTIME)
  if isinstance(error, trainer.DeviceOutOfMemoryError):
    return UserError(one_line(error, context=False), EXIT_RUNTIME)
  if out_of_memory.is_out_of_memory(error):  # trax's trainers, evals
    return UserError(
      f'out of device memory: {out_of_memory.first_line(error)}; use a '
      f'smaller batch or shorter sequences (trax_revplus plans its steps '
      f'to fit the device); the last checkpoint is the one to resume from',
      EXIT_RUNTIME,
    )
  if checkpoints.is_disk_full(error):
    remove_partial_files(output_dir)
    what = getattr(error, 'filename', None) or _last_line(str(error))
    free = format_bytes(
      checkpoints.free_bytes(output_dir), none='unknown space'
    )
    return UserError(
      f'cannot write {what}: no space left on the device '
      f'({free} free); {checkpoints.describe_last_good(output_dir)}; free '
      f'some space and run the same command to resume',
      EXIT_RUNTIME,
    )
  if steps_started:
    return None
  if isinstance(error, build_errors.TrainerSettingsError):
    return UserError(
      f'the trainer rejects its settings: {one_line(error)}', EXIT_USAGE
    )
  if isinstance(error, build_errors.CheckpointFitError):
    detail = one_line(error, context=False)
    return UserError(
      f'the checkpoint in {output_dir} does not fit this model '
      f'({type(error.cause).__name__}{": " + detail if detail else ""}): '
      f'it was written by a model of another shape or configuration; '
      f'resume with that config, or give another --output_dir',
      EXIT_USAGE,
    )
  if isinstance(error, build_errors.CheckpointLoadError):
    fix = (
      'give another --output_dir'
      if trax_revplus.is_active()
      else "stock trax's load fails so on current JAX: resume without "
      '--implementation=stock (trax_revplus loads the checkpoint), or '
      'give another --output_dir'
    )
    return UserError(
      f'cannot load the checkpoint in {output_dir} '
      f'({type(error.cause).__name__}: {one_line(error.cause)}); {fix}',
      EXIT_RUNTIME,
    )
  if isinstance(error, build_errors.ModelError):
    model = gin.query_parameter('train.model')
    name = str(model).lstrip('@').rstrip('()').split('.')[-1]
    text = f'cannot build the model {name}: {_model_error(error)}'
    suspects = suspect_bindings(str(error), command_line)
    if suspects:
      text += f'; check {", ".join(suspects)}'
    return UserError(text, EXIT_USAGE)
  return None
