"""`trax-revplus train`: a gin-configured trax run, with progress and summary.

Replaces `python -m trax.trainer` (which fails at import on current JAX) for
one-host runs: same `--config_file`, `--config` and `--output_dir` flags,
then `trax.supervised.trainer_lib.train`. A gin config that contains
`import trax_revplus.activate` trains with trax_revplus's layers and
trainer; without that line it trains with stock trax.

In order, before anything is built: the flags, the config files, the
output dir (writable, and locked for the run: `output_dir.OutputDirLock`),
the gin configs and the settings (`preflight`, shared with `estimate` and
`compare`), which also names trainer settings that would have no effect,
then the device: JAX's backend opens before the output dir is made, so a
device another process holds (a TPU chip belongs to one process) is one
line (`trax_revplus.backend`), with nothing written.
SIGINT and SIGTERM stop the run at the next step boundary with a checkpoint
(before the first step, at once, joining included): `trax_revplus.interrupt`,
whose handlers are installed before anything else runs. The lines say which
checkpoint is saved, or, after a second signal, which one stands, and the
step the same command resumes from. Errors a user can
cause end the command with one line (`failures`), the last line the command
prints: the trainers' memory logs are closed while the run's log is still
the place of their lines. The terminal shows the plugin's own lines and
warnings, third-party warnings known to be harmless go to
`<output_dir>/train.log` only (`run_log`, `noise`).

With several processes (`--num_processes` or a cluster launcher), each
joins the run before anything touches JAX (`distributed_flags`); what
differs then is in `trax_revplus.multiprocess` (`training`, `ending`).
"""

import argparse
import functools
import os
import signal
import sys
from typing import Any

from absl import logging
import gin

import trax_revplus
from trax_revplus import backend
from trax_revplus import interrupt
from trax_revplus import trax_import
from trax_revplus.cli import build_errors
from trax_revplus.cli import cache_flags
from trax_revplus.cli import failures
from trax_revplus.cli import gin_config
from trax_revplus.cli import distributed_flags
from trax_revplus.cli import output_dir as output_dirs
from trax_revplus.cli import preflight
from trax_revplus.cli import run_log
from trax_revplus.cli import summary as summaries
from trax_revplus.cli import train_bindings
from trax_revplus.cli.config_flags import configs_from_flags
from trax_revplus.cli.messages import error_line
from trax_revplus.cli.messages import PROG
from trax_revplus.cli.messages import warning_line
from trax_revplus.errors import EXIT_OK
from trax_revplus.errors import signal_exit_status
from trax_revplus.errors import UserError
from trax_revplus.multiprocess import ending
from trax_revplus.multiprocess import training as processes
from trax_revplus.trax_door import loop as loop_door

COMMAND = 'train'


def _check_settings() -> list[str]:
  """Checks the parsed config before anything is built (`preflight`).

  Prints a warning line for each setting that would have no effect.

  Returns:
    The warnings (list of str), for the run's log too.

  Raises:
    UserError (exit status 2): no model, or a setting that cannot work.
  """
  preflight.check_config()
  warnings = preflight.no_effect_warnings()
  for warning in warnings:
    print(warning_line(COMMAND, warning), file=sys.stderr, flush=True)
  return warnings


def _lock(lock: output_dirs.OutputDirLock) -> None:
  warning = lock.acquire()
  if warning:
    print(warning_line(COMMAND, warning), file=sys.stderr, flush=True)


def _close_trainers(loop: Any) -> None:
  """Flushes and closes the memory logs of the Loop's trainers.

  Closing them here, not in the garbage collector, matters: a TensorBoard
  writer closed from `__del__` during a collection can wait forever on its
  own writer thread; and a log closed after the run's log handlers are gone
  would print its last record after the run's last line.
  """
  if loop is None:
    return
  for trainer in loop_door.trainers(loop):
    memory_log = getattr(trainer, 'memory_log', None)
    close = getattr(memory_log, 'close', None)
    if close is not None:
      close()


def _checkpoint_step(path: str) -> int | None:
  """The step of the checkpoint whose `.pkl.gz` is `path`, or None where
  there is none: trax's Loop saves only at the steps its `checkpoint_at`
  names (`train.checkpoints_at`, else every `eval_frequency` steps), so a
  run may end with none written; or it cannot be read."""
  training = trax_import.module('trax.supervised.training')
  # trax reads through tf.io.gfile, whose missing file is TensorFlow's
  # NotFoundError, not an OSError.
  if not os.path.isfile(path):
    return None
  try:
    return training.unpickle_from_file(path, gzip=True)['step']
  except (OSError, EOFError, KeyError, ValueError):
    return None


def _standing_checkpoint(output_dir: str) -> tuple[str, int] | None:
  """The checkpoint a resume of the same command loads: (path of its
  `.pkl.gz`, step), or None where it loads none and starts from step 1.

  As the run's `Loop.load_checkpoint` chooses (`checkpoints.loading`): with
  trax_revplus active, the set `model` if its files have the sizes its
  manifest records, else `model.prev`; a set without a manifest, and stock
  trax's, as `model.pkl.gz` says. Sizes, not CRC-32s: a second signal must
  end the run at once, and a set a signal cut short has the wrong sizes or
  is marked `installing`.
  """
  if trax_revplus.is_active():
    # Here: it imports trax, which waits until the flags are checked.
    from trax_revplus import checkpoints  # pylint: disable=g-import-not-at-top

    for name in ('model', 'model' + checkpoints.PREVIOUS):
      ok, manifest, _ = checkpoints.verify(output_dir, name, contents=False)
      if manifest is None and name == 'model':
        break  # Loaded as stock trax loads it.
      if ok and manifest:
        return os.path.join(output_dir, name + '.pkl.gz'), manifest['step']
    else:
      return None
  path = os.path.join(output_dir, 'model.pkl.gz')
  step = _checkpoint_step(path)
  return None if step is None else (path, step)


def _measure_step_floor(loop: Any, printer: Any) -> None:
  """Times the step's floor on the device (`step_floor.of_loop`) for the
  summary; a model it cannot measure is a warning line, not a failure."""
  # Here: it imports trax, which waits until the flags are checked.
  from trax_revplus import step_floor  # pylint: disable=g-import-not-at-top

  if printer.last_batch is None:
    print(
      warning_line(
        COMMAND,
        'the step floor was not measured: no step ran in this run (the '
        'checkpoint was at train.steps already)',
      ),
      file=sys.stderr,
      flush=True,
    )
    return
  # The run's peak host memory is the steps'; the floor's programs come
  # after them.
  printer.end_steps()
  print(
    "step floor: timing each distinct layer's forward and gradient on the "
    'device',
    flush=True,
  )
  try:
    floor = step_floor.of_loop(loop, printer.last_batch)
  except Exception as e:  # pylint: disable=broad-except
    logging.info('the step floor was not measured', exc_info=True)
    print(
      warning_line(
        COMMAND,
        f'the step floor was not measured ({type(e).__name__}: '
        f'{str(e).splitlines()[0] if str(e) else ""}); its traceback is in '
        'train.log',
      ),
      file=sys.stderr,
      flush=True,
    )
    return
  printer.set_step_floor(floor.as_json())


def _train(
  output_dir: str,
  callbacks: list[Any],
  log_path: str,
  stop: interrupt.StopOnSignal,
  bindings: list[str],
  multi_process: bool = False,
  step_floor: bool = False,
) -> int:
  """Runs trainer_lib.train, then saves a final checkpoint and summarizes;
  with `step_floor`, measures the step's floor first
  (`_measure_step_floor`)."""
  trainer_lib = trax_import.module('trax.supervised.trainer_lib')
  # Here: they import trax, which waits until the flags are checked.
  # pylint: disable=g-import-not-at-top
  from trax_revplus import checkpoints
  from trax_revplus import compat
  from trax_revplus import progress

  # pylint: enable=g-import-not-at-top
  gin.finalize()
  which = 'trax_revplus' if trax_revplus.is_active() else 'stock trax'
  if gin_config.bound_value('train.use_memory_efficient_trainer', False):
    what = f'{which} reversible layers and trainer'
    if not trax_revplus.is_active():
      what += f' ({compat.STOCK_BASELINE})'
  else:
    what = f"{which} reversible layers, trax's default Trainer"
  print(f'{PROG} train: {what}; output in {output_dir}', flush=True)
  # trax reads the data counters before any checkpoint; a damaged file must
  # not stop the run (the checkpoint set's own counters are restored).
  checkpoints.set_aside_unreadable_data_counters(output_dir)
  loop = None
  failed_loop = None
  if multi_process:  # Before stop.callback: every process stops together.
    callbacks = list(callbacks) + [ending.stop_together(stop)]
  build = None
  try:
    # A stock run is stock's trainer with the one fix current JAX requires
    # on an accelerator; trax_revplus's trainer is another class.
    with build_errors.watch_loop_build() as build, compat.stock_baseline():
      loop = trainer_lib.train(
        output_dir=output_dir,
        callbacks=list(callbacks) + [stop.callback],
        **train_bindings.typed_model(),
      )
    checkpoint = os.path.join(output_dir, 'model.pkl.gz')
    if multi_process:  # Process 0 may still be writing it.
      processes.barrier('trained')
    checkpoint_step = _checkpoint_step(checkpoint)
    # The final weights are always kept: saved here unless the Loop saved
    # them at its last step (or the run resumed at train.steps already).
    if checkpoint_step != loop.step:
      loop.save_checkpoint('model')
      if multi_process:
        processes.barrier('saved')
      checkpoint_step = _checkpoint_step(checkpoint)
  except Exception as e:  # pylint: disable=broad-except
    # trainer_lib.train raised: its Loop is in the error, or the one whose
    # construction began.
    failed_loop = getattr(e, 'loop', None) or (build and build.loop)
    if isinstance(e, interrupt.Interrupted):
      raise
    error = failures.user_error(e, output_dir, stop.steps_started, bindings)
    if error is None and stop.steps_started and not trax_revplus.is_active():
      # Stock trax's own steps failed: its traceback is trax's, for the log.
      logging.info('stock trax failed in its steps', exc_info=True)
      error = failures.stock_failure(e, log_path)
    if error is None:
      raise
    raise error from None
  finally:
    _close_trainers(loop if loop is not None else failed_loop)
  printers = [
    c
    for c in loop_door.callbacks(loop)
    if isinstance(c, progress.ProgressPrinter)
  ]
  if step_floor and printers:
    _measure_step_floor(loop, printers[0])
  summary = printers[0].summary() if printers else None
  saved = checkpoint if os.path.exists(checkpoint) else None
  if stop.signum is not None:  # Came after the last step ended.
    print(
      warning_line(
        COMMAND,
        f'signal {stop.signum} received after the '
        f'last step; the run is complete.',
      ),
      file=sys.stderr,
      flush=True,
    )
  print(
    summaries.format_summary(
      summary,
      loop,
      saved,
      checkpoint_step,
      log_path,
      train_bindings.total_steps(),
    ),
    flush=True,
  )
  return EXIT_OK


def run(flags: argparse.Namespace) -> int:
  """Runs `trax-revplus train` with the parsed flags.

  SIGINT and SIGTERM are handled from the start, the join included: a
  signal before the first step ends the run at once, in one line. In a
  multi-process run a process that fails, or is stopped before the
  processes agreed on a step to stop after, prints its line and ends at
  once (`ending.exit_immediately`), without waiting for the others.

  Returns:
    The exit status: 0 done.

  Raises:
    UserError: for anything a user can cause; the message is one line.
  """
  config_files, bindings = configs_from_flags(flags)
  output_dir = os.path.expanduser(
    flags.output_dir or output_dirs.default_output_dir(config_files)
  )
  output_dirs.check_writable(output_dir)
  cache_dir = cache_flags.directory_from_flags(flags)
  stop = interrupt.StopOnSignal(
    notify=lambda signum: _signal_notice(signum, stop, output_dir)
  )
  try:
    with stop:
      try:
        # Before anything touches JAX.
        config = distributed_flags.join_from_flags(flags, COMMAND)
      except interrupt.Interrupted as e:
        raise _interrupted(e, output_dir) from None
      if not config.is_multi_process:
        return _run(
          flags, config_files, bindings, output_dir, None, stop, cache_dir
        )
      try:
        return _run(
          flags,
          config_files,
          bindings,
          output_dir,
          processes.process_index(),
          stop,
          cache_dir,
        )
      except UserError as e:
        if e.exit_code > 128 and stop.stopped_at_step is not None:
          raise  # Every process stopped after one step: they end together.
        line, code = str(e), e.exit_code
      except Exception as e:  # pylint: disable=broad-except
        line, code = ending.failure(e, config)
  except BaseException as e:
    # A second signal during the steps: the handler before ours raised
    # (a BaseException, as KeyboardInterrupt is) wherever the run was.
    if isinstance(e, Exception) or not _stopped_twice(stop):
      raise
    raise _interrupted_twice(stop, output_dir) from None
  print(error_line(COMMAND, line), file=sys.stderr, flush=True)
  ending.exit_immediately(code)


def _signal_notice(
  signum: int, stop: interrupt.StopOnSignal, output_dir: str
) -> None:
  """Says, from the signal handler, after which step the run stops, with
  which checkpoint, and the step the same command then resumes from."""
  step = stop.stops_after_step
  if step is None:  # Never: before the first step a signal stops at once.
    text = (
      f'{signal.Signals(signum).name} received: stopping after this '
      f'step with a checkpoint (send it again to stop at once)'
    )
  else:
    text = summaries.stopping_notice(
      signum,
      step,
      os.path.join(output_dir, stop.basename + '.pkl.gz'),
      train_bindings.total_steps(),
    )
  logging.info(text)
  # os.write, not print: a handler may run while the main thread is in the
  # middle of writing to sys.stderr.
  os.write(2, (warning_line(COMMAND, text) + '\n').encode())


def _interrupted(e: interrupt.Interrupted, output_dir: str) -> UserError:
  """The one-line error of a run stopped by a signal."""
  # train.steps is bound once the configs are parsed, before any step.
  total = None if e.step is None else train_bindings.total_steps()
  return UserError(
    summaries.interrupted_message(e, output_dir, total),
    signal_exit_status(e.signum),
  )


def _stopped_twice(stop: interrupt.StopOnSignal) -> bool:
  """Whether a second signal stopped the run once its steps began (before
  them the first signal stops at once, and nothing new would be lost)."""
  return stop.second_signum is not None and stop.steps_started


def _interrupted_twice(
  stop: interrupt.StopOnSignal, output_dir: str
) -> UserError:
  """The one-line error of a run a second signal stopped at once: the
  checkpoint that stands and the step the same command resumes from."""
  assert stop.second_signum is not None
  return UserError(
    summaries.interrupted_twice_message(
      stop,
      _standing_checkpoint(output_dir),
      output_dir,
      train_bindings.total_steps(),
    ),
    signal_exit_status(stop.second_signum),
  )


def _run(
  flags: argparse.Namespace,
  config_files: list[str],
  bindings: list[str],
  output_dir: str,
  process: int | None,
  stop: interrupt.StopOnSignal,
  cache_dir: str | None,
) -> int:
  """`run` once joined; `process` is this process's index in a
  multi-process run, else None; `cache_dir` the compilation cache's
  directory, or None (none)."""
  # Process 0 alone holds the lock of a run's shared output dir.
  lock = output_dirs.OutputDirLock(output_dir, f'{PROG} train')
  lock_if_chief = (lambda: None) if process else functools.partial(_lock, lock)
  try:
    locked = os.path.isdir(output_dir)
    if locked:
      lock_if_chief()  # Before trax's import: a busy dir answers at once.
    import_messages = gin_config.import_trax_quietly()
    # A signal during the import may have been lost inside a callback of
    # a library (see `StopOnSignal.raise_if_signalled`): stop here, before
    # anything is written.
    stop.raise_if_signalled()
    gin_config.parse_configs(config_files, bindings)
    train_bindings.select_implementation(flags.implementation)
    train_bindings.bind_memory_log(flags.memory_log_every_n_steps)
    warnings = _check_settings()
    stop.raise_if_signalled()
    if process is not None:
      train_bindings.share_seed()
    callbacks = train_bindings.train_callbacks(
      flags.progress_every_n_steps, flags.profile
    )
    # The device, before anything is written: one held by another process
    # (a TPU chip belongs to one) ends the run in one line.
    backend.open_backend()
    output_dirs.make(output_dir)
    if not locked:
      lock_if_chief()
    with (
      run_log.run_logging(
        output_dir, import_messages, process, tuple(warnings)
      ) as log_path,
      cache_flags.enabled(cache_dir),
    ):
      return _train(
        output_dir,
        callbacks,
        log_path,
        stop,
        bindings,
        process is not None,
        flags.step_floor,
      )
  except interrupt.Interrupted as e:
    raise _interrupted(e, output_dir) from None
  finally:
    lock.release()
