"""The flags and help of each `trax-revplus` command, one `add_*` each.

`parser.build` adds each command's subparser with its function here; the
text of `--help` (description, flags, exit statuses) stands next to the
flags it documents. Flags are read by `strict_argparse`'s rules.
"""

import argparse

from trax_revplus.cli.messages import PROG
from trax_revplus.cli.strict_argparse import integer
from trax_revplus.cli.strict_argparse import Once
from trax_revplus.cli.strict_argparse import path
from trax_revplus.cli.strict_argparse import positive_int
from trax_revplus.multiprocess import launch_flags

IMPLEMENTATIONS = ('config', 'stock', 'revplus')

_TRAIN_DESCRIPTION = """\
Trains the model a gin config describes with trax.supervised.trainer_lib.train
(the job of `python -m trax.trainer`, on current JAX). Add the line
`import trax_revplus.activate` to a config to train with trax_revplus.
Settings that cannot work (e.g. train.steps not a positive int, two settings
that exclude each other) are reported before anything is built. The output
dir is locked for the run: a second run into it stops at once. Third-party
warnings known to be harmless go to OUTPUT_DIR/train.log only."""

_TRAIN_EPILOG = """\
exit status: 0 done; 1 runtime error (e.g. unwritable or busy output dir,
bad corpus files, disk full, no consistent checkpoint); 2 usage error (bad
flag, missing or unparsable config, unknown binding, a setting out of range,
a model or checkpoint that does not fit the config); 128 + N stopped by
signal N (SIGINT 130, SIGTERM 143) with a checkpoint to resume from."""

_COMPARE_DESCRIPTION = """\
Trains the same config twice, one after the other, each in a fresh process
with the same seed: with stock trax (train --implementation=stock), then with
trax_revplus (--implementation=revplus). Prints a table side by side: loss
per step, max abs difference of the final weights and optimizer slots,
first-step (compile) and median step time, peak host RSS, peak device bytes
and bytes copied host-to-device and back. Writes DIR/compare.json (keys
documented in trax_revplus/compare/) and DIR/compare.png. If stock trax
cannot run the config (e.g. 2+ devices, or use_memory_efficient_trainer = 2,
on current JAX), the table says why."""

_COMPARE_EPILOG = """\
exit status: 0 the trax_revplus run succeeded (even if stock failed); 1 it
failed; 2 usage error (bad flag, missing config, output dirs holding runs)."""

_PLOT_MEMORY_DESCRIPTION = """\
Plots host and device memory over the steps of a run from the memory log
(RUN_DIR/memory.jsonl) that trax_revplus's trainer writes, and prints the
path of the PNG. Lines of the log that are not records are skipped, with a
warning line that counts them and names the first."""

_PLOT_MEMORY_EPILOG = """\
exit status: 0 done; 1 the log is corrupt (no line is a record) or
unreadable, or the PNG could not be written (nothing is left behind); 2
usage error (bad flag, no RUN_DIR, no memory log or no records in it yet,
--output a directory)."""


_ESTIMATE_DESCRIPTION = """\
Builds the config's model with trax's default Trainer, stock trax's
ReversibleSerialTrainer and trax_revplus's, compiles what one training step
of each would run (no step runs, no accelerator needed) and prints, per
trainer, the step's peak device bytes (XLA's memory analysis of its
programs, composed with what the trainer holds across each call), the host
bytes of weights + optimizer slots, the largest single program, and whether
it fits --device_memory; for trax_revplus also the segment plan it would run
under that memory (its device_memory_budget_bytes). Figures are those of
the backend the programs were compiled for, which the table names."""

_ESTIMATE_EPILOG = """\
exit status: 0 done (also when a trainer cannot be built on this JAX: its
row says why); otherwise the status train ends with for the same config,
with the same line, before anything is compiled: 2 usage error (bad flag
or --device_memory, missing or unparsable config, a setting train rejects,
a batch the devices or batch slices do not divide, a model its bindings
cannot build); 1 the config's inputs cannot be read, or --json cannot be
written."""


def _add_config_flags(
  parser: argparse.ArgumentParser, file_help: str, binding_help: str
) -> None:
  parser.add_argument(
    '--config_file',
    action='append',
    default=[],
    type=path,
    metavar='FILE',
    help=file_help,
  )
  parser.add_argument(
    '--config',
    action='append',
    default=[],
    metavar='BINDING',
    help=binding_help,
  )


def add_train(commands: 'argparse._SubParsersAction') -> None:
  parser = commands.add_parser(
    'train',
    help='train a gin-configured trax model',
    usage=(
      f'{PROG} train --config_file=FILE.gin [--config=BINDING ...]\n'
      f'{" " * 20}[--output_dir=DIR] [--progress_every_n_steps=N]\n'
      f'{" " * 20}[--implementation=config|stock|revplus]\n'
      f'{" " * 20}[--num_processes=N --process_id=I\n'
      f'{" " * 21}--coordinator_address=HOST:PORT]'
    ),
    description=_TRAIN_DESCRIPTION,
    epilog=_TRAIN_EPILOG,
  )
  _add_config_flags(
    parser,
    'Gin config file (.gin). Repeat to parse several, in order. An '
    '`include` in a config is looked up next to the including file too.',
    "Gin binding, e.g. --config='train.steps = 50'. Repeat for several; "
    'applied after all config files.',
  )
  parser.add_argument(
    '--output_dir',
    action=Once,
    type=path,
    metavar='DIR',
    help='Directory for checkpoints (model.pkl.gz, model.weights.npy.gz, '
    'model.manifest.json and the previous set model.prev.*), '
    'TensorBoard summaries, config.gin and the full log (train.log); '
    'created if missing. A run resumes from the checkpoint found '
    'there. Default: ~/trax/<first config name>_<date>_<time>.',
  )
  parser.add_argument(
    '--progress_every_n_steps',
    action=Once,
    type=positive_int,
    default=10,
    metavar='N',
    help='Print a progress line (step, loss, steps/s, host memory) every '
    'this many steps, and at the first and last step (default: '
    '%(default)s).',
  )
  parser.add_argument(
    '--memory_log_every_n_steps',
    action=Once,
    type=positive_int,
    metavar='N',
    help="Memory log of trax_revplus's trainer (OUTPUT_DIR/memory.jsonl, "
    'see docs/memory-log.md): every step gets a record of its true '
    'host peak; the first 10 steps of each process, then steps 1, '
    '1 + N, 1 + 2N, ... also get records of their phases. Binds '
    'trax_revplus.ReversibleSerialTrainer.memory_log_every_n_steps '
    "(default: the config's, else 100).",
  )
  add_compilation_cache_flags(parser)
  parser.add_argument(
    '--implementation',
    action=Once,
    choices=IMPLEMENTATIONS,
    default='config',
    metavar='config|stock|revplus',
    help='Which reversible layers and trainer train: config (as the '
    'config says: trax_revplus if it has the line `import '
    'trax_revplus.activate`, else stock trax), stock (stock trax, '
    'even if the config has that line) or revplus (trax_revplus, '
    'even if it does not) (default: %(default)s).',
  )
  _add_distributed_flags(parser)


def add_compilation_cache_flags(parser: argparse.ArgumentParser) -> None:
  """--compilation_cache_dir and --nocompilation_cache (train, estimate)."""
  group = parser.add_mutually_exclusive_group()
  group.add_argument(
    '--compilation_cache_dir',
    action=Once,
    type=path,
    default='auto',
    metavar='DIR',
    help="JAX's persistent compilation cache: programs compiled once are "
    'written here and read back by every later run (a resume, a '
    'second run of the config) instead of compiled again. Default: '
    '$XDG_CACHE_HOME/trax_revplus/jax (~/.cache/trax_revplus/jax).',
  )
  group.add_argument(
    '--nocompilation_cache',
    action='store_true',
    help='Compile every program afresh; read and write no cache.',
  )


def _add_distributed_flags(parser: argparse.ArgumentParser) -> None:
  group = parser.add_argument_group(
    'multiple processes (jax.distributed; see docs/multiple-hosts.md)'
  )
  group.add_argument(
    '--num_processes',
    action=Once,
    type=positive_int,
    metavar='N',
    help='Processes of the run, one per host or several on one. Default: '
    'from a cluster launcher (SLURM, Open MPI, Kubernetes indexed '
    'Job), else 1.',
  )
  group.add_argument(
    '--process_id',
    action=Once,
    type=integer,
    metavar='I',
    help='This process, 0..N-1; process 0 serves the coordinator and '
    'writes checkpoints. Default: from the cluster launcher.',
  )
  group.add_argument(
    '--coordinator_address',
    action=Once,
    metavar='HOST:PORT',
    help='Address of process 0 and a free port there. Default: '
    '$JAX_COORDINATOR_ADDRESS, else derived by JAX from the cluster '
    'launcher.',
  )
  group.add_argument(
    '--join_timeout_seconds',
    action=Once,
    type=positive_int,
    default=300,
    metavar='S',
    help='Give up (one line, exit 1) when not every process joined within '
    'S seconds (default: %(default)s).',
  )
  group.add_argument(
    '--heartbeat_timeout_seconds',
    action=Once,
    type=positive_int,
    default=100,
    metavar='S',
    help='A process silent this long (frozen, host down) is declared dead '
    'and the run ends (default: %(default)s).',
  )


_LAUNCH_DESCRIPTION = """\
Starts N processes of one training run on this host, each `trax-revplus train`
with the flags after `--` plus --num_processes=N --process_id=I
--coordinator_address=127.0.0.1:PORT (a free port), all with one output dir
(the default one is named once, for all). Their output is forwarded line by
line, prefixed [process I], and each process's goes to
OUTPUT_DIR/launch.process<I>.log too. When one process fails, the others are
stopped (SIGTERM, then SIGKILL after the grace), and the terminal shows the
failed process's lines and one line of the launcher's, nothing more of the
others. SIGINT and SIGTERM are forwarded to all."""

_LAUNCH_EPILOG = """\
example: trax-revplus launch --num_processes=2 -- \\
           --config_file=gin_configs/reformer_char_lm.gin --output_dir=DIR
exit status: 0 every process succeeded; otherwise the status of the first
process that failed (128 + N for signal N); 2 usage error."""


def add_launch(commands: 'argparse._SubParsersAction') -> None:
  parser = commands.add_parser(
    'launch',
    help='start N local processes of one training run',
    usage=f'{PROG} launch --num_processes=N -- TRAIN_FLAGS...',
    description=_LAUNCH_DESCRIPTION,
    epilog=_LAUNCH_EPILOG,
  )
  launch_flags.add_launch_flags(parser)


def add_compare(commands: 'argparse._SubParsersAction') -> None:
  parser = commands.add_parser(
    'compare',
    help='stock trax and trax_revplus side by side',
    usage=(
      f'{PROG} compare --config_file=FILE.gin [--config=BINDING ...]\n'
      f'{" " * 22}[--steps=N] [--seed=S] [--output_dir=DIR] '
      '[--nodevice_accounting]'
    ),
    description=_COMPARE_DESCRIPTION,
    epilog=_COMPARE_EPILOG,
  )
  _add_config_flags(
    parser,
    'Gin config file; repeatable. With or without the line `import '
    'trax_revplus.activate`: the stock run ignores it, the trax_revplus '
    'run adds it.',
    'Gin binding applied to both runs; repeatable.',
  )
  parser.add_argument(
    '--steps',
    action=Once,
    type=positive_int,
    metavar='N',
    help='Train this many steps in each run (binds train.steps). Default: '
    'as the config says.',
  )
  parser.add_argument(
    '--seed',
    action=Once,
    type=integer,
    metavar='S',
    help='Random seed of both runs (binds train.random_seed). Default: the '
    "config's, or 0 if the config sets none.",
  )
  parser.add_argument(
    '--output_dir',
    action=Once,
    type=path,
    metavar='DIR',
    help='Directory for both runs (stock/, revplus/, with their logs '
    'stock.log and revplus.log), compare.json and compare.png. '
    'Default: ~/trax/compare_<first config name>_<date>_<time>.',
  )
  parser.add_argument(
    '--nodevice_accounting',
    dest='device_accounting',
    action='store_false',
    help='Skip `estimate` on the config after both runs (by default it '
    "gives each trainer's step peak as XLA computes it, stock's "
    'included, which writes no memory log).',
  )


def add_plot_memory(commands: 'argparse._SubParsersAction') -> None:
  parser = commands.add_parser(
    'plot-memory',
    help='plot the memory log of a run',
    usage=f'{PROG} plot-memory RUN_DIR [--output=PNG]',
    description=_PLOT_MEMORY_DESCRIPTION,
    epilog=_PLOT_MEMORY_EPILOG,
  )
  parser.add_argument(
    'run_dir',
    type=path,
    metavar='RUN_DIR',
    help='Training output dir holding memory.jsonl, or the path of a '
    'memory.jsonl.',
  )
  parser.add_argument(
    '--output',
    action=Once,
    type=path,
    metavar='PNG',
    help='Path of the PNG to write, exactly (no suffix is added); a link '
    'is followed, a pipe or device written in place. Default: '
    'memory.png next to the log.',
  )


def add_estimate(commands: 'argparse._SubParsersAction') -> None:
  parser = commands.add_parser(
    'estimate',
    help='device memory of a training step, per trainer',
    usage=(
      f'{PROG} estimate --config_file=FILE.gin [--config=BINDING ...]'
      f'\n{" " * 23}[--device_memory=16GiB] [--n_devices=N] '
      f'[--json=PATH]'
    ),
    description=_ESTIMATE_DESCRIPTION,
    epilog=_ESTIMATE_EPILOG,
  )
  _add_config_flags(
    parser,
    'Gin config file; repeatable.',
    'Gin binding; repeatable, applied after the files.',
  )
  parser.add_argument(
    '--device_memory',
    action=Once,
    metavar='SIZE',
    help='Memory of one device, e.g. 16GiB, 40GB, 80GiB (units B, kB, MB, '
    'GB, KiB, MiB, GiB; whole bytes, at most 1 PiB); each trainer '
    'fits or not, and trax_revplus plans its segments to fit it, '
    'overriding (with a warning line) a budget the config sets. '
    'Default: none given.',
  )
  parser.add_argument(
    '--n_devices',
    action=Once,
    type=positive_int,
    default=1,
    metavar='N',
    help="Devices trax_revplus's trainer runs on (default: %(default)s); "
    "trax's trainers are accounted on one.",
  )
  add_compilation_cache_flags(parser)
  parser.add_argument(
    '--json',
    action=Once,
    type=path,
    metavar='PATH',
    help='Also write the figures as JSON to PATH (checked before anything '
    'is compiled; a link is followed, a pipe or device written in '
    'place; - for stdout, the table then on stderr).',
  )
