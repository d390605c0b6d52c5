"""`trax-revplus compare`: trains both, then the table, compare.json, the PNG.

What the two runs are and what is measured: `trax_revplus.compare`, which
runs and measures the trainings and makes the table and figures; this
module is the command around it. Before either run starts, the config is
checked as `train` checks it (`preflight`), so a setting `train` rejects
ends the command in seconds, with `train`'s line and exit status. This
process never opens JAX's backend (a TPU chip belongs to one process):
the check (which reads the device count), both runs and the accounting
each run in a process of their own, one after another
(`trax_revplus.backend`). The memory logs are read defensively: unreadable
lines are named in a warning line. compare.json and compare.png are
written safely (`output_files`).
"""

import argparse
import json
import os
import sys
import time
from typing import Sequence, TextIO

import gin

from trax_revplus import backend
from trax_revplus import output_files
from trax_revplus import trax_import
from trax_revplus.cli import gin_config
from trax_revplus.cli import output_dir as output_dirs
from trax_revplus.cli import parsed_config
from trax_revplus.cli import preflight
from trax_revplus.cli.config_flags import configs_from_flags
from trax_revplus.cli.messages import PROG
from trax_revplus.cli.messages import warning_line
from trax_revplus.errors import EXIT_OK
from trax_revplus.errors import EXIT_RUNTIME
from trax_revplus.errors import EXIT_USAGE
from trax_revplus.errors import UserError


def run(flags: argparse.Namespace) -> int:
  """Runs `trax-revplus compare` with the parsed flags.

  Returns:
    The exit status: 0 the trax_revplus run succeeded, 1 it failed.

  Raises:
    UserError: bad configs, an unusable output dir, or output dirs that
      already hold runs.
  """
  config_files, bindings = configs_from_flags(flags)
  if flags.output_dir:
    output_dirs.check_writable(os.path.expanduser(flags.output_dir))
  return compare_main(
    config_files=config_files,
    bindings=bindings,
    output_dir=flags.output_dir,
    steps=flags.steps,
    seed=flags.seed,
    device_accounting=flags.device_accounting,
    step_floor=flags.step_floor,
  )


# What the check before the runs printed, in the output dir.
CHECK_LOG = 'check.log'


def check_config(config_files: Sequence[str], bindings: Sequence[str]) -> None:
  """Checks the config as `train` will for the trax_revplus run.

  Opens JAX's backend (for the device count): `compare_main` runs it in a
  process of its own (`backend.call`).

  Raises:
    UserError: as `train` (exit status 2 for a setting it rejects).
  """
  gin_config.import_trax_quietly()
  # Here: swap imports trax, which the parent running this in a child
  # (`compare_main`) never does.
  from trax_revplus import swap  # pylint: disable=g-import-not-at-top

  try:
    gin_config.parse_configs(list(config_files), list(bindings))
    swap.activate()  # As --implementation=revplus.
    preflight.check_config()
    # The batch against the devices and batch slices, as the trainer checks
    # it at its first step: one batch of the inputs, no model built.
    jax = trax_import.jax
    n_devices = gin_config.bound_value('train.n_devices', None)
    if not isinstance(n_devices, int):
      n_devices = jax.local_device_count()
    parsed_config.check_inputs_and_batch(list(bindings), n_devices)
  finally:
    gin.clear_config()
    swap.deactivate()


def _check_fresh(run_dirs):
  """Raises UserError if a run dir holds files: train would resume there."""
  for path in run_dirs:
    if os.path.isdir(path) and os.listdir(path):
      raise UserError(
        f'{path} already holds a run (training would resume from it); '
        f'give a new --output_dir or remove it'
      )


def _remove_check_output(
  output_dir: str, check_log: str, made_output_dir: bool
) -> None:
  """Removes check.log, and the output dir if this command made it."""
  if os.path.exists(check_log):
    os.remove(check_log)
  if made_output_dir and not os.listdir(output_dir):
    os.rmdir(output_dir)


def compare_main(
  config_files: Sequence[str],
  bindings: Sequence[str],
  output_dir: str | None = None,
  steps: int | None = None,
  seed: int | None = None,
  stream: TextIO | None = None,
  device_accounting: bool = True,
  step_floor: bool = False,
) -> int:
  """Runs both trainings, prints the table, writes compare.json and the PNG.

  Args:
    config_files: list of str, .gin files, parsed in order by both runs.
    bindings: list of str, gin bindings applied after them.
    output_dir: str or None; default ~/trax/compare_<config>_<date>_<time>.
    steps: int or None; binds `train.steps` for both runs.
    seed: int or None; binds `train.random_seed` for both runs. None keeps
      the config's seed, or binds 0 if the config sets none.
    stream: file-like object for the runs' output and the table; default
      sys.stdout.
    device_accounting: bool, after the runs, run `estimate` on the config
      for each trainer's XLA-computed step peak (`compare.accounting`);
      its output goes to <output_dir>/estimate.log, its failure to one line
      of the table.
    step_floor: bool, each run measures its step's floor after its steps
      (`train --step_floor`); the table sets the median steps against it.

  Returns:
    int exit status: 0 when the trax_revplus run succeeded, 1 when it failed.

  Raises:
    UserError: the output dirs already hold runs, the config fails the
      check before the runs (`check_config`, as `train` reports it; for
      a runtime failure of the check, its output is in
      <output_dir>/check.log; for a mistake in the config, nothing is left
      in the output dir), or the device is held
      by another process.
  """
  # Imported here, not at the top: `trax_revplus.compare` imports JAX, and
  # `run` reports mistakes in the flags and paths before that.
  from trax_revplus import compare  # pylint: disable=g-import-not-at-top

  stream = stream or sys.stdout
  output_dir = os.path.abspath(
    os.path.expanduser(
      output_dir or output_dirs.default_output_dir(config_files, 'compare_')
    )
  )
  run_dirs = {k: os.path.join(output_dir, k) for k in compare.IMPLEMENTATIONS}
  _check_fresh(run_dirs.values())
  made_output_dir = not os.path.isdir(output_dir)
  os.makedirs(output_dir, exist_ok=True)

  extra = []
  if steps is not None:
    extra.append(f'train.steps = {int(steps)}')
  seed_from_config = False
  if seed is None:
    seed_from_config, config_value = compare.config_seed(config_files, bindings)
    if seed_from_config:
      seed = config_value
    else:
      seed = compare.DEFAULT_SEED
      extra.append(f'train.random_seed = {seed}')
  else:
    extra.append(f'train.random_seed = {int(seed)}')
  every = None if steps is None else max(1, int(steps) // 10)
  check_log = os.path.join(output_dir, CHECK_LOG)
  try:
    backend.call(
      f'{__name__}:check_config',
      list(config_files),
      list(bindings) + extra,
      log_path=check_log,
    )
  except UserError as e:
    if e.exit_code == EXIT_USAGE:
      # A mistake in the config: its line says all, and a run dir left
      # behind would look like a run to the next command.
      _remove_check_output(output_dir, check_log, made_output_dir)
    raise

  runs = {}
  for k in compare.IMPLEMENTATIONS:
    log_path = os.path.join(output_dir, f'{k}.log')
    command = compare.runs.run_command(
      k, config_files, list(bindings) + extra, run_dirs[k], every
    ) + (['--step_floor'] if step_floor else [])
    stream.write(
      f'{PROG} compare: training with {compare.LABELS[k]} '
      f'(output in {log_path})\n'
    )
    stream.flush()
    start = time.perf_counter()
    exit_code, output = compare.runs.run_streaming(
      command, log_path, f'[{k}] ', stream
    )
    runs[k] = compare.collect_run(
      k, exit_code, output, run_dirs[k], log_path, time.perf_counter() - start
    )

  if device_accounting:
    estimate_log = os.path.join(output_dir, compare.accounting.ESTIMATE_LOG)
    stream.write(
      f'{PROG} compare: accounting device memory with estimate '
      f'(output in {estimate_log})\n'
    )
    stream.flush()
    accounting = compare.accounting.run_estimate(
      config_files, list(bindings) + extra, output_dir
    )
  else:
    accounting = compare.accounting.skipped()

  for k in compare.IMPLEMENTATIONS:
    note = (runs[k].get('memory_log') or {}).get('unreadable_note')
    if note:
      stream.write(warning_line('compare', note) + '\n')
  report = compare.build_report(
    config_files, bindings, steps, seed, seed_from_config, runs, accounting
  )
  json_path = os.path.join(output_dir, compare.COMPARE_JSON)
  text = json.dumps(report, indent=1)
  output_files.write(json_path, lambda f: f.write(text.encode('utf-8')))
  stream.write(compare.format_table(report) + '\n')
  png_path = os.path.join(output_dir, compare.COMPARE_PNG)
  try:
    compare.plot(report, png_path)
    written = f'{json_path}, {png_path}'
  except Exception as e:  # pylint: disable=broad-except
    written = json_path
    stream.write(f'could not draw {png_path}: {type(e).__name__}: {e}\n')
  stream.write(f'wrote {written}\n')
  stream.flush()
  return EXIT_OK if runs['revplus']['status'] == 'ok' else EXIT_RUNTIME
