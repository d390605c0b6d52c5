"""SIGINT / SIGTERM during `trax-revplus train`: checkpoint, exit, resume.

One run is stopped with SIGINT mid-way and restarted with the same command,
which resumes from the checkpoint the SIGINT wrote and is stopped again with
SIGTERM; an uninterrupted run of the same command (in parallel), keeping a
checkpoint of every step, is the reference. The weights and optimizer slots
of the checkpoint the SIGTERM wrote must agree within 1e-6 with the
reference's at the same step, which needs the data position and the Loop's
RNG (dropout is on) resumed.

A small gin-configured callback (written to a temporary module) prints a
line at each step end and, from step 3 on, sleeps briefly, so the signal
lands mid-run however loaded the machine is; the signal itself comes from
this process.
"""

import os
import signal
import subprocess
import time

import numpy as np

from trax import layers as tl

from cli_cases import cli_command
from cli_cases import MAIN
from cli_cases import REPO
from cli_cases import TINY_MODEL

STEPS = 8

PACE_MODULE = '''
import sys
import time

import gin
from trax.supervised import callbacks


@gin.configurable
class PaceForTest(callbacks.TrainingStepCallback):

  def call_at(self, step):
    return True

  def on_step_begin(self, step):
    pass

  def on_step_end(self, step):
    print(f'pace {step}', flush=True)
    if step >= 3:
      time.sleep(0.4)
'''

PACE_CONFIG = '''
import pace_for_test
train.callbacks = [@PaceForTest]
'''

TINY = [f'train.steps = {STEPS}', 'train.eval_frequency = 100',
        'sequence_length = 16', 'ReformerLM.dropout = 0.2'] + TINY_MODEL


def _start(tmp_path, output_dir, extra_bindings=()):
  env = dict(os.environ, PYTHONPATH=str(tmp_path) + os.pathsep +
             os.environ.get('PYTHONPATH', ''))
  args = (cli_command() +
          ['train', f'--config_file={MAIN}',
           f'--config_file={tmp_path / "pace.gin"}',
           f'--output_dir={output_dir}', '--progress_every_n_steps=100'] +
          [f'--config={binding}' for binding in TINY + list(extra_bindings)])
  return subprocess.Popen(args, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, cwd=REPO,
                          env=env)


def _signal_at(process, step, signum):
  """Sends `signum` once the run prints 'pace <step>'; returns its output.

  Waits as long as the run takes to get there (a busy machine can take
  minutes to import and compile): the run ends on its own otherwise.
  """
  seen = []
  while True:
    line = process.stdout.readline()
    if not line:
      break
    seen.append(line)
    if line.strip() == f'pace {step}':
      process.send_signal(signum)
      break
  out, err = process.communicate()
  return ''.join(seen) + out, err


def _weights_and_slots(output_dir, basename):
  path = os.path.join(output_dir, basename)
  return (tl.np_from_file(path + '.weights.npy.gz', compresslevel=0) +
          tl.np_from_file(path + '.opt_slots0.npy.gz', compresslevel=0))


def _stopped_step(err, name):
  lines = [l for l in err.splitlines() if 'interrupted by' in l]
  assert len(lines) == 1, err[-3000:]
  prefix = (f'trax-revplus train: error: interrupted by {name}: stopped '
            f'after step ')
  assert lines[0].startswith(prefix), lines[0]
  assert lines[0].endswith('; run the same command to resume'), lines[0]
  return int(lines[0][len(prefix):].split(',')[0])


def test_sigint_and_sigterm_resume_to_the_uninterrupted_weights(tmp_path):
  (tmp_path / 'pace_for_test.py').write_text(PACE_MODULE)
  (tmp_path / 'pace.gin').write_text(PACE_CONFIG)
  reference_dir = tmp_path / 'uninterrupted'
  run_dir = tmp_path / 'interrupted'

  # The reference keeps a checkpoint of every step (model_<step>).
  reference = _start(tmp_path, reference_dir,
                     ['train.permanent_checkpoint_frequency = 1'])
  first = _start(tmp_path, run_dir)
  out, err = _signal_at(first, 3, signal.SIGINT)
  assert first.returncode == 130, err[-3000:]
  assert 'Traceback' not in err
  stopped = _stopped_step(err, 'SIGINT')
  assert 3 <= stopped < STEPS - 1, out

  # The same command resumes after the saved step; SIGTERM stops it again.
  second = _start(tmp_path, run_dir)
  out, err = _signal_at(second, stopped + 1, signal.SIGTERM)
  assert second.returncode == 143, err[-3000:]
  assert f'pace {stopped + 1}' in out and f'pace {stopped}\n' not in out
  stopped_again = _stopped_step(err, 'SIGTERM')
  assert stopped < stopped_again <= STEPS, out

  out, err = reference.communicate()
  assert reference.returncode == 0, err[-3000:]
  expected = _weights_and_slots(reference_dir, f'model_{stopped_again}')
  got = _weights_and_slots(run_dir, 'model')
  assert len(expected) == len(got) > 0
  for want, have in zip(expected, got):
    np.testing.assert_allclose(have, want, rtol=0, atol=1e-6)


def test_sigterm_before_the_first_step_stops_with_a_message(tmp_path):
  """A signal while trax is still being imported: at once, one line."""
  output_dir = tmp_path / 'early'
  output_dir.mkdir()
  process = subprocess.Popen(
      cli_command() + ['train', f'--config_file={MAIN}',
                       f'--output_dir={output_dir}'] +
      [f'--config={binding}' for binding in TINY],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
  # The run locks its (existing) output dir right after its signal handlers
  # are in place, before it imports trax.
  lock = output_dir / 'trax-revplus.lock'
  while str(process.pid) not in (lock.read_text() if lock.exists() else ''):
    assert process.poll() is None, process.communicate()
    time.sleep(0.02)
  process.send_signal(signal.SIGTERM)
  out, err = process.communicate()
  assert process.returncode == 143, err[-3000:]
  assert err.strip().splitlines() == [
      f'trax-revplus train: error: interrupted by SIGTERM before the first '
      f'step; nothing new was saved in {output_dir}']
  assert 'step 1' not in out
  assert os.listdir(output_dir) == []
