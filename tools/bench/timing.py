"""Step time: one process per trainer, stepped in turns by the parent.

Each trainer is built in a process of its own (`timing_child`), and the
parent steps them round-robin (default, stock, ours, default, ...), one
step at a time while the others wait idle, so machine load hits all of
them alike. The first two steps of each are reported apart (the first
compiles; trax's default and stock trainers compile again on the second,
when their weights come back as different array types); the median of the
steps after them is the step time.
"""

import os
import statistics
import subprocess
import sys
import time

from tools.bench import configs
from tools.bench import model
from tools.bench import protocol


def timing_child(spec, quick):
  """Runs in a fresh process: builds one trainer, then times each step
  whose number arrives on stdin, until stdin closes.

  Args:
    spec: 'CONFIG:TRAINER', TRAINER a `--trainers` entry.
    quick: whether the config is scaled down (`--quick`).
  """
  name, _, trainer_name = spec.partition(':')  # the variant may hold ':'
  cfg = configs.config(name, quick)
  t0 = time.perf_counter()
  trainer, weights_bytes, slots_bytes = model.build(trainer_name, cfg)
  batch = configs.batch(cfg)
  protocol.send(dict(build_s=time.perf_counter() - t0,
                     weights_bytes=weights_bytes, slots_bytes=slots_bytes,
                     glibc_tunables=os.environ.get('GLIBC_TUNABLES')))
  for line in sys.stdin:
    seconds, loss = model.step(trainer, batch, int(line))
    protocol.send(dict(seconds=seconds, loss=loss))


def time_config(name, trainers, n_steps, quick):
  """Interleaved timing of `trainers` on config `name`; returns a dict.

  Each trainer runs in a process of its own (`timing_child`), built one
  after the other; the steps then go round-robin, one process computing at
  a time.

  Args:
    name: a config name.
    trainers: `--trainers` entries.
    n_steps: measured steps after the two warm-up steps.
    quick: whether configs are scaled down (`--quick`).

  Returns:
    {trainer: {first_step_s, second_step_s, step_s, losses, median_step_s,
    weights_bytes, slots_bytes, glibc_tunables}}.
  """
  procs, built = {}, {}
  try:
    for t in trainers:
      cmd = protocol.command(f'--timing_child={name}:{t}')
      if quick:
        cmd.append('--quick')
      procs[t] = subprocess.Popen(cmd, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True,
                                  env=configs.child_env(t))
      built[t] = protocol.receive(procs[t], f'{name}:{t}')
      print(f'[{name}] built {t} in {built[t]["build_s"]:.1f} s',
            flush=True)
    results = {t: dict(first_step_s=None, second_step_s=None, step_s=[],
                       losses=[]) for t in trainers}
    for step in range(1, n_steps + 3):
      for t in trainers:
        procs[t].stdin.write(f'{step}\n')
        procs[t].stdin.flush()
        done = protocol.receive(procs[t], f'{name}:{t}')
        seconds, loss = done['seconds'], done['loss']
        r = results[t]
        if step == 1:
          r['first_step_s'] = seconds
        elif step == 2:
          r['second_step_s'] = seconds
        else:
          r['step_s'].append(seconds)
        r['losses'].append(loss)
        print(f'[{name}] step {step} {t}: {seconds:.3f} s loss {loss:.5f}',
              flush=True)
  except BaseException:
    # A failed or interrupted run must not leave children waiting on stdin.
    for proc in procs.values():
      proc.kill()
    raise
  finally:
    for proc in procs.values():
      proc.stdin.close()
      proc.wait()
  for t in trainers:
    r = results[t]
    r['median_step_s'] = statistics.median(r['step_s']) if r['step_s'] else None
    r['weights_bytes'] = built[t]['weights_bytes']
    r['slots_bytes'] = built[t]['slots_bytes']
    r['glibc_tunables'] = built[t].get('glibc_tunables')
  return results
