"""End-to-end check of multi-process training: launch, resume, a killed process.

Runs the main job (gin_configs/reformer_char_lm.gin) with `trax-revplus`:

  1. `launch --num_processes=2` for --steps steps into a fresh output dir:
     exit 0, one checkpoint set (model.*, and model.prev.* before it) whose
     files match its manifest, at the last step; only process 0's log is
     train.log, process 1's lines in train.process1.log are marked
     `process 1: `; a summary from each process; no traceback and no JAX
     deprecation warning in the output or the logs;
  2. resumes copies of that dir for --resume_steps more steps, once with 1
     process and once with 2 (launch): both continue from the checkpoint's
     step, and their final weights agree (same global batch, no dropout);
  3. starts 2 processes by hand (not through launch, which would stop the
     survivor itself) on another copy, SIGKILLs process 1 once process 0 has
     run a few steps, and checks that process 0 ends within the heartbeat
     bound with one error line and no traceback, and that the last
     checkpoint set is intact.

Prints one line per check and a JSON summary; exit status 0 when all pass.

Usage:
  python tools/multiprocess_smoke.py --work_dir=/tmp/mp_smoke
  python tools/multiprocess_smoke.py --tiny   # a 1-layer model, quicker

Takes minutes: every run imports trax (~20-60 s on a busy machine).
"""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _REPO)

from trax_revplus.multiprocess import launcher  # pylint: disable=g-import-not-at-top

CONFIG = os.path.join(_REPO, 'gin_configs', 'reformer_char_lm.gin')
TINY = [
  'eval_steps = 1',
  'local_text_inputs.batch_size = 2',
  'local_text_inputs.eval_batch_size = 2',
  'ReformerLM.n_layers = 1',
  'ReformerLM.d_model = 16',
  'ReformerLM.d_ff = 32',
  'ReformerLM.n_heads = 2',
  'ReformerLM.d_attention_key = 8',
  'ReformerLM.d_attention_value = 8',
  'sequence_length = 32',
]


def cli():
  return [sys.executable, '-m', 'trax_revplus.cli']


def train_flags(output_dir, steps, bindings):
  return [
    f'--config_file={CONFIG}',
    f'--output_dir={output_dir}',
    '--progress_every_n_steps=1',
  ] + [f'--config={b}' for b in bindings + [f'train.steps = {steps}']]


def cpu_env(n_devices=None):
  """This environment for a CPU-only run with `n_devices` CPU devices per
  process (XLA's default, one, when None)."""
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONUNBUFFERED='1')
  flags = [
    f
    for f in env.get('XLA_FLAGS', '').split()
    if 'xla_force_host_platform_device_count' not in f
  ]
  if n_devices is not None:
    flags.append(f'--xla_force_host_platform_device_count={n_devices}')
  env['XLA_FLAGS'] = ' '.join(flags)
  return env


def run(command, log):
  """Runs `command`, its output to `log`; returns (exit status, seconds)."""
  start = time.time()
  with open(log, 'w') as f:
    rc = subprocess.call(
      command, stdout=f, stderr=subprocess.STDOUT, env=cpu_env(), cwd=_REPO
    )
  return rc, time.time() - start


def manifest_step(directory):
  # Imports trax (tens of seconds): only once there is a set to read, so
  # that tools/multiprocess_step_time.py can share this module's helpers.
  from trax_revplus import checkpoints  # pylint: disable=g-import-not-at-top

  ok, manifest, reason = checkpoints.verify(directory, 'model')
  return (manifest or {}).get('step') if ok else f'bad set: {reason}'


def final_weights(directory):
  """The flat weights and optimizer slots of set `model` in `directory`."""
  import gzip  # pylint: disable=g-import-not-at-top

  arrays = []
  for name in ('model.weights.npy.gz', 'model.opt_slots0.npy.gz'):
    with gzip.open(os.path.join(directory, name), 'rb') as f:
      while True:
        try:
          arrays.append(np.load(f, allow_pickle=False))
        except Exception:  # pylint: disable=broad-except
          break  # trax's np_from_file reads to the end the same way.
  return arrays


def max_diff(a, b):
  assert len(a) == len(b) and a
  return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))


def check(results, name, ok, detail):
  results[name] = {'ok': bool(ok), 'detail': detail}
  print(f'{"PASS" if ok else "FAIL"} {name}: {detail}', flush=True)


def kill_check(results, work, base, args, bindings):
  """2 processes by hand; SIGKILL process 1 mid-run; process 0 must end."""
  directory = os.path.join(work, 'killed')
  shutil.copytree(base, directory)
  steps = args.steps + 1000  # Far beyond: the kill comes first.
  address = f'127.0.0.1:{launcher.free_port()}'
  procs, logs = [], []
  for i in range(2):
    log = os.path.join(work, f'killed.process{i}.log')
    logs.append(log)
    procs.append(
      subprocess.Popen(
        cli()
        + ['train']
        + train_flags(directory, steps, bindings)
        + [
          '--num_processes=2',
          f'--process_id={i}',
          f'--coordinator_address={address}',
          f'--heartbeat_timeout_seconds={args.heartbeat_timeout_seconds}',
        ],
        stdout=open(log + '.out', 'w'),
        stderr=open(log, 'w'),
        env=cpu_env(),
        cwd=_REPO,
      )
    )
  target = args.steps + 3
  while procs[0].poll() is None:
    with open(logs[0] + '.out') as f:
      if re.search(rf'\bstep {target}\b', f.read()):
        break
    time.sleep(0.5)
  progress = open(logs[0] + '.out').read()
  procs[1].send_signal(signal.SIGKILL)
  killed_at = time.time()
  procs[1].wait()
  bound = args.heartbeat_timeout_seconds + 60
  try:
    rc = procs[0].wait(timeout=bound)
    seconds = time.time() - killed_at
  except subprocess.TimeoutExpired:
    procs[0].kill()
    rc, seconds = None, None
  stderr = open(logs[0]).read()
  errors = [l for l in stderr.splitlines() if ': error: ' in l]
  # Status 4 (trax_revplus.errors.EXIT_LOST_PROCESS) from the failed
  # collective; JAX may abort it first (SIGABRT) when its heartbeat ends the
  # wait.
  check(
    results,
    'kill: process 0 ends in bounded time',
    rc not in (None, 0) and seconds is not None,
    f'exit {rc} after {seconds and round(seconds, 1)} s (bound {bound} s)',
  )
  check(
    results,
    'kill: one error line, no traceback',
    len(errors) == 1 and 'Traceback' not in stderr,
    errors[0] if errors else stderr[-300:],
  )
  step = manifest_step(directory)
  check(
    results,
    'kill: last checkpoint set intact',
    isinstance(step, int) and step >= args.steps,
    f'set at step {step}; progress seen: {progress.count("step ")} lines',
  )


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--work_dir', default='/tmp/multiprocess_smoke')
  parser.add_argument('--steps', type=int, default=20)
  parser.add_argument('--resume_steps', type=int, default=5)
  parser.add_argument('--tiny', action='store_true')
  parser.add_argument('--heartbeat_timeout_seconds', type=int, default=30)
  args = parser.parse_args()
  bindings = list(TINY) if args.tiny else []
  bindings.append(f'train.eval_frequency = {args.steps}')
  work = args.work_dir
  shutil.rmtree(work, ignore_errors=True)
  os.makedirs(work)
  results = {}

  base = os.path.join(work, 'base')
  rc, seconds = run(
    cli()
    + ['launch', '--num_processes=2', '--']
    + train_flags(base, args.steps, bindings),
    os.path.join(work, 'base.log'),
  )
  sets = sorted(n for n in os.listdir(base) if n.endswith('.manifest.json'))
  check(
    results,
    'launch 2 processes',
    rc == 0 and manifest_step(base) == args.steps,
    f'exit {rc} in {seconds:.0f} s, set at step {manifest_step(base)}, '
    f'manifests {sets}',
  )
  check(
    results,
    'one log per process',
    os.path.exists(os.path.join(base, 'train.log'))
    and os.path.exists(os.path.join(base, 'train.process1.log')),
    'train.log, train.process1.log',
  )
  output = open(os.path.join(work, 'base.log')).read()
  check(
    results,
    'a summary from each process, no traceback',
    all(f'[process {i}] == summary ==' in output for i in (0, 1))
    and 'Traceback' not in output,
    'base.log',
  )
  logs = [output] + [
    open(os.path.join(base, n)).read()
    for n in ('train.log', 'train.process1.log')
    if os.path.exists(os.path.join(base, n))
  ]
  # trax's Loop calls jax.host_count() and jit(..., device=...), which JAX
  # deprecates; activate() binds trax_revplus.compat's versions instead.
  check(
    results,
    'no deprecation warning',
    not any('deprecat' in text.lower() for text in logs),
    'output and train logs',
  )
  process1_lines = [l for l in logs[-1].splitlines() if l.strip()]
  check(
    results,
    "process 1's log lines marked",
    process1_lines and all(l.startswith('process 1: ') for l in process1_lines),
    f'{len(process1_lines)} lines of train.process1.log',
  )

  total = args.steps + args.resume_steps
  weights = {}
  for n in (1, 2):
    directory = os.path.join(work, f'resumed{n}')
    shutil.copytree(base, directory)
    command = (
      cli()
      + (['launch', f'--num_processes={n}', '--'] if n > 1 else ['train'])
      + train_flags(directory, total, bindings)
    )
    log = os.path.join(work, f'resumed{n}.log')
    rc, seconds = run(command, log)
    text = open(log).read()
    resumed = f'{total} ({args.resume_steps} in this run)' in text
    check(
      results,
      f'resume with {n} process(es)',
      rc == 0 and resumed and manifest_step(directory) == total,
      f'exit {rc} in {seconds:.0f} s, continued from step {args.steps}: '
      f'{resumed}, set at step {manifest_step(directory)}',
    )
    if rc == 0:
      weights[n] = final_weights(directory)
  if len(weights) == 2:
    diff = max_diff(weights[1], weights[2])
    check(
      results,
      'resumed weights agree (1 vs 2 processes)',
      diff < 1e-4,
      f'max |diff| {diff:.2e}',
    )
  kill_check(results, work, base, args, bindings)
  print(json.dumps(results))
  return 0 if all(r['ok'] for r in results.values()) else 1


if __name__ == '__main__':
  sys.exit(main())
