"""Peak host RSS: one fresh process per (config, trainer) and repeat.

Each process imports everything the build needs, then opens a
`trax_revplus.memory.host_peak.PeakWindow` (which resets the kernel's peak
RSS mark, so import-time peaks do not count) and records its RSS as the
baseline; it builds the model and trainer, runs `--memory_steps` steps and
reports its peak RSS above that baseline, and the running peak after each
step, which shows whether more steps would have raised it. With
`--memory_repeats=N`, the median of N such processes (all N peaks kept).
"""

import json
import os
import statistics
import subprocess
import sys
import time

from trax_revplus.byte_sizes import format_bytes

from tools.bench import configs
from tools.bench import model
from tools.bench import protocol


def memory_child(spec, quick, memory_steps):
  """Runs in a fresh process: prints the peak RSS of one (config, trainer)
  as a JSON line, the last line of its stdout.

  Args:
    spec: 'CONFIG:TRAINER', TRAINER a `--trainers` entry.
    quick: whether the config is scaled down (`--quick`).
    memory_steps: steps to run.
  """
  name, _, trainer_name = spec.partition(':')  # the variant may hold ':'
  # Import everything the build needs before the baseline is taken.
  # pylint: disable=g-import-not-at-top,unused-import
  import jax  # noqa: F401
  from trax_revplus import trax_import

  trax_import.import_trax()
  import trax  # noqa: F401
  from trax import models  # noqa: F401
  from trax import optimizers  # noqa: F401
  from trax.supervised import training  # noqa: F401
  import trax_revplus  # noqa: F401
  from trax_revplus import memory
  from trax_revplus import trainer as rev_trainer  # noqa: F401

  # pylint: enable=g-import-not-at-top,unused-import
  cfg = configs.config(name, quick)
  # Ours resets the kernel's mark only with a memory log output dir, which
  # the benchmark does not give it; the window stays true either way.
  window = memory.host_peak.PeakWindow()
  peak_reset = memory.host_peak.supported()
  baseline = memory.host_rss_bytes()
  trainer, weights_bytes, slots_bytes = model.build(trainer_name, cfg)
  batch = configs.batch(cfg)
  seconds = []
  peaks_by_step = []  # the running peak after each step: shows when it settles
  for step in range(1, memory_steps + 1):
    seconds.append(model.step(trainer, batch, step)[0])
    peaks_by_step.append(window.peak_bytes() - baseline)
  peak = window.peak_bytes()
  print(
    json.dumps(
      dict(
        peak_reset=peak_reset,
        config=name,
        trainer=trainer_name,
        baseline_rss_bytes=baseline,
        peak_rss_bytes=peak,
        peak_above_baseline_bytes=peak - baseline,
        weights_bytes=weights_bytes,
        slots_bytes=slots_bytes,
        peak_above_baseline_after_step_bytes=peaks_by_step,
        glibc_tunables=os.environ.get('GLIBC_TUNABLES'),
        step_s=seconds,
      )
    )
  )


def run_memory(name, trainer_name, memory_steps, quick):
  """`memory_child` of (config `name`, trainer `trainer_name`) in a fresh
  process; returns its JSON result.

  Raises:
    RuntimeError: the process failed (its stderr's end is printed).
  """
  cmd = protocol.command(
    f'--memory_child={name}:{trainer_name}', f'--memory_steps={memory_steps}'
  )
  if quick:
    cmd.append('--quick')
  t0 = time.perf_counter()
  proc = subprocess.run(
    cmd,
    capture_output=True,
    text=True,
    check=False,
    env=configs.child_env(trainer_name),
  )
  if proc.returncode:
    print(proc.stderr[-3000:], file=sys.stderr)
    raise RuntimeError(f'memory process {name}:{trainer_name} failed')
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  print(
    f'[{name}] memory {trainer_name}: peak above baseline '
    f'{format_bytes(result["peak_above_baseline_bytes"], spec=".0f")} '
    f'({time.perf_counter() - t0:.0f} s)',
    flush=True,
  )
  return result


def run_memory_median(name, trainer_name, repeats, memory_steps, quick):
  """Median peak RSS of `repeats` fresh processes (`run_memory`).

  Returns:
    The median process's result, with `peak_above_baseline_bytes` the
    median of all, and with more than one process each one's peak
    (`peak_above_baseline_bytes_runs`) and running peaks
    (`peak_above_baseline_after_step_bytes_runs`).
  """
  runs = [
    run_memory(name, trainer_name, memory_steps, quick) for _ in range(repeats)
  ]
  if len(runs) == 1:
    return runs[0]
  peaks = [r['peak_above_baseline_bytes'] for r in runs]
  result = dict(
    sorted(runs, key=lambda r: r['peak_above_baseline_bytes'])[
      (len(runs) - 1) // 2
    ]
  )
  result.update(
    peak_above_baseline_bytes=statistics.median(peaks),
    peak_above_baseline_bytes_runs=peaks,
    peak_above_baseline_after_step_bytes_runs=[
      r['peak_above_baseline_after_step_bytes'] for r in runs
    ],
  )
  return result
