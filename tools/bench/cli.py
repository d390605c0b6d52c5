"""The benchmark's command-line flags.

Defined by `define_flags` rather than at import, so that the tests can
parse a command line into a `flags.FlagValues` of their own and run the
benchmark's checks in-process, leaving absl's global flags alone.
"""

import os

from absl import flags

from tools.bench import configs

# tools/bench_results, beside the entry script, as before the package.
DEFAULT_OUT_DIR = os.path.join(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'bench_results'
)


def define_flags(flag_values=flags.FLAGS, module_name=None):
  """Defines every flag of tools/bench.py on `flag_values`.

  Args:
    flag_values: the `flags.FlagValues` to define them on.
    module_name: the module they are listed under; `--help` lists only the
      main module's (`sys.argv[0]`), so the entry point names itself. None:
      this module.
  """
  fv = dict(flag_values=flag_values, module_name=module_name)
  flags.DEFINE_list(
    'configs',
    ['l6', 'l24', 'l64', 'l12'],
    'Configs to run (see CONFIGS).',
    **fv,
  )
  flags.DEFINE_list(
    'trainers',
    list(configs.TRAINERS),
    'Trainers to compare; ours+NAME=VALUE[+...] is ours with '
    'constructor arguments changed, e.g. '
    'ours+host_mmap_threshold=None (VALUE a Python literal); '
    f'NAME one of {list(configs.ENV_ARGS)} sets that environment '
    "variable (VALUE a str) in the trainer's processes "
    'instead, so that it applies from their start.',
    **fv,
  )
  flags.DEFINE_integer(
    'steps', 3, 'Measured steps per trainer after the 2 warm-up steps.', **fv
  )
  flags.DEFINE_integer(
    'memory_steps', 2, 'Steps run by each memory process.', **fv
  )
  flags.DEFINE_bool(
    'memory', True, 'Measure peak RSS in separate processes.', **fv
  )
  flags.DEFINE_integer(
    'memory_repeats',
    1,
    'Fresh processes per (config, trainer) peak RSS; the median is reported.',
    **fv,
  )
  flags.DEFINE_bool('timing', True, 'Measure step times.', **fv)
  flags.DEFINE_bool(
    'sequential',
    False,
    'Time the trainers one process at a time (each built, '
    'stepped and ended before the next starts) and report '
    "each one's device peak, as on an accelerator, where it "
    'is always so (a TPU chip belongs to one process); by '
    'default the CPU steps them in turns.',
    **fv,
  )
  flags.DEFINE_bool(
    'quick', False, 'Scale every config down (smoke run).', **fv
  )
  flags.DEFINE_string(
    'out_dir', DEFAULT_OUT_DIR, 'Where bench.json and bench.md go.', **fv
  )
  flags.DEFINE_bool(
    'update',
    False,
    'Merge into the existing bench.json: keep configs, parts '
    '(timing, memory) and memory figures of trainers not '
    'measured in this run.',
    **fv,
  )
  flags.DEFINE_bool(
    'device_memory',
    False,
    "Account each trainer's peak device bytes per step from "
    'XLA (deterministic, one process per config, no step '
    'runs) and check the device-memory targets (see '
    'device_memory_targets).',
    **fv,
  )
  flags.DEFINE_integer(
    'seq_device_memory_bytes',
    2**30,
    'Device memory of the longest-sequence target.',
    **fv,
  )
  flags.DEFINE_list(
    'seq_lengths',
    ['512', '1024', '2048', '4096', '8192'],
    'Sequence lengths tried for the longest-sequence target (l6 family).',
    **fv,
  )
  flags.DEFINE_bool(
    'estimate_main_job',
    True,
    'With --device_memory, also time `trax-revplus estimate` '
    'on the main job config.',
    **fv,
  )
  # Internal: what makes this program one of its own child processes
  # (`protocol`).
  flags.DEFINE_string(
    'memory_child',
    None,
    'Internal: CONFIG:TRAINER, run one memory measurement.',
    **fv,
  )
  flags.DEFINE_string(
    'device_memory_child',
    None,
    'Internal: JSON request of one device-memory process.',
    **fv,
  )
  flags.DEFINE_string(
    'timing_child',
    None,
    'Internal: CONFIG:TRAINER, build one trainer and run '
    'the steps numbered on stdin.',
    **fv,
  )
