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
  try:
    trainer, weights_bytes, slots_bytes = model.build(trainer_name, cfg)
  except Exception as e:  # pylint: disable=broad-except
    # A trainer that cannot train this model is a result, not a crash.
    protocol.send(dict(error=_one_line(e)))
    return
  batch = configs.batch(cfg)
  protocol.send(dict(build_s=time.perf_counter() - t0,
                     weights_bytes=weights_bytes, slots_bytes=slots_bytes,
                     glibc_tunables=os.environ.get('GLIBC_TUNABLES')))
  for line in sys.stdin:
    try:
      seconds, loss = model.step(trainer, batch, int(line))
    except Exception as e:  # pylint: disable=broad-except
      protocol.send(dict(error=_one_line(e)))
      return
    protocol.send(dict(seconds=seconds, loss=loss))


def _one_line(error):
  """`error`'s type and the first line of its message."""
  lines = str(error).strip().splitlines()
  return f'{type(error).__name__}: {lines[0] if lines else ""}'[:300]


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
    weights_bytes, slots_bytes, glibc_tunables, failed_at_step, error}}:
    a trainer that raised while building (`failed_at_step` 0) or stepping
    has `error`, its exception in one line, and takes no more steps; its
    times are None where it took none.
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
      if 'error' in built[t]:
        print(f'[{name}] {t} fails to build: {built[t]["error"]}',
              flush=True)
      else:
        print(f'[{name}] built {t} in {built[t]["build_s"]:.1f} s',
              flush=True)
    results = {t: dict(first_step_s=None, second_step_s=None, step_s=[],
                       losses=[], failed_at_step=None, error=None)
               for t in trainers}
    for t in trainers:
      if 'error' in built[t]:
        results[t].update(failed_at_step=0, error=built[t]['error'])
    for step in range(1, n_steps + 3):
      for t in trainers:
        if results[t]['error'] is not None:
          continue
        procs[t].stdin.write(f'{step}\n')
        procs[t].stdin.flush()
        done = protocol.receive(procs[t], f'{name}:{t}')
        if 'error' in done:
          results[t].update(failed_at_step=step, error=done['error'])
          print(f'[{name}] step {step} {t} fails: {done["error"]}',
                flush=True)
          continue
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
      try:
        proc.stdin.close()
      except BrokenPipeError:  # a failed trainer's process has ended
        pass
      proc.wait()
  for t in trainers:
    r = results[t]
    r['median_step_s'] = statistics.median(r['step_s']) if r['step_s'] else None
    r['weights_bytes'] = built[t].get('weights_bytes')
    r['slots_bytes'] = built[t].get('slots_bytes')
    r['glibc_tunables'] = built[t].get('glibc_tunables')
  return results
