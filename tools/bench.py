"""Benchmark: trax's default Trainer, stock ReversibleSerialTrainer, ours.

Measures, on ReformerLM configs (full causal self-attention, dropout 0.1,
Adam, byte vocabulary), side by side:

  * step time (seconds per step): each trainer is built in a process of its
    own; on the CPU the parent steps them round-robin (default, stock, ours,
    default, ...), one step at a time while the others wait idle, so machine
    load hits all three alike; on an accelerator (or with --sequential) the
    processes run one at a time, each built, stepped and ended before the
    next starts (a TPU chip belongs to one process, and a dedicated device
    is not shared with other load), and each reports its device's peak bytes
    in use (`memory_stats()['peak_bytes_in_use']`) beside its step times.
    The benchmark's own process opens no JAX backend: the platform comes from
    a short-lived child. The first two steps of each are reported apart
    (the first compiles; trax's default and stock trainers compile again on
    the second, when their weights come back as different array types), the
    median of the `--steps` steps after them is the step time. Each trainer
    gets a process because ours changes process-wide state: its constructor
    clears JAX's compilation caches (and sets glibc's mmap threshold where
    `host_mmap_threshold` asks for it), and it
    returns free C-allocator memory to the system (`malloc_trim`) during its
    steps; in a shared process the other trainers would run under ours'
    settings, as no user's run of them does;
  * peak host RSS above the import baseline (bytes): one fresh process per
    (config, trainer), which imports everything, resets the kernel's peak RSS
    mark (`/proc/self/clear_refs`, so import-time peaks do not count),
    records its RSS, builds the model and trainer, runs `--memory_steps`
    steps and reports its peak RSS (VmHWM in `/proc/self/status`), and the
    running peak after each step, which shows whether more steps would have
    raised it; with `--memory_repeats=N`, the median of N such processes
    (all N peaks are kept in bench.json);
  * weights and Adam slots bytes of each config, so the growth of peak RSS
    from the 6- to the 24-layer config can be compared with the bytes added.

Results go to `<out_dir>/bench.json` and `<out_dir>/bench.md` (a Markdown
table with the ratios the README quotes).

Usage:
  python tools/bench.py                      # all four configs
  python tools/bench.py --configs=l6,l64 --steps=3
  python tools/bench.py --quick              # small shapes, a smoke run
  python tools/bench.py --nomemory           # timing only
  python tools/bench.py --sequential         # one trainer process at a time,
                                             # as on an accelerator
  python tools/bench.py --configs=l6 \
      --trainers=default,stock,ours,ours+host_mmap_threshold=1048576
      # ours with a constructor argument changed, as a fourth trainer
  python tools/bench.py --configs=l6,l24 --trainers=ours,"ours+GLIBC_TUNABLES=\
'glibc.malloc.arena_max=1:glibc.malloc.mmap_threshold=1048576'"
      # ours in processes whose C allocator is set up from their start
  python tools/bench.py --configs=l6,l24 --device_memory --notiming \
      --nomemory  # device-memory figures and targets only (XLA, no steps
                  # beyond one logged step of ours per config)

With --device_memory: peak device bytes per step of each trainer (XLA's
memory analysis of the programs it runs, composed with what it holds across
each call; `trax_revplus.device_memory`), ours under a budget of stock's
own peak, the depth ratio l24 / l6, the longest l6-family sequence within
--seq_device_memory_bytes, ours' figure against its memory log's
peak_device_bytes, and the wall time of `trax-revplus estimate` on the main
job (`device_memory_targets`). The step-time targets under a budget run as
trainer variants, e.g. --trainers=stock,ours+device_memory_budget_bytes=N.

Absolute times on a shared machine vary from run to run; the ratios of one
interleaved run are the figures to read (on a dedicated accelerator, those
of one sequential run).
"""

import os
import sys

# The benchmark is the package tools/bench/ beside this script, imported as
# tools.bench: the checkout's root goes first on the path, so that it is
# found whatever the working directory. Its child processes start this
# script again (`tools.bench.protocol.ENTRY`).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tools.bench import main  # pylint: disable=g-import-not-at-top,wrong-import-position

if __name__ == '__main__':
  main.run()
