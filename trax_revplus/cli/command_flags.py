"""The flags of each `trax-revplus` command, one `add_*` each.

`parser.build` adds each command's subparser with its function here; each
flag's help stands next to it, and each command's description and exit
statuses are `help_text`'s. Flags are read by `strict_argparse`'s rules.
"""

import argparse
import re
from typing import NamedTuple

from trax_revplus.cli import help_text
from trax_revplus.cli.messages import PROG
from trax_revplus.multiprocess import launch_flags
from trax_revplus.strict_argparse import integer
from trax_revplus.strict_argparse import Once
from trax_revplus.strict_argparse import path
from trax_revplus.strict_argparse import positive_int

IMPLEMENTATIONS = ('config', 'stock', 'revplus')
# More digits than int() converts (4300); no run has that many steps.
_MAX_DIGITS = 4300


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
      f'{" " * 20}[--profile=STEPS] [--step_floor]\n'
      f'{" " * 20}[--implementation=config|stock|revplus]\n'
      f'{" " * 20}[--num_processes=N --process_id=I\n'
      f'{" " * 21}--coordinator_address=HOST:PORT]'
    ),
    description=help_text.TRAIN_DESCRIPTION,
    epilog=help_text.TRAIN_EPILOG,
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
  parser.add_argument(
    '--profile',
    action=Once,
    type=step_range,
    metavar='STEPS',
    help='Write a JAX profiler trace of these training steps, N or N-M '
    '(e.g. 3-4: the first steps compile and plan), to OUTPUT_DIR/profile: '
    "an .xplane.pb for TensorBoard's profile plugin and a "
    'perfetto_trace.json.gz for ui.perfetto.dev (see docs/accelerators.md).',
  )
  parser.add_argument(
    '--step_floor',
    action='store_true',
    help="After the last step, time the model's own arithmetic on the "
    "device: each distinct layer's forward and gradient alone at the rows "
    "of one call of the step, and the model's as one program where it "
    'fits; the summary and run_stats.json give the floor, the median step '
    'against it, and the FLOPs per step and TFLOP/s (see '
    'docs/performance.md).',
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


def add_launch(commands: 'argparse._SubParsersAction') -> None:
  parser = commands.add_parser(
    'launch',
    help='start N local processes of one training run',
    usage=f'{PROG} launch --num_processes=N -- TRAIN_FLAGS...',
    description=help_text.LAUNCH_DESCRIPTION,
    epilog=help_text.LAUNCH_EPILOG,
  )
  launch_flags.add_launch_flags(parser)


def add_compare(commands: 'argparse._SubParsersAction') -> None:
  parser = commands.add_parser(
    'compare',
    help='stock trax and trax_revplus side by side',
    usage=(
      f'{PROG} compare --config_file=FILE.gin [--config=BINDING ...]\n'
      f'{" " * 22}[--steps=N] [--seed=S] [--output_dir=DIR] '
      '[--step_floor]\n'
      f'{" " * 22}[--nodevice_accounting]'
    ),
    description=help_text.COMPARE_DESCRIPTION,
    epilog=help_text.COMPARE_EPILOG,
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
    '--step_floor',
    action='store_true',
    help="Each run times the model's own arithmetic on the device after "
    'its steps (train --step_floor); the table gives each step floor, the '
    'median step against it and the TFLOP/s.',
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
    description=help_text.PLOT_MEMORY_DESCRIPTION,
    epilog=help_text.PLOT_MEMORY_EPILOG,
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
      f'[--least] [--json=PATH]'
    ),
    description=help_text.ESTIMATE_DESCRIPTION,
    epilog=help_text.ESTIMATE_EPILOG,
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
  parser.add_argument(
    '--least',
    action='store_true',
    help="Also weigh trax_revplus's leanest plan where a plan fits (the "
    'least device memory it can step in): it compiles the leanest '
    "plans' programs too. Where no plan fits it is always weighed.",
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


class StepRange(NamedTuple):
  """--profile's steps, `first` to `last` (1-based, inclusive); printed as
  the flag is written, 'N' or 'N-M'."""

  first: int
  last: int

  def __str__(self) -> str:
    if self.first == self.last:
      return str(self.first)
    return f'{self.first}-{self.last}'


def step_range(text: str) -> StepRange:
  """--profile's value, 'N' or 'N-M' in the ASCII digits 0-9, 1 <= N <= M."""
  # [0-9], not \d: \d also matches other scripts' digits ('٣'), which
  # int() reads as well.
  found = re.fullmatch(r'([0-9]+)(?:-([0-9]+))?', text)
  if found is None or max(len(found[1]), len(found[2] or '')) > _MAX_DIGITS:
    raise argparse.ArgumentTypeError(
      f'must be a step N or steps N-M in the digits 0-9, e.g. 3-4, got {text!r}'
    )
  steps = StepRange(int(found[1]), int(found[2] or found[1]))
  if steps.first < 1:
    raise argparse.ArgumentTypeError(f'steps count from 1, got {text!r}')
  if steps.last < steps.first:
    raise argparse.ArgumentTypeError(
      f'must be steps N-M with N <= M, got {text!r}'
    )
  return steps
