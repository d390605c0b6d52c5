"""One gin config, stock trax versus trax_revplus: runs, figures, table, PNG.

`trax-revplus compare` (`trax_revplus.cli.compare`) trains the config
twice, one run after the other, each in a fresh process (`python -m
trax_revplus.cli train`): first with stock trax (`--implementation=stock`),
then with trax_revplus (`--implementation=revplus`), with the same
bindings, the same number of steps and the same seed. Both runs are
measured by the same code, `trax_revplus.progress.ProgressPrinter`, which
writes each run's
`run_stats.json`. The comparison is printed as a table and written to
`<output_dir>/compare.json` and `<output_dir>/compare.png`.

Files under `output_dir`:
  stock/, revplus/: the two training output dirs (checkpoints, train.log,
    run_stats.json; revplus/ also memory.jsonl).
  check.log: what the check of the config before the runs printed.
  stock.log, revplus.log: what each training process printed.
  estimate.json, estimate.log: the device accounting (`accounting`).
  compare.json: the figures below.
  compare.png: loss and step time per step, host and device memory per step
    (plus the trax_revplus memory log's per-phase records).

Keys of `compare.json` (sizes in bytes, times in seconds, losses in nats per
token for cross-entropy):
  config_files (list of str), bindings (list of str): the user's config.
  steps (int or null): the `train.steps` bound for both runs; null keeps the
    config's.
  seed (int or null): the `train.random_seed` both runs used: bound by
    compare, or the config's (null if the config binds something other than
    a literal, e.g. a macro).
  seed_from_config (bool): the config set the seed and compare left it.
  runs: {'stock': RUN, 'revplus': RUN}, where RUN has
    status (str): 'ok' or 'failed'.
    exit_code (int): the training process's exit status (negative: killed
      by that signal).
    error (str or null): why it failed, the last error line it printed.
    output_dir (str), log (str): its output dir and printed output.
    wall_seconds (float): wall time of the whole process (imports included).
    trainer (str or null), reversible_layers (str or null): the classes that
      ran, from its `run_stats.json` (named by `trax_revplus.run_classes`, as
      its summary and memory log name them).
    trainer_fix (str or null): what of stock's trainer was changed for
      current JAX (the stock baseline: its Loop's RNG on the step's
      device), from its `run_stats.json`; null for trax_revplus.
    memory_log (dict or null): the peaks of its memory log
      (`memory.jsonl`, trax_revplus's trainer only; `memory.peaks`):
      host_peak_bytes (the true peak RSS over the steps, before and after
      them), device_bytes_peak (the largest device bytes in use a record
      saw, inside the steps), peak_device_bytes (the device peak XLA's
      figures give, where the trainer writes it; else null), records (int).
      The table takes its peaks from here, and from `stats` for a run
      without a memory log.
    stats (dict or null): its `run_stats.json` (keys documented in
      `trax_revplus.progress`): per step `steps`, `loss`, `step_seconds`,
      `host_rss_bytes`, `device_bytes_in_use`, `h2d_bytes`, `d2h_bytes`, and
      `first_step_seconds` (includes compilation), `median_step_seconds`
      (median over all steps but the first), `peak_host_rss_bytes`,
      `peak_device_bytes`, `total_h2d_bytes`, `total_d2h_bytes` (null where
      the trainer does not count transfers: stock trax).
  device_accounting: each trainer's step peak as XLA computes it, from
    `trax-revplus estimate` on the same config after both runs (keys in
    `trax_revplus.compare.accounting`).
  xla_peaks: {'stock': PEAK, 'revplus': PEAK}, the table's "peak device,
    XLA" row: for each side the trainer it ran and that trainer's step peak
    (`accounting.xla_peak`): trainer ('default' for trax's default
    `Trainer`, 'stock', 'revplus', or null), peak_device_bytes (int or
    null; null for a failed run), source ('memory_log': trax_revplus's
    trainer records it; 'estimate'; or null).
  loss_max_abs_diff (float or null): max over common steps of |stock loss -
    trax_revplus loss|; null unless both runs recorded losses.
  loss_steps_compared (int).
  final_weights, final_slots: {'max_abs_diff': float or null, 'n_arrays':
    int or null, 'reason': str or null}: max |stock - trax_revplus| over all
    elements of the final checkpoints' flat weights
    (`model.weights.npy.gz`) and optimizer slots (`model.opt_slots0.npy.gz`);
    `reason` says why there is no figure (a run failed, a file is missing,
    the array lists differ in length or shape).
  final_weights_note (str or null): where the final weights differ by more
    than `exactness.TOLERANCE`, the line saying which plan dimension of the
    trax_revplus run (its plans.json) changed stock's float32 summation
    order and the setting that runs stock's order; else null.

Exit status: 0 when the trax_revplus run succeeded (also when stock failed:
the table says why), 1 when the trax_revplus run failed, 2 on a usage error
(e.g. output dirs that already hold runs).
"""

# The parts, one job each: `seed` (the seed both runs use), `runs` (the
# training processes and their entries), `figures` (checkpoint differences,
# the report), `exactness` (the line explaining a final weight difference
# from stock's), `table` (the printed table), `png` (compare.png); `common`
# holds what they share. The command that runs them in order is
# `trax_revplus.cli.compare`. The names below are importable from
# `trax_revplus.compare` itself.
from trax_revplus.compare import accounting
from trax_revplus.compare.common import COMPARE_JSON
from trax_revplus.compare.common import COMPARE_PNG
from trax_revplus.compare.common import IMPLEMENTATIONS
from trax_revplus.compare.common import LABELS
from trax_revplus.compare.common import Report
from trax_revplus.compare.common import Run
from trax_revplus.compare.common import RUN_STATS_FILENAME
from trax_revplus.compare.figures import build_report
from trax_revplus.compare.figures import checkpoint_diff
from trax_revplus.compare.figures import max_abs_diff
from trax_revplus.compare.figures import read_npy_gz
from trax_revplus.compare.png import plot
from trax_revplus.compare.runs import collect_run
from trax_revplus.compare.runs import failure_reason
from trax_revplus.compare.seed import config_seed
from trax_revplus.compare.seed import DEFAULT_SEED
from trax_revplus.compare.table import format_table

__all__ = [
  'accounting',
  'build_report',
  'checkpoint_diff',
  'collect_run',
  'COMPARE_JSON',
  'COMPARE_PNG',
  'config_seed',
  'DEFAULT_SEED',
  'failure_reason',
  'format_table',
  'IMPLEMENTATIONS',
  'LABELS',
  'max_abs_diff',
  'plot',
  'read_npy_gz',
  'Report',
  'Run',
  'RUN_STATS_FILENAME',
]
