"""Progress lines, compile notices, and per-step figures for a trax Loop.

Modules, one job each:

  printer    `ProgressPrinter`, the Loop callback: progress lines, compile
             notices, the run's summary (`RunSummary`).
  line_text  the words of the printer's lines, from its figures.
  run_stats  `StepFigures`: each step's loss, time, memory and transfers;
             `run_stats.json` and its keys.
  compiles   `CompileCounter`: programs JAX compiled, from its monitoring
             events.
  eval_history the eval losses of an output directory's runs, kept across
             resumes (`eval_losses.json`).
  profile_steps `StepProfiler`, the Loop callback that writes a JAX
             profiler trace of chosen steps.

The names below are importable from `trax_revplus.progress` itself; the
gin names of the callbacks are `trax_revplus.progress.ProgressPrinter` and
`trax_revplus.progress.StepProfiler`.
"""

from trax_revplus.progress.compiles import CompileCounter
from trax_revplus.progress.printer import MAX_RECOMPILE_NOTICES
from trax_revplus.progress.printer import ProgressPrinter
from trax_revplus.progress.printer import RunSummary
from trax_revplus.progress.profile_steps import StepProfiler
from trax_revplus.progress.run_stats import peak_host_rss_bytes
from trax_revplus.progress.run_stats import RUN_STATS_FILENAME
from trax_revplus.progress.run_stats import StepFigures

__all__ = [
  'CompileCounter',
  'MAX_RECOMPILE_NOTICES',
  'peak_host_rss_bytes',
  'ProgressPrinter',
  'RUN_STATS_FILENAME',
  'RunSummary',
  'StepFigures',
  'StepProfiler',
]
