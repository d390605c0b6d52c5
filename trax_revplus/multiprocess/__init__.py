"""A training run that spans several processes (`jax.distributed`).

`trax-revplus train` with `--num_processes` (or under a cluster launcher)
joins the run before anything touches JAX, then trains as one process
would, except that the processes share a seed, stop together and log
apart. Modules, one job each:

  config      the values that place a process in the run, from the flags
              and the environment: `resolve_config` -> `DistributedConfig`.
  errors      how joining or launching fails: one line and an exit status
              (`DistributedError` and its subclasses, all `UserError`s).
  join        `initialize`: joins the run, or fails in one line.
  join_guard  keeps a blocked join to one line (deadline, signals, JAX's
              aborts).
  training    this process within the run: its index, the shared seed, its
              log file, barriers.
  ending      how the run ends: every process after the same step on a
              signal; at once, in one line, on a failure, with exit status
              4 (`EXIT_LOST_PROCESS`) for a process that lost a peer.
  launcher    `launch`: N processes of one run on this host.
  forwarding  where the launched processes' lines go: their log files, the
              terminal until one fails, then the cause's only.

Import the modules themselves: this package imports none of them, so that
`trax-revplus launch` loads neither numpy nor JAX. The CLI turns its flags
into a `DistributedConfig` (`trax_revplus.cli.distributed_flags`); nothing
here reads flags.
"""
