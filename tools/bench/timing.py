"""Step time: one process per trainer, stepped in turns or one at a time.

Each trainer is built in a process of its own (`timing_child`). On the CPU
the parent steps them round-robin (default, stock, ours, default, ...),
one step at a time while the others wait idle, so machine load hits all
of them alike. On an accelerator (or with `--sequential`) the processes
run one at a time, each built, stepped and ended before the next starts: a
TPU chip belongs to one process, and a dedicated device is not shared
with other load. The first two steps of each are reported apart (the
first compiles; trax's default and stock trainers compile again on the
second, when their weights come back as different array types); the
median of the steps after them is the step time, of those that ran on the
plan ours settled on where some did (ours' first steps may run on a plan
ready first while its fused program compiles:
`ReversibleSerialTrainer.steps_on_ready_plan`). Each process also
reports its device's peak bytes in use (`memory_stats()`, where the
backend keeps one: not on the CPU).
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
  protocol.send(
    dict(
      build_s=time.perf_counter() - t0,
      weights_bytes=weights_bytes,
      slots_bytes=slots_bytes,
      glibc_tunables=os.environ.get('GLIBC_TUNABLES'),
    )
  )
  for line in sys.stdin:
    try:
      seconds, loss = model.step(trainer, batch, int(line))
    except Exception as e:  # pylint: disable=broad-except
      protocol.send(dict(error=_one_line(e)))
      return
    protocol.send(
      dict(
        seconds=seconds,
        loss=loss,
        chip_peak_bytes=model.chip_peak_bytes(),
        on_ready_plan=int(line) in getattr(trainer, 'steps_on_ready_plan', ()),
      )
    )


def _one_line(error):
  """`error`'s type and the first line of its message."""
  lines = str(error).strip().splitlines()
  return f'{type(error).__name__}: {lines[0] if lines else ""}'[:300]


def _start(name, t, quick):
  """Starts trainer `t`'s process on config `name`; returns (process,
  what it answered once built)."""
  cmd = protocol.command(f'--timing_child={name}:{t}')
  if quick:
    cmd.append('--quick')
  proc = subprocess.Popen(
    cmd,
    stdin=subprocess.PIPE,
    stdout=subprocess.PIPE,
    text=True,
    env=configs.child_env(t),
  )
  built = protocol.receive(proc, f'{name}:{t}')
  if 'error' in built:
    print(f'[{name}] {t} fails to build: {built["error"]}', flush=True)
  else:
    print(f'[{name}] built {t} in {built["build_s"]:.1f} s', flush=True)
  return proc, built


def _step(proc, name, t, step, r):
  """Runs step `step` in trainer `t`'s process; records it in `r`."""
  proc.stdin.write(f'{step}\n')
  proc.stdin.flush()
  done = protocol.receive(proc, f'{name}:{t}')
  if 'error' in done:
    r.update(failed_at_step=step, error=done['error'])
    print(f'[{name}] step {step} {t} fails: {done["error"]}', flush=True)
    return
  seconds, loss = done['seconds'], done['loss']
  if step == 1:
    r['first_step_s'] = seconds
  elif step == 2:
    r['second_step_s'] = seconds
  else:
    r['step_s'].append(seconds)
    if not done.get('on_ready_plan'):
      r['settled_step_s'].append(seconds)
  if done.get('on_ready_plan'):
    r['steps_on_ready_plan'].append(step)
  r['losses'].append(loss)
  r['chip_peak_bytes'] = done.get('chip_peak_bytes')
  print(
    f'[{name}] step {step} {t}: {seconds:.3f} s loss {loss:.5f}', flush=True
  )


def _end(proc):
  """Closes a trainer's stdin (it then exits) and waits for it."""
  try:
    proc.stdin.close()
  except BrokenPipeError:  # a failed trainer's process has ended
    pass
  proc.wait()


def time_config(name, trainers, n_steps, quick, sequential=False):
  """Timing of `trainers` on config `name`; returns a dict.

  Each trainer runs in a process of its own (`timing_child`). Interleaved
  (default): the processes are built one after the other, then the steps
  go round-robin, one process computing at a time. `sequential`: one
  process at a time, built, stepped and ended before the next starts.

  Args:
    name: a config name.
    trainers: `--trainers` entries.
    n_steps: measured steps after the two warm-up steps.
    quick: whether configs are scaled down (`--quick`).
    sequential: one process at a time (an accelerator: `--sequential`).

  Returns:
    {trainer: {first_step_s, second_step_s, step_s, settled_step_s,
    steps_on_ready_plan, losses, median_step_s, chip_peak_bytes,
    weights_bytes, slots_bytes, glibc_tunables, failed_at_step, error}}:
    `settled_step_s` are the measured steps not on a plan ready first
    (`steps_on_ready_plan`: every step that was, warm-ups included), and
    `median_step_s` their median (of every measured step where none is
    settled); `chip_peak_bytes` is the device's peak bytes
    in use after the process's last step (`model.chip_peak_bytes`; None on
    the CPU); a trainer that raised while building (`failed_at_step` 0)
    or stepping has `error`, its exception in one line, and takes no more
    steps; its times are None where it took none.
  """
  results = {
    t: dict(
      first_step_s=None,
      second_step_s=None,
      step_s=[],
      settled_step_s=[],
      steps_on_ready_plan=[],
      losses=[],
      chip_peak_bytes=None,
      failed_at_step=None,
      error=None,
    )
    for t in trainers
  }
  procs, built = {}, {}

  def start(t):
    procs[t], built[t] = _start(name, t, quick)
    if 'error' in built[t]:
      results[t].update(failed_at_step=0, error=built[t]['error'])

  def step_all(ts, step):
    for t in ts:
      if results[t]['error'] is None:
        _step(procs[t], name, t, step, results[t])

  try:
    if sequential:
      for t in trainers:
        start(t)
        for step in range(1, n_steps + 3):
          step_all([t], step)
        _end(procs.pop(t))
    else:
      for t in trainers:
        start(t)
      for step in range(1, n_steps + 3):
        step_all(trainers, step)
  except BaseException:
    # A failed or interrupted run must not leave children waiting on stdin.
    for proc in procs.values():
      proc.kill()
    raise
  finally:
    for proc in procs.values():
      _end(proc)
  for t in trainers:
    r = results[t]
    measured = r['settled_step_s'] or r['step_s']
    r['median_step_s'] = statistics.median(measured) if measured else None
    r['weights_bytes'] = built[t].get('weights_bytes')
    r['slots_bytes'] = built[t].get('slots_bytes')
    r['glibc_tunables'] = built[t].get('glibc_tunables')
  return results
