"""The benchmark behind docs/performance.md; run it as `python tools/bench.py`.

Modules, one job each (tools/bench.py's docstring says what is measured):

  cli             the flags (`define_flags`).
  configs         model configs and `--trainers` specs: parsing, checks.
  model           builds the model under each trainer; runs one step.
  protocol        child processes: their command line and result lines.
  timing          step time: one process per trainer, stepped in turns
                  (one at a time on an accelerator).
  host_memory     peak host RSS: a fresh process per (config, trainer).
  device_account  device memory of built trainers (child side).
  device_targets  device-memory figures per config and their targets.
  summary         ratios, target checks, depth scaling.
  markdown        the tables of bench.md.
  results         bench.json and bench.md: new, merged (--update), saved.
  main            checks the flags, runs the parts (or a child).
"""
