"""End-to-end checks of how `trax-revplus` commands end, as a user sees it.

Real processes of the tiny main job (gin_configs/reformer_char_lm.gin with
a 1-layer model), too long for the test suite:

  1. SIGINT to `train` during its steps: exit status 130; a warning line
     in train's format (no raw absl line) says after which step it stops,
     with its checkpoint, and the step the same command resumes from; the
     last line is the one-line reason, with that checkpoint and step; no
     absl line after it.
  2. SIGTERM to `launch` of 2 processes during their steps: exit status
     143, the last line is the launcher's, no absl line anywhere.
  3. `launch` of 2 processes when process 1 is killed while starting: the
     terminal shows the launcher's line and nothing of process 0 after the
     failure (no start-up chatter, no JAX abort); process 0 stops on
     SIGTERM within the grace (ends with 143, not SIGKILL).

The suite covers the rest of the command's ends: the stock twin's training
through `train` (tests/cli/test_cli_runs.py::
test_stock_config_trains_through_the_cli, and the main job's in a fresh
process there), a mistake in a binding (tests/cli/test_cli.py,
tests/cli/test_config_errors.py) and one line from a fresh `train` process
after it imported trax and parsed its config (tests/cli/
test_busy_device.py).

Prints one PASS or FAIL line per check; exit status 0 when all pass, 1
otherwise.

Usage:
  python tools/cli_smoke.py [--work_dir=DIR]

Takes minutes: each process imports trax (~20-60 s on a busy machine).
"""

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import psutil

from smoke_checks import Checks

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CONFIG = os.path.join(_REPO, 'gin_configs', 'reformer_char_lm.gin')
_TINY = [
  'train.steps = 2000',
  'train.eval_frequency = 1000',
  'sequence_length = 32',
  'eval_steps = 1',
  'local_text_inputs.batch_size = 2',
  'local_text_inputs.eval_batch_size = 2',
  'ReformerLM.n_layers = 1',
  'ReformerLM.d_model = 16',
  'ReformerLM.d_ff = 32',
  'ReformerLM.n_heads = 2',
  'ReformerLM.d_attention_key = 8',
  'ReformerLM.d_attention_value = 8',
]
_CLI = [sys.executable, '-m', 'trax_revplus.cli']
# A generous bound for a step to show up or a process to start here.
_PATIENCE_SECONDS = 900


def _train_flags(output_dir, config=_CONFIG, bindings=None):
  return [
    f'--config_file={config}',
    f'--output_dir={output_dir}',
    '--progress_every_n_steps=1',
  ] + [f'--config={b}' for b in (_TINY if bindings is None else bindings)]


def _start(args, out_path):
  """Starts a command with its stdout to `out_path`, stderr piped."""
  out = open(out_path, 'w')  # pylint: disable=consider-using-with
  return subprocess.Popen(
    args,
    stdout=out,
    stderr=subprocess.PIPE,
    text=True,
    cwd=_REPO,
    env=dict(os.environ, PYTHONUNBUFFERED='1'),
  )


def _wait_for(path, text, proc):
  """Waits until `text` appears in the file at `path` (True) or `proc`
  ended or the patience ran out (False)."""
  deadline = time.monotonic() + _PATIENCE_SECONDS
  while time.monotonic() < deadline and proc.poll() is None:
    with open(path) as f:
      if text in f.read():
        return True
    time.sleep(0.2)
  return False


def _absl_lines(err):
  """Lines absl or C++ logging wrote raw (e.g. 'INFO:absl:...',
  'W1203 12:00:00.1 ... interrupt.py:93] ...'), prefixed or not."""
  raw = re.compile(
    r'^(\[process \d+\] )?([IWEF]\d{4} |INFO:absl|'
    r'WARNING:absl)'
  )
  return [l for l in err.splitlines() if raw.match(l)]


def _sigint_to_train(checks, work):
  out_path = os.path.join(work, 'train.out')
  proc = _start(
    _CLI + ['train'] + _train_flags(os.path.join(work, 'run')), out_path
  )
  if not checks.check(
    'train reaches step 3', _wait_for(out_path, 'step 3/', proc)
  ):
    proc.kill()
    print(proc.communicate()[1][-3000:], file=sys.stderr)
    return
  proc.send_signal(signal.SIGINT)
  _, err = proc.communicate(timeout=_PATIENCE_SECONDS)
  lines = err.strip().splitlines()
  checks.check(
    'SIGINT: train exits 130',
    proc.returncode == 130,
    f'status {proc.returncode}',
  )
  notice = re.compile(
    r'trax-revplus train: warning: SIGINT received: stopping after step '
    r'(\d+) with its checkpoint .*/model\.pkl\.gz; the same command resumes '
    r'from step (\d+) '
  )
  notices = [m for m in map(notice.match, lines) if m]
  checks.check(
    "SIGINT: the notice is a warning line in train's format, naming the "
    'checkpoint it saves and the step a resume runs from',
    len(notices) == 1 and int(notices[0][2]) == int(notices[0][1]) + 1,
    err[-2000:],
  )
  step = notices[0][1] if notices else 'N'
  checks.check(
    'SIGINT: the last line is the reason, with the checkpoint of that step '
    'and the step a resume runs from',
    bool(lines)
    and lines[-1].startswith(
      f'trax-revplus train: error: interrupted by SIGINT: stopped after step '
      f'{step}, checkpoint '
    )
    and lines[-1].endswith(
      f'(step {step}); the same command resumes from step '
      f'{int(step) + 1 if notices else "N"}'
    ),
    lines[-1] if lines else 'no output',
  )
  checks.check(
    'SIGINT: no absl line on the terminal',
    not _absl_lines(err),
    str(_absl_lines(err)[:3]),
  )


def _sigterm_to_launch(checks, work):
  out_path = os.path.join(work, 'launch.out')
  proc = _start(
    _CLI
    + ['launch', '--num_processes=2', '--']
    + _train_flags(os.path.join(work, 'launched')),
    out_path,
  )
  if not checks.check(
    'launch reaches step 3', _wait_for(out_path, 'step 3/', proc)
  ):
    proc.kill()
    print(proc.communicate()[1][-3000:], file=sys.stderr)
    return
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=_PATIENCE_SECONDS)
  lines = err.strip().splitlines()
  checks.check(
    'SIGTERM: launch exits 143',
    proc.returncode == 143,
    f'status {proc.returncode}',
  )
  checks.check(
    "SIGTERM: the last line is the launcher's",
    bool(lines)
    and lines[-1].startswith(
      'trax-revplus launch: error: interrupted by SIGTERM'
    ),
    lines[-1] if lines else 'no output',
  )
  checks.check(
    'SIGTERM: no absl line on the terminal',
    not _absl_lines(err),
    str(_absl_lines(err)[:3]),
  )


def _process_killed_at_start(checks, work):
  out_path = os.path.join(work, 'failed.out')
  grace = 120
  proc = _start(
    _CLI
    + ['launch', '--num_processes=2', f'--stop_grace_seconds={grace}', '--']
    + _train_flags(os.path.join(work, 'failed')),
    out_path,
  )
  launcher = psutil.Process(proc.pid)
  deadline = time.monotonic() + _PATIENCE_SECONDS
  victim = None
  while victim is None and time.monotonic() < deadline:
    for child in launcher.children():
      try:
        if '--process_id=1' in child.cmdline():
          victim = child
      except psutil.NoSuchProcess:
        pass
    time.sleep(0.05)
  if not checks.check('launch starts process 1', victim is not None):
    proc.kill()
    return
  time.sleep(2)  # Importing: the moment a start-up failure happens.
  victim.kill()
  killed_at = time.monotonic()
  _, err = proc.communicate(timeout=_PATIENCE_SECONDS)
  seconds = time.monotonic() - killed_at
  lines = err.strip().splitlines()
  checks.check(
    'killed process: launch exits with its status',
    proc.returncode == 128 + signal.SIGKILL,
    f'status {proc.returncode}',
  )
  checks.check(
    "killed process: the terminal shows the launcher's line only",
    len(lines) == 1
    and lines[0].startswith(
      'trax-revplus launch: error: process 1 was killed by '
      'SIGKILL; stopped the others: process 0 '
    ),
    err[-3000:],
  )
  checks.check(
    'killed process: process 0 stopped on SIGTERM, within the grace',
    bool(lines)
    and 'process 0 was killed by SIGKILL' not in lines[-1]
    and seconds < grace,
    f'{seconds:.0f} s; {lines[-1] if lines else ""}',
  )


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--work_dir')
  args = parser.parse_args()
  work = args.work_dir or tempfile.mkdtemp(prefix='cli_smoke_')
  os.makedirs(work, exist_ok=True)
  checks = Checks()
  _sigint_to_train(checks, work)
  _sigterm_to_launch(checks, work)
  _process_killed_at_start(checks, work)
  print(
    f'{"FAIL" if checks.failed else "PASS"} cli_smoke: '
    f'{len(checks.failed)} check(s) failed',
    flush=True,
  )
  return 1 if checks.failed else 0


if __name__ == '__main__':
  sys.exit(main())
