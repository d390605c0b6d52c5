"""Randomized kill test: SIGKILL `trax-revplus train` at random moments.

A shrunk main job (a 1-layer ReformerLM on 32-byte sequences, dropout on)
that saves its checkpoint set after every step is started, killed with
SIGKILL at a random moment, and started again with the same command, over
and over; a run that reaches its last step is followed by a fresh run in a
new output dir. After each kill the tool reads what a restart will load
(`trax_revplus.checkpoints.verify`, CRC-32 of every file, then the previous
set) and, after the restart, whether it resumed. At the end it prints:

  kills: SIGKILLs sent (a kill that comes after its run ended does not count);
  resumed: kills after which the same command trained on from the
    checkpoint (reached its next step or its end) rather than failing;
  steps lost: per kill, the steps the killed run had completed (printed its
    progress line for) minus the step the restart resumes from. With a
    checkpoint after every step, at most the step whose save was in
    progress: 0 or 1;
  sets found corrupt: complete sets (manifest says complete) whose files
    did not match their manifest after a kill, and resumes that found no
    good set. Interrupted installs are counted apart: they are expected.
  other sets loaded: restarts whose first step was not the one after the
    set verification chose (the current set, else `.prev`): a restart that
    loaded a mixed, damaged or other set than the verified one. 0 expected;
  final weights: for every run that reached its end, max |difference| of
    its weights and optimizer slots from an uninterrupted run of the same
    command (dropout and the data position resumed exactly: 0.0). Every
    output dir's chain of killed runs ends with a run that reaches its end,
    so every kill is covered by one of these comparisons.

Exits 0 when every kill resumed, no set was found corrupt, no restart
loaded another set than the verified one, at most one step was lost per
kill and every final difference is 0.0; else 1.

Kills land at uniformly random moments: a quarter during the start-up
(imports, building the model, loading the checkpoint), the rest during the
training steps the run has left, where the saves are; a run at its last
step also over its end (the last save, evals and summary), so it can finish.

Usage:
  python tools/kill_resume.py --kills=30 --work_dir=/tmp/kill_resume
  python tools/kill_resume.py --kills=5 --steps=12   # a quick look

Takes minutes: every restart imports trax again.
"""

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

# pylint: disable=g-import-not-at-top,wrong-import-position
from trax_revplus import checkpoints
from trax_revplus import compare
# pylint: enable=g-import-not-at-top,wrong-import-position

MAIN = os.path.join(REPO, 'gin_configs', 'reformer_char_lm.gin')
TINY = [
  'eval_steps = 1',
  'sequence_length = 32',
  'train.eval_frequency = 1000',
  'local_text_inputs.batch_size = 2',
  'local_text_inputs.eval_batch_size = 2',
  'ReformerLM.n_layers = 1',
  'ReformerLM.d_model = 16',
  'ReformerLM.d_ff = 32',
  'ReformerLM.n_heads = 2',
  'ReformerLM.d_attention_key = 8',
  'ReformerLM.d_attention_value = 8',
  'ReformerLM.dropout = 0.1',
]


def _command(output_dir, steps):
  script = os.path.join(os.path.dirname(sys.executable), 'trax-revplus')
  prefix = (
    [script]
    if os.path.exists(script)
    else [sys.executable, '-m', 'trax_revplus.cli']
  )
  bindings = TINY + [
    f'train.steps = {steps}',
    f'train.checkpoints_at = {list(range(1, steps + 1))}',
  ]
  return (
    prefix
    + [
      'train',
      f'--config_file={MAIN}',
      f'--output_dir={output_dir}',
      '--progress_every_n_steps=1',
    ]
    + [f'--config={b}' for b in bindings]
  )


class _Run:
  """One training process, its output read as it comes."""

  def __init__(self, command):
    self.start = time.monotonic()
    self.process = subprocess.Popen(
      command,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
      cwd=REPO,
    )
    self.steps = []  # Steps whose progress line was printed.
    self.step_times = []  # When each of them was read (monotonic seconds).
    self.first_step_at = None
    self.end = None  # When the process was seen to exit (monotonic seconds).
    self.stderr = ''
    self._reader = threading.Thread(target=self._read, daemon=True)
    self._reader.start()
    self._err_reader = threading.Thread(target=self._read_err, daemon=True)
    self._err_reader.start()

  def _read(self):
    for line in self.process.stdout:
      if line.startswith('step ') and '  loss ' in line:
        self.steps.append(int(line.split()[1].split('/')[0]))
        self.step_times.append(time.monotonic())
        if self.first_step_at is None:
          self.first_step_at = self.step_times[-1]

  def _read_err(self):
    self.stderr = self.process.stderr.read()

  def wait(self):
    self.process.wait()
    if self.end is None:
      self.end = time.monotonic()
    self._reader.join()
    self._err_reader.join()
    return self.process.returncode


def _resume_point(output_dir):
  """(step a restart loads, corrupt complete sets, interrupted installs)."""
  corrupt = interrupted = 0
  resume = None
  for name in ('model', 'model' + checkpoints.PREVIOUS):
    ok, manifest, reason = checkpoints.verify(output_dir, name)
    if ok:
      if resume is None:
        resume = manifest['step']
    elif manifest and manifest.get('state') == 'complete':
      corrupt += 1
      print(f'  CORRUPT {name}: {reason}', flush=True)
    elif manifest:
      interrupted += 1
  return (resume or 0), corrupt, interrupted


def _max_abs_diff(expected, got):
  """Max |difference| over weights and slots; inf if their shapes differ."""
  diffs = [compare.max_abs_diff(a, b)[0] for a, b in zip(expected, got)]
  return max((float('inf') if d is None else d for d in diffs), default=0.0)


def _final_arrays(output_dir):
  return [
    compare.read_npy_gz(os.path.join(output_dir, f'model.{kind}.npy.gz'))
    for kind in ('weights', 'opt_slots0')
  ]


def _check_first_step(run, first_step):
  """1 if `run` trained a first step other than `first_step`, else 0."""
  if not run.steps or run.steps[0] == first_step:
    return 0
  print(
    f'  OTHER SET LOADED: the restart trained step {run.steps[0]} first, '
    f'the verified set makes it step {first_step}',
    flush=True,
  )
  return 1


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--kills', type=int, default=30)
  parser.add_argument('--steps', type=int, default=40)
  parser.add_argument('--work_dir', default='/tmp/kill_resume')
  parser.add_argument('--seed', type=int, default=0)
  args = parser.parse_args()
  rng = random.Random(args.seed)
  shutil.rmtree(args.work_dir, ignore_errors=True)
  os.makedirs(args.work_dir)

  print('reference: an uninterrupted run', flush=True)
  reference_dir = os.path.join(args.work_dir, 'reference')
  reference = _Run(_command(reference_dir, args.steps))
  if reference.wait() != 0:
    sys.exit(f'the uninterrupted run failed:\n{reference.stderr[-3000:]}')
  setup_seconds = reference.first_step_at - reference.start
  # From the last progress line to the process's exit: the last save, the
  # evals and the summary. A run at its last step is also killed over it, so
  # that it is not always killed in that step's save and can finish.
  tail_seconds = reference.end - reference.step_times[-1]
  # Seconds per step (the save included), from its progress lines.
  times = reference.step_times
  step_seconds = (times[-1] - times[0]) / max(len(times) - 1, 1)
  expected = _final_arrays(reference_dir)

  kills = resumed = corrupt_sets = interrupted_installs = no_resume = 0
  other_sets_loaded = 0
  lost = []
  final_diffs = []
  # Kills whose restart has not yet trained a step (or failed).
  pending = 0
  run_number = 0
  output_dir = None
  resume = 0
  while kills < args.kills or pending:
    if output_dir is None:
      run_number += 1
      output_dir = os.path.join(args.work_dir, f'run{run_number}')
      resume = 0
    run = _Run(_command(output_dir, args.steps))
    first_step = resume + 1  # What the verified set makes the next step.
    if kills < args.kills:
      during_setup = rng.random() < 0.25
      if during_setup:
        delay = rng.uniform(0, setup_seconds)
      else:
        while run.first_step_at is None and run.process.poll() is None:
          time.sleep(0.01)
        # Over the steps this run has left to train; at its last step also
        # over its end, so that it can finish.
        last = tail_seconds if resume >= args.steps - 1 else 0.0
        delay = rng.uniform(0, step_seconds * (args.steps - resume) + last)
      base = run.start if during_setup else (run.first_step_at or run.start)
      while run.process.poll() is None and time.monotonic() < base + delay:
        time.sleep(0.005)
      if run.process.poll() is None:
        run.process.kill()
        run.wait()
        other_sets_loaded += _check_first_step(run, first_step)
        kills += 1
        if run.steps:  # The restarts before it resumed.
          resumed += pending
          pending = 0
        pending += 1
        completed = max(run.steps, default=None)
        resume, corrupt, interrupted = _resume_point(output_dir)
        corrupt_sets += corrupt
        interrupted_installs += interrupted
        where = 'in start-up'
        if completed is not None:
          lost.append(completed - resume)
          where = f'after step {completed}, {completed - resume} lost'
        print(
          f'kill {kills} {where}; a restart resumes from step {resume}'
          f'{"; an install was interrupted" if interrupted else ""}',
          flush=True,
        )
        continue
    code = run.wait()
    other_sets_loaded += _check_first_step(run, first_step)
    if code != 0 and not run.steps:
      no_resume += pending
      print(
        f'  NOT RESUMED (exit {code}): {run.stderr.strip().splitlines()[-1:]}',
        flush=True,
      )
    else:
      resumed += pending
    pending = 0
    if code != 0:
      sys.exit(f'a run failed (exit {code}):\n{run.stderr[-3000:]}')
    got = _final_arrays(output_dir)
    diff = _max_abs_diff(expected, got)
    final_diffs.append(diff)
    print(
      f'run {run_number} finished; final weights and slots vs the '
      f'uninterrupted run: max abs diff {diff}',
      flush=True,
    )
    output_dir = None

  print('\n== kill test ==')
  print(f'kills               {kills}')
  print(f'resumed             {resumed} (not resumed: {no_resume})')
  counts = {n: lost.count(n) for n in sorted(set(lost))}
  print(
    f'steps lost          max {max(lost, default=0)}; per kill '
    f'{json.dumps(counts)} (kills during start-up: {kills - len(lost)})'
  )
  print(
    f'sets found corrupt  {corrupt_sets} (interrupted installs, '
    f'expected: {interrupted_installs})'
  )
  print(
    f'other sets loaded   {other_sets_loaded} (restarts whose first '
    f'step was not the one after the verified set)'
  )
  print(
    f'final weights       {len(final_diffs)} runs finished; max abs diff '
    f'from the uninterrupted run '
    f'{max(final_diffs) if final_diffs else "n/a"}'
  )
  ok = (
    resumed == kills
    and not no_resume
    and corrupt_sets == 0
    and other_sets_loaded == 0
    and max(lost, default=0) <= 1
    and all(d == 0.0 for d in final_diffs)
  )
  sys.exit(0 if ok else 1)


if __name__ == '__main__':
  np.seterr(all='ignore')
  main()
