"""The `--help` text of each `trax-revplus` command: what it does, and the
exit statuses it ends with (`command_flags` adds the flags).

Only the standard library is needed here: `--help` answers before trax's
import.
"""

TRAIN_DESCRIPTION = """\
Trains the model a gin config describes with trax.supervised.trainer_lib.train
(the job of `python -m trax.trainer`, on current JAX). Add the line
`import trax_revplus.activate` to a config to train with trax_revplus.
Settings that cannot work (e.g. train.steps not a positive int, two settings
that exclude each other) are reported before anything is built. The output
dir is locked for the run: a second run into it stops at once. Third-party
warnings known to be harmless go to OUTPUT_DIR/train.log only."""

TRAIN_EPILOG = """\
exit status: 0 done; 1 runtime error (e.g. unwritable or busy output dir,
bad corpus files, disk full, no consistent checkpoint); 2 usage error (bad
flag, missing or unparsable config, unknown binding, a setting out of range,
a model or checkpoint that does not fit the config); 128 + N stopped by
signal N (SIGINT 130, SIGTERM 143) with a checkpoint to resume from."""

COMPARE_DESCRIPTION = """\
Trains the same config twice, one after the other, each in a fresh process
with the same seed: with stock trax (train --implementation=stock), then with
trax_revplus (--implementation=revplus). Prints a table side by side: loss
per step, max abs difference of the final weights and optimizer slots,
first-step (compile) and median step time, peak host RSS, peak device bytes
and bytes copied host-to-device and back. Writes DIR/compare.json (keys
documented in trax_revplus/compare/) and DIR/compare.png. If stock trax
cannot run the config (e.g. 2+ devices, or use_memory_efficient_trainer = 2,
on current JAX), the table says why."""

COMPARE_EPILOG = """\
exit status: 0 the trax_revplus run succeeded (even if stock failed); 1 it
failed; 2 usage error (bad flag, missing config, output dirs holding runs)."""

PLOT_MEMORY_DESCRIPTION = """\
Plots host and device memory over the steps of a run from the memory log
(RUN_DIR/memory.jsonl) that trax_revplus's trainer writes, and prints the
path of the PNG. Lines of the log that are not records are skipped, with a
warning line that counts them and names the first."""

PLOT_MEMORY_EPILOG = """\
exit status: 0 done; 1 the log is corrupt (no line is a record) or
unreadable, or the PNG could not be written (nothing is left behind); 2
usage error (bad flag, no RUN_DIR, no memory log or no records in it yet,
--output a directory)."""


ESTIMATE_DESCRIPTION = """\
Builds the config's model with trax's default Trainer, stock trax's
ReversibleSerialTrainer and trax_revplus's, compiles what one training step
of each would run (no step runs, no accelerator needed) and prints, per
trainer, the step's peak device bytes (XLA's memory analysis of its
programs, composed with what the trainer holds across each call), the host
bytes of weights + optimizer slots, the largest single program, and whether
it fits --device_memory; for trax_revplus also the segment plan it would run
under that memory (its device_memory_budget_bytes). Figures are those of
the backend the programs were compiled for, which the table names. The
least device memory trax_revplus's trainer can step in is weighed where no
plan fits, or with --least. While trax_revplus plans, a line for each plan
it weighs goes to stderr."""

ESTIMATE_EPILOG = """\
exit status: 0 done (also when a trainer cannot be built on this JAX: its
row says why); otherwise the status train ends with for the same config,
with the same line, before anything is compiled: 2 usage error (bad flag
or --device_memory, missing or unparsable config, a setting train rejects,
a batch the devices or batch slices do not divide, a model its bindings
cannot build); 1 the config's inputs cannot be read, or --json cannot be
written."""

LAUNCH_DESCRIPTION = """\
Starts N processes of one training run on this host, each `trax-revplus train`
with the flags after `--` plus --num_processes=N --process_id=I
--coordinator_address=127.0.0.1:PORT (a free port), all with one output dir
(the default one is named once, for all). Their output is forwarded line by
line, prefixed [process I], and each process's goes to
OUTPUT_DIR/launch.process<I>.log too. When one process fails, the others are
stopped (SIGTERM, then SIGKILL after the grace), and the terminal shows the
failed process's lines and one line of the launcher's, nothing more of the
others. SIGINT and SIGTERM are forwarded to all."""

LAUNCH_EPILOG = """\
example: trax-revplus launch --num_processes=2 -- \\
           --config_file=gin_configs/reformer_char_lm.gin --output_dir=DIR
exit status: 0 every process succeeded; otherwise the status of the first
process that failed (128 + N for signal N); 2 usage error."""
