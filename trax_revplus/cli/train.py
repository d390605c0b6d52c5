"""The `trax-revplus` command: train, compare and plot-memory.

`trax-revplus train` replaces `python -m trax.trainer` (which fails at import
on current JAX) for one-host runs: same `--config_file`, `--config` and
`--output_dir` flags, then `trax.supervised.trainer_lib.train`. It prints a
progress line every few steps and a summary at the end. A gin config that
contains `import trax_revplus.activate` trains with trax_revplus's layers and
trainer; without that line it trains with stock trax.

User errors (bad flags, a missing or unparsable config, an unknown binding,
an unwritable output directory, a bad corpus setting) print one line on
stderr and exit with status 2 (usage) or 1 (runtime), without a traceback.

Only absl flags are imported at module level, so `--help` and the checks on
flags and paths answer before trax's ~20 s import.
"""

import contextlib
import copy
import datetime
import functools
import inspect
import logging as std_logging
import os
import re
import sys
import tempfile
import textwrap

from absl import flags

PROG = 'trax-revplus'
EXIT_OK = 0
EXIT_RUNTIME = 1
EXIT_USAGE = 2

USAGE = f"""\
usage: {PROG} <command> [flags]

Drop-in memory-efficient reversible training for Trax.

commands:
  train         Train a gin-configured trax model (python -m trax.trainer,
                on current JAX), with progress lines and a summary.
  compare       Train the same config with stock trax and with trax_revplus
                in fresh processes; print a table of time, memory and loss.
  plot-memory   Plot the memory log (memory.jsonl) of a run directory.

Run '{PROG} <command> --help' for the flags of a command.
"""


class UserError(Exception):
  """A mistake in the command line or config; reported in one line."""

  def __init__(self, message, exit_code=EXIT_USAGE):
    super().__init__(message)
    self.exit_code = exit_code


# ------------------------------------------------------------------ flags --


def _train_flags():
  """Flags of `train`, in a FlagValues of their own (no global state)."""
  fv = flags.FlagValues()
  flags.DEFINE_multi_string(
      'config_file', None,
      'Gin config file (.gin). Repeat to parse several, in order. An '
      '`include` in a config is looked up next to the including file too.',
      flag_values=fv)
  flags.DEFINE_multi_string(
      'config', None,
      "Gin binding, e.g. --config='train.steps = 50'. Repeat for several; "
      'applied after all config files.',
      flag_values=fv)
  flags.DEFINE_string(
      'output_dir', None,
      'Directory for checkpoints (model.pkl.gz, model.weights.npy.gz), '
      'TensorBoard summaries, config.gin and the full log (train.log); '
      'created if missing. A run resumes from the checkpoint found there. '
      'Default: ~/trax/<first config name>_<date>_<time>.',
      flag_values=fv)
  flags.DEFINE_integer(
      'progress_every_n_steps', 10,
      'Print a progress line (step, loss, steps/s, host memory) every this '
      'many steps, and at the first and last step.',
      lower_bound=1, flag_values=fv)
  flags.DEFINE_enum(
      'implementation', 'config', ['config', 'stock', 'revplus'],
      'Which reversible layers and trainer train: config (as the config '
      'says: trax_revplus if it has the line `import trax_revplus.activate`, '
      'else stock trax), stock (stock trax, even if the config has that '
      'line) or revplus (trax_revplus, even if it does not).',
      flag_values=fv)
  return fv


def _compare_flags():
  """Flags of `compare`, in a FlagValues of their own."""
  fv = flags.FlagValues()
  flags.DEFINE_multi_string(
      'config_file', None,
      'Gin config file; repeatable. With or without the line `import '
      'trax_revplus.activate`: the stock run ignores it, the trax_revplus '
      'run adds it.',
      flag_values=fv)
  flags.DEFINE_multi_string(
      'config', None, 'Gin binding applied to both runs; repeatable.',
      flag_values=fv)
  flags.DEFINE_integer(
      'steps', None,
      'Train this many steps in each run (binds train.steps). Default: as '
      'the config says.',
      lower_bound=1, flag_values=fv)
  flags.DEFINE_integer(
      'seed', None,
      'Random seed of both runs (binds train.random_seed). Default: the '
      "config's, or 0 if the config sets none.",
      flag_values=fv)
  flags.DEFINE_string(
      'output_dir', None,
      'Directory for both runs (stock/, revplus/, with their logs stock.log '
      'and revplus.log), compare.json and compare.png. Default: '
      '~/trax/compare_<first config name>_<date>_<time>.',
      flag_values=fv)
  return fv


def _plot_memory_flags():
  fv = flags.FlagValues()
  flags.DEFINE_string(
      'output', None,
      'Path of the PNG to write. Default: memory.png in RUN_DIR.',
      flag_values=fv)
  return fv


def _flag_help(fv, names):
  """Formats the help of flags `names` of `fv`, one paragraph each.

  Args:
    fv: The command's flags.FlagValues.
    names: List of (flag name, value placeholder) pairs, in display order.
  """
  lines = []
  for name, placeholder in names:
    flag = fv[name]
    lines.append(f'  --{name}={placeholder}')
    # absl appends this sentence to multi-flags; the help says "Repeat".
    text = re.sub(r';\s*repeat this option to specify a list of values', '',
                  flag.help)
    if flag.default is not None and not isinstance(flag.default, list):
      text += f' (default: {flag.default})'
    lines.extend(textwrap.wrap(text, width=76, initial_indent='      ',
                               subsequent_indent='      '))
  return '\n'.join(lines)


_TRAIN_HELP = f"""\
usage: {PROG} train --config_file=FILE.gin [--config=BINDING ...]
                    [--output_dir=DIR] [--progress_every_n_steps=N]
                    [--implementation=config|stock|revplus]

Trains the model a gin config describes with trax.supervised.trainer_lib.train
(the job of `python -m trax.trainer`, on current JAX). Add the line
`import trax_revplus.activate` to a config to train with trax_revplus.

flags:
{{flags}}

exit status: 0 done, 1 runtime error (e.g. unwritable output dir, bad corpus),
2 usage error (bad flag, missing or unparsable config, unknown binding).
"""

_COMPARE_HELP = f"""\
usage: {PROG} compare --config_file=FILE.gin [--config=BINDING ...]
                      [--steps=N] [--seed=S] [--output_dir=DIR]

Trains the same config twice, one after the other, each in a fresh process
with the same seed: with stock trax (train --implementation=stock), then with
trax_revplus (--implementation=revplus). Prints a table side by side: loss
per step, max abs difference of the final weights and optimizer slots,
first-step (compile) and median step time, peak host RSS, peak device bytes
and bytes copied host-to-device and back. Writes DIR/compare.json (keys
documented in trax_revplus/compare.py) and DIR/compare.png. If stock trax
cannot run the config (e.g. 2+ devices, or use_memory_efficient_trainer = 2,
on current JAX), the table says why.

flags:
{{flags}}

exit status: 0 the trax_revplus run succeeded (even if stock failed), 1 it
failed, 2 usage error (bad flag, missing config, output dirs holding runs).
"""

_PLOT_MEMORY_HELP = f"""\
usage: {PROG} plot-memory RUN_DIR [--output=PNG]

Plots host and device memory over the steps of a run from the memory log
(RUN_DIR/memory.jsonl) that trax_revplus's trainer writes.

flags:
{{flags}}
"""

_HELP_FLAGS = ('-h', '--help', '-help', '--helpshort', '--helpfull')


def _parse(fv, argv, help_template, names):
  """Parses `argv` (argv[0] is the command) into `fv`.

  Returns:
    The positional arguments after the command (list of str), or None if
    help was printed.

  Raises:
    UserError: On an unknown flag or a bad flag value.
  """
  if any(arg in _HELP_FLAGS for arg in argv[1:]):
    print(help_template.format(flags=_flag_help(fv, names)))
    return None
  try:
    return fv(argv)[1:]
  except flags.Error as e:
    raise UserError(str(e)) from None


# --------------------------------------------------------------- helpers --


@contextlib.contextmanager
def _stderr_captured_to(capture):
  """Sends file descriptor 2 to the temporary file `capture` meanwhile.

  trax's import makes TensorFlow, XLA and gym print notices on stderr that
  would drown a one-line error; the CLI keeps them for the run's log
  instead.
  """
  sys.stderr.flush()
  saved = os.dup(2)
  os.dup2(capture.fileno(), 2)
  try:
    yield
  finally:
    sys.stderr.flush()
    os.dup2(saved, 2)
    os.close(saved)


def _import_trax():
  """Imports trax and the modules whose gin configurables configs use.

  Returns:
    The text trax's imports printed on stderr (str).
  """
  with tempfile.TemporaryFile(mode='w+b') as capture:
    try:
      with _stderr_captured_to(capture):
        # pylint: disable=g-import-not-at-top,unused-import
        import trax
        from trax import data as _trax_data
        from trax import layers as _trax_layers
        from trax import models as _trax_models
        from trax import optimizers as _trax_optimizers
        from trax.supervised import trainer_lib as _trainer_lib
        from trax_revplus import data as _revplus_data
        from trax_revplus import progress as _revplus_progress
        # pylint: enable=g-import-not-at-top,unused-import
    except BaseException:
      capture.seek(0)
      sys.stderr.write(capture.read().decode('utf-8', 'replace'))
      raise
    capture.seek(0)
    return capture.read().decode('utf-8', 'replace')


def _check_config_files(config_files):
  for path in config_files:
    if not os.path.exists(path):
      raise UserError(f'config file not found: {path}')
    if not os.path.isfile(path):
      raise UserError(f'config file is not a regular file: {path}')
    if not os.access(path, os.R_OK):
      raise UserError(f'config file is not readable: {path}')


def _check_output_dir(output_dir):
  """Checks that `output_dir` exists as a writable directory or can be made.

  Raises:
    UserError (exit status 1): if it cannot be used.
  """
  path = os.path.abspath(output_dir)
  probe = path
  while not os.path.exists(probe):
    parent = os.path.dirname(probe)
    if parent == probe:
      break
    probe = parent
  if not os.path.isdir(probe):
    raise UserError(f'cannot use output dir {output_dir}: {probe} is not a '
                    f'directory', EXIT_RUNTIME)
  if not os.access(probe, os.W_OK | os.X_OK):
    what = 'it' if probe == path else f'its parent {probe}'
    raise UserError(f'cannot write to output dir {output_dir}: {what} is not '
                    f'writable', EXIT_RUNTIME)


def _one_line(exception):
  """Condenses an exception message (e.g. gin's, with context) to a line."""
  lines = [line.strip() for line in str(exception).splitlines()]
  lines = [line for line in lines if line]
  if not lines:
    return type(exception).__name__
  where = [line for line in lines[1:] if line.startswith('In ')]
  text = lines[0]
  if where:
    text += f' ({where[0]})'
  return text


class _GinSearchNoise(std_logging.Filter):
  """Drops gin's "Path not found" errors for search-path misses.

  gin looks for an `include`d file under every search path in turn and logs
  an error on the root logger for each miss, even when a later path has it.
  """

  def filter(self, record):
    return not (record.pathname.endswith('resource_reader.py') and
                record.getMessage().startswith('Path not found'))


_GIN_ERRORS = (SyntaxError, ValueError, ImportError, NameError,
               AttributeError, TypeError, OSError, KeyError)


def _gin_error(exception):
  """gin's error in one line; for a knob of ours, also the knobs it has."""
  from trax_revplus import validation  # pylint: disable=g-import-not-at-top
  hint = validation.unknown_knob_hint(str(exception))
  text = _one_line(exception)
  return f'{text}; {hint}' if hint else text


def parse_configs(config_files, bindings):
  """Parses gin config files, then bindings, the way `train` does.

  Starts from an empty gin config and stock trax (any earlier activation is
  undone), so that an `import trax_revplus.activate` line in the configs
  takes effect in this call. Each config file's directory is added to gin's
  search path, so `include 'base.gin'` finds a file next to the includer.
  trax and the configurables configs use must be imported already.

  Args:
    config_files: List of paths (str) of .gin files, parsed in order.
    bindings: List of gin binding strings, parsed after the files.

  Raises:
    UserError: naming the file or binding that gin could not parse.
  """
  import gin  # pylint: disable=g-import-not-at-top
  import trax_revplus  # pylint: disable=g-import-not-at-top
  gin.clear_config()
  trax_revplus.deactivate()
  # Let gin's `import trax_revplus.activate` run the module (and activate)
  # again in this process.
  sys.modules.pop('trax_revplus.activate', None)
  for path in config_files:
    gin.add_config_file_search_path(os.path.dirname(os.path.abspath(path)))
  noise = _GinSearchNoise()
  std_logging.getLogger().addFilter(noise)
  try:
    for path in config_files:
      try:
        gin.parse_config_file(path)
      except _GIN_ERRORS as e:
        raise UserError(
            f'cannot parse config file {path}: {_gin_error(e)}') from None
  finally:
    std_logging.getLogger().removeFilter(noise)
  for binding in bindings:
    try:
      gin.parse_config(binding)
    except _GIN_ERRORS as e:
      raise UserError(
          f'cannot apply --config={binding!r}: {_gin_error(e)}') from None


def _query(name, default):
  import gin  # pylint: disable=g-import-not-at-top
  try:
    return gin.query_parameter(name)
  except ValueError:
    return default


def _default_output_dir(config_files):
  name = (os.path.splitext(os.path.basename(config_files[0]))[0]
          if config_files else 'trax')
  stamp = datetime.datetime.now().strftime('%Y%m%d_%H%M%S')
  return os.path.join('~', 'trax', f'{name}_{stamp}')


def _setup_logging(output_dir, import_messages):
  """Full absl log to output_dir/train.log; warnings and worse on stderr.

  Returns:
    (handlers, log_path): the handlers added to absl's logger and the path
    of the log file (str).
  """
  from absl import logging  # pylint: disable=g-import-not-at-top
  logging.set_verbosity(logging.INFO)
  absl_logger = logging.get_absl_logger()
  log_path = os.path.join(output_dir, 'train.log')
  to_file = std_logging.FileHandler(log_path)
  to_file.setLevel(std_logging.INFO)
  to_stderr = std_logging.StreamHandler(sys.stderr)
  to_stderr.setLevel(std_logging.WARNING)
  for handler in (to_file, to_stderr):
    handler.setFormatter(logging.PythonFormatter())
    absl_logger.addHandler(handler)
  # trax logs every metric at INFO; keep those out of the terminal (where
  # trax also prints the eval lines) and out of the root logger's handlers.
  absl_logger.propagate = False
  if import_messages.strip():
    logging.info('Messages printed on stderr while importing trax:\n%s',
                 import_messages)
  return (to_file, to_stderr), log_path


def _train_callbacks(every_n_steps):
  """train.callbacks as gin would pass them, plus a ProgressPrinter."""
  from trax.supervised import trainer_lib  # pylint: disable=g-import-not-at-top
  from trax_revplus import progress  # pylint: disable=g-import-not-at-top
  # Gin hands a configurable the deep copy of its bound value; the copy
  # turns `@Callback` references into the callables themselves.
  callbacks = list(copy.deepcopy(_query('train.callbacks', None)) or [])
  if any(isinstance(c, type) and issubclass(c, progress.ProgressPrinter)
         for c in callbacks):
    return callbacks
  steps = _query('train.steps', inspect.signature(
      trainer_lib.train).parameters['steps'].default)
  callbacks.append(functools.partial(
      progress.ProgressPrinter, total_steps=steps,
      every_n_steps=every_n_steps))
  return callbacks


def _checkpoint_step(path):
  from trax.supervised import training  # pylint: disable=g-import-not-at-top
  try:
    return training.unpickle_from_file(path, gzip=True)['step']
  except (OSError, EOFError, KeyError, ValueError):
    return None


def _qualified_name(cls):
  return f'{cls.__module__}.{cls.__qualname__}'


def _implementations(loop):
  """Which classes ran: the trainer and the reversible layers of the model.

  Returns:
    (trainer, layers): str, e.g. 'trax_revplus.trainer.ReversibleSerialTrainer'
    and 'trax_revplus.layers.ReversibleHalfResidual x8, ...' ('none' if the
    model has no reversible layers).
  """
  from trax.layers import reversible  # pylint: disable=g-import-not-at-top
  trainers = getattr(loop, '_trainer_per_task', ())
  trainer = _qualified_name(type(trainers[0])) if trainers else 'n/a'
  counts = {}
  def walk(layer):
    if isinstance(layer, (reversible.ReversibleSerial,
                          reversible.ReversibleHalfResidual)):
      name = _qualified_name(type(layer))
      counts[name] = counts.get(name, 0) + 1
    for sublayer in layer.sublayers:
      walk(sublayer)
  walk(loop.model)
  layers = ', '.join(f'{name} x{n}' for name, n in sorted(counts.items()))
  return trainer, layers or 'none'


def _format_summary(summary, implementations, checkpoint, checkpoint_step,
                    log_path):
  """The end-of-run block: final losses, speed, memory, checkpoint."""
  def loss(value):
    return 'n/a' if value is None else f'{value:.4f} nats'
  rows = []
  if implementations is not None:
    rows.append(('trainer', implementations[0]))
    rows.append(('reversible layers', implementations[1]))
  if summary is not None:
    rows.append(('steps', f"{summary['last_step']} "
                          f"({summary['steps_run']} in this run)"))
    train_from = summary['final_train_loss_from_step']
    rows.append(('final train loss',
                 f"{loss(summary['final_train_loss'])} "
                 f"(mean of steps {train_from}-{summary['last_step']})"
                 if train_from is not None else 'n/a'))
    evals = summary['eval_losses']
    if evals:
      rows.append(('final eval loss',
                   f'{loss(evals[-1][1])} (step {evals[-1][0]})'))
      rows.append(('first eval loss',
                   f'{loss(evals[0][1])} (step {evals[0][0]})'))
    else:
      rows.append(('final eval loss', 'n/a (no eval ran)'))
    if summary['steps_per_second']:
      rows.append(('train time', f"{summary['train_seconds']:.1f} s in steps, "
                                 f"{summary['steps_per_second']:.2f} steps/s"))
    rows.append(('peak host memory',
                 f"{summary['peak_host_rss_bytes'] / 2**20:.0f} MB (RSS)"))
  if checkpoint:
    rows.append(('checkpoint', f'{checkpoint} (step {checkpoint_step})'))
  else:
    rows.append(('checkpoint', 'none written'))
  rows.append(('full log', log_path))
  width = max(len(k) for k, _ in rows)
  return '\n'.join(['', '== summary =='] +
                   [f'{k.ljust(width)}  {v}' for k, v in rows])


# -------------------------------------------------------------- commands --


def _configs_from_flags(fv, args):
  """The config files and bindings `train` and `compare` were given.

  Args:
    fv: The command's parsed flags.FlagValues.
    args: Positional arguments left after the flags (list of str).

  Returns:
    `(config_files, bindings)`, two lists of str.

  Raises:
    UserError: on positional arguments, when neither a config file nor a
      binding is given, or when a config file is missing or unreadable.
  """
  if args:
    raise UserError(f'unexpected arguments: {" ".join(args)} (use '
                    f'--config_file=FILE and --config=BINDING)')
  config_files = list(fv.config_file or [])
  bindings = list(fv.config or [])
  if not config_files and not bindings:
    raise UserError('no config: give --config_file=FILE.gin (and/or '
                    '--config=BINDING)')
  _check_config_files(config_files)
  return config_files, bindings


def train_main(argv):
  """`trax-revplus train`: see _TRAIN_HELP. Returns the exit status."""
  fv = _train_flags()
  args = _parse(fv, argv, _TRAIN_HELP,
                [('config_file', 'FILE'), ('config', 'BINDING'),
                 ('output_dir', 'DIR'), ('progress_every_n_steps', 'N'),
                 ('implementation', 'config|stock|revplus')])
  if args is None:
    return EXIT_OK
  config_files, bindings = _configs_from_flags(fv, args)
  output_dir = os.path.expanduser(
      fv.output_dir or _default_output_dir(config_files))
  _check_output_dir(output_dir)

  import_messages = _import_trax()
  parse_configs(config_files, bindings)
  _select_implementation(fv.implementation)
  if _query('train.model', None) is None:
    raise UserError('no model configured: bind train.model, e.g. '
                    "--config='train.model = @trax.models.ReformerLM'")
  callbacks = _train_callbacks(fv.progress_every_n_steps)
  try:
    os.makedirs(output_dir, exist_ok=True)
  except OSError as e:
    raise UserError(f'cannot create output dir {output_dir}: '
                    f'{e.strerror or e}', EXIT_RUNTIME) from None
  handlers, log_path = _setup_logging(output_dir, import_messages)
  try:
    return _run_training(output_dir, callbacks, log_path)
  finally:
    from absl import logging  # pylint: disable=g-import-not-at-top
    absl_logger = logging.get_absl_logger()
    absl_logger.propagate = True
    for handler in handlers:
      absl_logger.removeHandler(handler)
      handler.close()


def _select_implementation(implementation):
  """Applies --implementation after the configs are parsed.

  The model and trainer are built later, in trainer_lib.train, so they get
  the classes bound here whatever the config's activation line did.

  Args:
    implementation: 'config' (leave as parsed), 'stock' or 'revplus'.
  """
  import trax_revplus  # pylint: disable=g-import-not-at-top
  if implementation == 'stock':
    trax_revplus.deactivate()
  elif implementation == 'revplus':
    trax_revplus.activate()


def _close_trainers(loop):
  """Flushes and closes the memory logs of the Loop's trainers.

  Closing them here, not in the garbage collector, matters: a TensorBoard
  writer closed from `__del__` during a collection can wait forever on its
  own writer thread.
  """
  for trainer in getattr(loop, '_trainer_per_task', ()):
    memory_log = getattr(trainer, 'memory_log', None)
    close = getattr(memory_log, 'close', None)
    if close is not None:
      close()


def _interrupted_message(interrupted, output_dir):
  """One line for a run stopped by SIGINT/SIGTERM (see StopOnSignal)."""
  import signal  # pylint: disable=g-import-not-at-top
  if interrupted.loop is not None:
    _close_trainers(interrupted.loop)
  name = signal.Signals(interrupted.signum).name
  if interrupted.checkpoint is None:
    return (f'interrupted by {name} before the first step; nothing new was '
            f'saved in {output_dir}')
  return (f'interrupted by {name}: stopped after step {interrupted.step}, '
          f'checkpoint {interrupted.checkpoint} (step {interrupted.step}); '
          f'run the same command to resume')


def _run_training(output_dir, callbacks, log_path):
  """Runs trainer_lib.train, then saves a final checkpoint and summarizes.

  SIGINT/SIGTERM stop the run at the next step boundary with a checkpoint
  (`checkpoints.StopOnSignal`); the exit status is then 128 + the signal
  number (130, 143).
  """
  import gin  # pylint: disable=g-import-not-at-top
  from trax.supervised import trainer_lib  # pylint: disable=g-import-not-at-top
  from trax_revplus import checkpoints  # pylint: disable=g-import-not-at-top
  from trax_revplus import data  # pylint: disable=g-import-not-at-top
  from trax_revplus import progress  # pylint: disable=g-import-not-at-top
  from trax_revplus import validation  # pylint: disable=g-import-not-at-top
  import trax_revplus  # pylint: disable=g-import-not-at-top

  gin.finalize()
  which = 'trax_revplus' if trax_revplus.is_active() else 'stock trax'
  print(f'{PROG} train: {which} reversible layers and trainer; output in '
        f'{output_dir}', flush=True)
  stop = checkpoints.StopOnSignal()
  try:
    with stop:
      loop = trainer_lib.train(output_dir=output_dir,
                               callbacks=list(callbacks) + [stop.callback])
  except checkpoints.Interrupted as e:
    raise UserError(_interrupted_message(e, output_dir),
                    128 + e.signum) from None
  except data.CorpusError as e:
    raise UserError(_one_line(e), EXIT_RUNTIME) from None
  except (validation.ConfigurationError, validation.OptimizerFactoryError,
          validation.NonFiniteError, checkpoints.CheckpointError) as e:
    raise UserError(f'{type(e).__name__}: {_one_line(e)}',
                    EXIT_RUNTIME) from None
  _close_trainers(loop)

  checkpoint = os.path.join(output_dir, 'model.pkl.gz')
  checkpoint_step = None
  summary = None
  implementations = None
  loop_step = getattr(loop, 'step', None)
  if hasattr(loop, 'save_checkpoint'):
    checkpoint_step = _checkpoint_step(checkpoint)
    # trax checkpoints every eval_frequency steps; keep the final weights
    # too when the run did not end on such a step.
    if checkpoint_step != loop_step:
      loop.save_checkpoint('model')
      checkpoint_step = _checkpoint_step(checkpoint)
    printers = [c for c in getattr(loop, '_callbacks', ())
                if isinstance(c, progress.ProgressPrinter)]
    if printers:
      summary = printers[0].summary()
    implementations = _implementations(loop)
  if not os.path.exists(checkpoint):
    checkpoint = None
  if stop.signum is not None:  # Came after the last step ended.
    print(f'{PROG} train: signal {stop.signum} received after the last step;'
          f' the run is complete.', file=sys.stderr, flush=True)
  print(_format_summary(summary, implementations, checkpoint,
                        checkpoint_step, log_path), flush=True)
  return EXIT_OK


def compare_main(argv):
  """`trax-revplus compare`: see _COMPARE_HELP. Returns the exit status."""
  fv = _compare_flags()
  args = _parse(fv, argv, _COMPARE_HELP,
                [('config_file', 'FILE'), ('config', 'BINDING'),
                 ('steps', 'N'), ('seed', 'S'), ('output_dir', 'DIR')])
  if args is None:
    return EXIT_OK
  config_files, bindings = _configs_from_flags(fv, args)
  if fv.output_dir:
    _check_output_dir(os.path.expanduser(fv.output_dir))
  # Imported here, not at the top: it is only needed by this command.
  from trax_revplus import compare  # pylint: disable=g-import-not-at-top
  return compare.compare_main(config_files=config_files, bindings=bindings,
                              output_dir=fv.output_dir, steps=fv.steps,
                              seed=fv.seed)


def plot_memory_main(argv):
  """`trax-revplus plot-memory`: see _PLOT_MEMORY_HELP. Returns exit status."""
  fv = _plot_memory_flags()
  args = _parse(fv, argv, _PLOT_MEMORY_HELP, [('output', 'PNG')])
  if args is None:
    return EXIT_OK
  if len(args) != 1:
    raise UserError('give exactly one RUN_DIR')
  run_dir = args[0]
  if not os.path.isdir(run_dir):
    raise UserError(f'run directory not found: {run_dir}')
  from trax_revplus import memory_plot  # pylint: disable=g-import-not-at-top
  try:
    memory_plot.plot_memory_main(run_dir, output=fv.output)
  except (OSError, ValueError) as e:
    raise UserError(_one_line(e), EXIT_RUNTIME) from None
  return EXIT_OK


COMMANDS = {
    'train': train_main,
    'compare': compare_main,
    'plot-memory': plot_memory_main,
}


def main(argv):
  """Runs `trax-revplus` on `argv` (argv[0] is the program name).

  Returns:
    The exit status (int): 0 success, 1 runtime error, 2 usage error. User
    errors are printed as one line on stderr; unexpected crashes propagate.
  """
  args = list(argv[1:])
  if not args:
    sys.stderr.write(USAGE)
    return EXIT_USAGE
  command = args[0]
  if command in _HELP_FLAGS:
    sys.stdout.write(USAGE)
    return EXIT_OK
  if command not in COMMANDS:
    print(f'{PROG}: error: unknown command {command!r} (choose from '
          f'{", ".join(COMMANDS)}; see {PROG} --help)', file=sys.stderr)
    return EXIT_USAGE
  try:
    return COMMANDS[command]([f'{PROG} {command}'] + args[1:])
  except UserError as e:
    print(f'{PROG} {command}: error: {e}', file=sys.stderr, flush=True)
    return e.exit_code
  except KeyboardInterrupt:
    print(f'{PROG} {command}: interrupted', file=sys.stderr, flush=True)
    return 130


def run():
  """Console-script entry point: `trax-revplus ...`."""
  sys.exit(main(sys.argv))


if __name__ == '__main__':
  run()
