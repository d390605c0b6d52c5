"""SIGINT / SIGTERM during `trax-revplus train`: checkpoint, exit, resume.

One run is stopped with SIGINT mid-way and restarted with the same command,
which resumes from the checkpoint the SIGINT wrote and is stopped again with
SIGTERM; an uninterrupted run of the same command, keeping a checkpoint of
every step, is the reference. The weights and optimizer slots of the
checkpoint the SIGTERM wrote must agree within 1e-6 with the reference's at
the same step, which needs the data position and the Loop's RNG (dropout is
on) resumed.

The lines of each signal: the first names the checkpoint it saves and the
step the same command resumes from; a second, which stops the run at once,
the checkpoint that stands and that step, which the next run begins at.

The runs go through `cli.main` in this process, as the command's entry point
calls it: a small gin-configured callback, ahead of the command's own, sends
the process its signal at the end of a given step, and notes the steps each
run began. A signal before the first step, while trax is still
being imported, needs a fresh process: the last test starts one.
"""

import gc
import os
import signal
import subprocess
import time
import types

import gin
import numpy as np
import pytest

from trax import layers as tl
from trax.supervised import callbacks

from cli_cases import cli_command
from cli_cases import MAIN
from cli_cases import REPO
from cli_cases import TINY_MODEL
import trax_revplus
from trax_revplus import cli
from trax_revplus import interrupt
from trax_revplus.cli import summary as summaries
from trax_revplus.cli import train as train_command

STEPS = 6

TINY = [
  f'train.steps = {STEPS}',
  'train.eval_frequency = 100',
  'sequence_length = 16',
  'ReformerLM.dropout = 0.2',
] + TINY_MODEL

# The steps each run began, in order (`SignalForTest` appends to the last).
_STEPS_BEGUN = []


@gin.configurable
class SignalForTest(callbacks.TrainingStepCallback):
  """Sends this process `signum` as step `at_step` ends (`times` times, one
  after the other: the second is a second Ctrl-C); notes each step."""

  def __init__(self, loop, at_step=None, signum=None, times=1):
    super().__init__(loop)
    self._at_step = at_step
    self._signum = signum
    self._times = times

  def call_at(self, step):
    return True

  def on_step_begin(self, step):
    _STEPS_BEGUN[-1].append(step)

  def on_step_end(self, step):
    if step == self._at_step:
      for _ in range(self._times):
        os.kill(os.getpid(), self._signum)


def _train(
  output_dir, capsys, bindings=(), signal_at=None, times=1, tiny=tuple(TINY)
):
  """Runs `trax-revplus train` here; returns (exit status, stdout, stderr).

  Args:
    output_dir: the run's --output_dir.
    capsys: pytest's capsys or capfd (which also sees the notice the
      signal handler writes to fd 2), read after the run.
    bindings: more --config bindings.
    signal_at: (step, signum) to send as that step ends, or None.
    times: how many times to send it.
    tiny: the bindings of the tiny run.
  """
  _STEPS_BEGUN.append([])
  callback = ['train.callbacks = [@SignalForTest]']
  if signal_at is not None:
    callback += [
      f'SignalForTest.at_step = {signal_at[0]}',
      f'SignalForTest.signum = {int(signal_at[1])}',
      f'SignalForTest.times = {times}',
    ]
  code = cli.main(
    [
      cli.PROG,
      'train',
      f'--config_file={MAIN}',
      f'--output_dir={output_dir}',
      '--progress_every_n_steps=100',
    ]
    + [
      f'--config={binding}'
      for binding in list(tiny) + callback + list(bindings)
    ]
  )
  out, err = capsys.readouterr()
  return code, out, err


def _weights_and_slots(output_dir, basename):
  path = os.path.join(output_dir, basename)
  return tl.np_from_file(
    path + '.weights.npy.gz', compresslevel=0
  ) + tl.np_from_file(path + '.opt_slots0.npy.gz', compresslevel=0)


def _stopped_step(err, name):
  lines = [l for l in err.splitlines() if 'interrupted by' in l]
  assert len(lines) == 1, err[-3000:]
  prefix = (
    f'trax-revplus train: error: interrupted by {name}: stopped after step '
  )
  assert lines[0].startswith(prefix), lines[0]
  step = int(lines[0][len(prefix) :].split(',')[0])
  assert lines[0].endswith(f'; the same command resumes from step {step + 1}')
  return step


@pytest.mark.usefixtures('stock_trax_and_empty_gin')
@pytest.mark.slow
def test_sigint_and_sigterm_resume_to_the_uninterrupted_weights(
  tmp_path, capsys
):
  reference_dir = tmp_path / 'uninterrupted'
  run_dir = tmp_path / 'interrupted'

  # The run stops after the step during which the signal came, with a
  # checkpoint and the status of a process ended by SIGINT.
  code, _, err = _train(run_dir, capsys, signal_at=(3, signal.SIGINT))
  assert code == 130, err[-3000:]
  assert 'Traceback' not in err
  assert _stopped_step(err, 'SIGINT') == 3
  assert _STEPS_BEGUN[-1] == [1, 2, 3]

  # The same command resumes after the saved step; SIGTERM stops it again.
  code, _, err = _train(run_dir, capsys, signal_at=(4, signal.SIGTERM))
  assert code == 143, err[-3000:]
  assert 'Traceback' not in err
  assert _stopped_step(err, 'SIGTERM') == 4
  assert _STEPS_BEGUN[-1] == [4]

  # The reference keeps a checkpoint of every step (model_<step>).
  code, _, err = _train(
    reference_dir, capsys, ['train.permanent_checkpoint_frequency = 1']
  )
  assert code == 0, err[-3000:]
  assert _STEPS_BEGUN[-1] == list(range(1, STEPS + 1))
  expected = _weights_and_slots(reference_dir, 'model_4')
  got = _weights_and_slots(run_dir, 'model')
  assert len(expected) == len(got) > 0
  for want, have in zip(expected, got):
    np.testing.assert_allclose(have, want, rtol=0, atol=1e-6)


# A shorter run for the lines of each signal: no checkpoint but the ones the
# signals and the end of the run save (train.eval_frequency = 100).
SHORT = [b for b in TINY if not b.startswith('train.steps')] + [
  'train.steps = 5'
]


@pytest.mark.usefixtures('stock_trax_and_empty_gin')
def test_each_signal_names_the_checkpoint_that_stands_and_the_resume_step(
  tmp_path, capfd
):
  run_dir = tmp_path / 'run'
  checkpoint = run_dir / 'model.pkl.gz'

  # The first SIGINT, in step 2: the notice and the last line name the
  # checkpoint it saves after step 2 and the step a resume runs from.
  code, out, err = _train(
    run_dir, capfd, signal_at=(2, signal.SIGINT), tiny=SHORT
  )
  assert code == 130, err[-3000:]
  assert 'Traceback' not in err
  assert _STEPS_BEGUN[-1] == [1, 2]
  lines = err.strip().splitlines()
  assert (
    'trax-revplus train: warning: SIGINT received: stopping after step 2 '
    f'with its checkpoint {checkpoint}; the same command resumes from step '
    '3 (send it again to stop at once: the checkpoint saved before then '
    'stands)'
  ) in lines, err[-3000:]
  assert lines[-1] == (
    'trax-revplus train: error: interrupted by SIGINT: stopped after step 2, '
    f'checkpoint {checkpoint} (step 2); the same command resumes from step 3'
  )

  # The same command resumes from step 3, as said. Two SIGINTs in step 4:
  # the second stops it at once, before step 4's checkpoint; the line names
  # the checkpoint that stands (step 2's) and the steps that run again.
  code, out, err = _train(
    run_dir, capfd, signal_at=(4, signal.SIGINT), times=2, tiny=SHORT
  )
  assert code == 130, err[-3000:]
  assert 'Traceback' not in err and '== summary ==' not in out
  assert _STEPS_BEGUN[-1] == [3, 4]
  lines = err.strip().splitlines()
  assert (
    'trax-revplus train: warning: SIGINT received: stopping after step 4 '
    f'with its checkpoint {checkpoint}; the same command resumes from step '
    '5 (send it again to stop at once: the checkpoint saved before then '
    'stands)'
  ) in lines, err[-3000:]
  assert lines[-1] == (
    'trax-revplus train: error: interrupted by a second SIGINT at step 4: '
    f'the checkpoint {checkpoint} (step 2) stands; the same command resumes '
    'from step 3 (steps 3-4 run again)'
  )

  # And so it does.
  code, out, err = _train(run_dir, capfd, tiny=SHORT)
  assert code == 0, err[-3000:]
  assert _STEPS_BEGUN[-1] == [3, 4, 5]

  # The set that stands is the one a load chooses: a file of the newest
  # set cut short, the previous set (step 2's, which step 5's replaced).
  assert trax_revplus.is_active()
  assert train_command._standing_checkpoint(str(run_dir)) == (
    str(checkpoint),
    5,
  )
  weights = run_dir / 'model.weights.npy.gz'
  weights.write_bytes(weights.read_bytes()[:-1])
  assert train_command._standing_checkpoint(str(run_dir)) == (
    str(run_dir / 'model.prev.pkl.gz'),
    2,
  )


def _stop(first, second, begun, ended):
  return types.SimpleNamespace(
    signum=first, second_signum=second, step_begun=begun, step_ended=ended
  )


@pytest.mark.parametrize(
  'stop,standing,line',
  [
    (
      _stop(signal.SIGINT, signal.SIGINT, 10, 9),
      ('d/model.pkl.gz', 8),
      'interrupted by a second SIGINT at step 10: the checkpoint '
      'd/model.pkl.gz (step 8) stands; the same command resumes from step 9 '
      '(steps 9-10 run again)',
    ),
    (
      _stop(signal.SIGINT, signal.SIGTERM, 10, 10),
      ('d/model.prev.pkl.gz', 9),
      'interrupted by SIGTERM after SIGINT after step 10: the checkpoint '
      'd/model.prev.pkl.gz (step 9) stands; the same command resumes from '
      'step 10 (step 10 runs again)',
    ),
    (
      _stop(signal.SIGINT, signal.SIGINT, 10, 10),
      ('d/model.pkl.gz', 10),
      'interrupted by a second SIGINT after step 10: the checkpoint '
      'd/model.pkl.gz (step 10) stands; the same command resumes from step '
      '11',
    ),
    (
      _stop(signal.SIGINT, signal.SIGINT, 2, 1),
      None,
      'interrupted by a second SIGINT at step 2: no checkpoint stands in d; '
      'the same command starts from step 1 (steps 1-2 run again)',
    ),
    (
      _stop(signal.SIGINT, signal.SIGINT, 20, 20),
      ('d/model.pkl.gz', 20),
      'interrupted by a second SIGINT after step 20: the checkpoint '
      'd/model.pkl.gz (step 20) stands; that is the last step of '
      'train.steps = 20: the same command trains no more',
    ),
  ],
  ids=['in_a_step', 'sigterm_after_its_save', 'saved', 'none', 'run_done'],
)
def test_the_line_of_a_second_signal_says_what_stands(stop, standing, line):
  assert summaries.interrupted_twice_message(stop, standing, 'd', 20) == line


def test_a_signal_between_steps_stops_after_the_next():
  stop = interrupt.StopOnSignal()
  assert stop.stops_after_step is None
  stop.step_begun = 4  # In step 4.
  assert stop.stops_after_step == 4
  stop.step_ended = 4  # Its save and evals.
  assert stop.stops_after_step == 5
  assert summaries.stopping_notice(signal.SIGINT, 5, 'd/model.pkl.gz', 4) == (
    'SIGINT received after the last step (4): the run ends as it would '
    '(send it again to stop at once)'
  )


def test_sigterm_before_the_first_step_stops_with_a_message(tmp_path):
  """A signal while trax is still being imported: at once, one line."""
  output_dir = tmp_path / 'early'
  output_dir.mkdir()
  process = subprocess.Popen(
    cli_command()
    + ['train', f'--config_file={MAIN}', f'--output_dir={output_dir}']
    + [f'--config={binding}' for binding in TINY],
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    cwd=REPO,
  )
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
    f'step; nothing new was saved in {output_dir}'
  ]
  assert 'step 1' not in out
  assert os.listdir(output_dir) == []


# Python reports the exception the callback raised as ignored (what this
# test makes happen), which pytest would echo as a warning with its
# traceback.
@pytest.mark.filterwarnings('ignore::pytest.PytestUnraisableExceptionWarning')
def test_a_signal_lost_in_a_library_callback_still_stops_before_the_steps():
  # The handler's exception raised inside a callback Python runs for a
  # library (here the garbage collector's, as JAX's during trax's import)
  # is reported as ignored; the stages before the steps check for it.
  stop = interrupt.StopOnSignal()
  fired = []

  def callback(phase, info):
    del info
    if phase == 'start' and not fired:
      fired.append(True)
      signal.raise_signal(signal.SIGINT)

  with stop:
    gc.callbacks.append(callback)
    try:
      gc.collect()  # "Exception ignored in ...", and collection goes on.
    finally:
      gc.callbacks.remove(callback)
    assert fired and stop.signum == signal.SIGINT
    with pytest.raises(interrupt.Interrupted) as raised:
      stop.raise_if_signalled()
  assert raised.value.signum == signal.SIGINT and raised.value.step is None


def test_sigint_while_planning_stops_at_once_in_one_line(tmp_path):
  """Planning compiles before the first step (seconds to minutes): a signal
  then stops the run at once, one line, nothing saved, the compilation left
  behind (the process does not wait for the compiler)."""
  output_dir = tmp_path / 'planning'
  process = subprocess.Popen(
    cli_command()
    + [
      'train',
      f'--config_file={MAIN}',
      f'--output_dir={output_dir}',
      '--config=train.steps = 3',
      # A program compiled afresh: the signal comes while it compiles.
      '--nocompilation_cache',
    ],
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    cwd=REPO,
  )
  assert process.stdout is not None
  for line in process.stdout:
    if line.startswith('planning: ') and 'compiling' in line:
      break
  else:
    pytest.fail(f'no planning line: {process.communicate()}')
  start = time.monotonic()
  process.send_signal(signal.SIGINT)
  out, err = process.communicate()
  stopped_seconds = time.monotonic() - start
  assert process.returncode == 130, err[-3000:]
  assert err.strip().splitlines()[-1] == (
    f'trax-revplus train: error: interrupted by SIGINT while planning the '
    f'step, before it ran; nothing new was saved in {output_dir}; run the '
    f'same command to start again'
  )
  assert 'Traceback' not in err and 'step 1' not in out
  assert 'model.pkl.gz' not in os.listdir(output_dir)
  assert stopped_seconds < 10
