"""The benchmark's main: checks the flags, runs each part, saves after each.

The same program is the parent and, with an internal flag, each of the
child processes the parent starts (`protocol`).
"""

import json
import os
import sys

from absl import app
from absl import flags
from trax_revplus import backend
from trax_revplus.errors import UserError

from tools.bench import cli
from tools.bench import configs
from tools.bench import device_account
from tools.bench import device_targets
from tools.bench import host_memory
from tools.bench import results as results_lib
from tools.bench import timing


def run():
  """Entry point: defines the flags, parses the command line, runs `main`."""
  cli.define_flags(flags.FLAGS, module_name=sys.argv[0])
  app.run(main)


def main(argv):
  del argv  # absl has parsed it into flags.FLAGS
  bench(flags.FLAGS, sys.argv)


def run_child(opts):
  """Runs the child an internal flag asks for; False when none does."""
  if opts.device_memory_child:
    device_account.device_memory_child(json.loads(opts.device_memory_child))
  elif opts.memory_child:
    host_memory.memory_child(opts.memory_child, opts.quick, opts.memory_steps)
  elif opts.timing_child:
    timing.timing_child(opts.timing_child, opts.quick)
  else:
    return False
  return True


def check(opts):
  """Checks `--configs` and `--trainers` before anything is measured.

  Raises:
    app.UsageError: an unknown config or trainer, or a trainer argument
      that is not valid (`configs.check_trainers`).
  """
  try:
    configs.check_configs(opts.configs)
    configs.check_trainers(opts.trainers)
  except ValueError as e:
    raise app.UsageError(str(e)) from None


def bench(opts, argv):
  """Runs the benchmark `opts` asks for (or one child of it).

  Writes bench.json and bench.md (`results`) into `opts.out_dir` after each
  part, and prints bench.md at the end. This process opens no JAX backend:
  the platform comes from a child (`trax_revplus.backend.probe`), and
  every measurement runs in children of its own, one after another where
  the platform is an accelerator or `opts.sequential` asks for it.

  Args:
    opts: the parsed flags (`cli.define_flags`).
    argv: the command line, program first, recorded as the run's command.

  Raises:
    app.UsageError: a wrong flag (`check`), before `opts.out_dir` is
      created.
    SystemExit: the device cannot be opened (e.g. another process holds
      it), in one line.
  """
  if run_child(opts):
    return
  check(opts)
  try:
    # In a child: the children that time and measure need the device, and
    # a TPU chip belongs to one process.
    device = backend.probe()
  except UserError as e:
    sys.exit(f'bench: {e}')
  # One process at a time on an accelerator: it is not shared with other
  # load, and a TPU chip takes one process.
  sequential = opts.sequential or device['platform'] != 'cpu'
  results = results_lib.new(opts, argv, device)
  os.makedirs(opts.out_dir, exist_ok=True)
  json_path, md_path = results_lib.paths(opts.out_dir, opts.quick)
  if opts.update and os.path.exists(json_path):
    with open(json_path) as f:
      results_lib.merge_previous(results, json.load(f), opts)
  save = lambda: results_lib.save(results, json_path, md_path)

  for name in opts.configs:  # every table row names its config
    results['configs'].setdefault(name, {})['config'] = configs.config(
      name, opts.quick
    )
  if opts.device_memory:
    results['device_memory'] = device_targets.device_memory_targets(
      opts.configs,
      opts.quick,
      opts.seq_device_memory_bytes,
      opts.seq_lengths,
      opts.estimate_main_job,
    )
    save()
  for name in opts.configs:
    if opts.timing:
      results['configs'][name]['timing'] = timing.time_config(
        name, opts.trainers, opts.steps, opts.quick, sequential
      )
      results['configs'][name]['timing_mode'] = (
        'sequential' if sequential else 'interleaved'
      )
      save()
    if opts.memory:
      memory = results['configs'][name].setdefault('memory', {})
      memory.update(
        {
          t: host_memory.run_memory_median(
            name, t, opts.memory_repeats, opts.memory_steps, opts.quick
          )
          for t in opts.trainers
        }
      )
      save()
  save()
  with open(md_path) as f:
    print(f.read())
