"""`trax-revplus train` runs of the tiny main job: training through the
CLI, the checkpoint it saves, and resuming copies of it.

Ours trains in a fresh process (`trax-revplus train`, as a user runs it:
what reaches the terminal from its imports too); the stock twin trains in
this process through `cli.main`, as the command's entry point calls it.
"""

import collections
import gzip
import json
import os
import re
import subprocess

import numpy as np
import pytest

from trax_revplus import cli
from trax_revplus import memory
from trax_revplus.cli import noise

from cli_cases import cli_command
from cli_cases import REPO
from cli_cases import MAIN
from cli_cases import STOCK
from cli_cases import TINY_MODEL

# The main job shrunk to a few steps of a tiny model: 3 steps, eval and
# checkpoint at steps 1 and 2, so the CLI saves the final checkpoint itself.
TINY = [
  'train.steps = 3',
  'train.eval_frequency = 2',
  'sequence_length = 32',
] + TINY_MODEL

# What `_check_trained` reads of a run, in this process or another.
_Result = collections.namedtuple('_Result', 'returncode stdout stderr')


def _main(capsys, *args):
  code = cli.main(['trax-revplus'] + list(args))
  out, err = capsys.readouterr()
  return code, out, err


def _one_line_error(err):
  lines = err.strip().splitlines()
  assert len(lines) == 1, err
  assert 'Traceback' not in err
  return lines[0]


def _run(args, timeout=None):
  return subprocess.run(
    cli_command() + args,
    capture_output=True,
    text=True,
    timeout=timeout,
    cwd=REPO,
    check=False,
  )


def _train_args(config, output_dir):
  return [
    'train',
    f'--config_file={config}',
    f'--output_dir={output_dir}',
    '--progress_every_n_steps=1',
  ] + [f'--config={binding}' for binding in TINY]


def _summary(stdout):
  """The summary block as {row name: value}."""
  block = stdout.split('== summary ==', 1)[1]
  rows = {}
  for line in block.strip().splitlines():
    name, _, value = line.partition('  ')
    rows[name.strip()] = value.strip()
  return rows


def _check_trained(result, output_dir):
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'Traceback' not in result.stderr
  # No third-party warning reaches the terminal; train.log has them.
  for line in result.stderr.splitlines():
    assert not noise.is_known_noise(line), line
    assert 'Warning:' not in line, line
  for step in (1, 2, 3):
    assert f'step {step}/3  loss ' in result.stdout
  rows = _summary(result.stdout)
  assert rows['steps'].startswith('3 ')
  # The last eval ran at step 2 (train.eval_frequency) of the run's 3.
  assert rows['last eval loss'].endswith('(step 2 of 3)')
  checkpoint = os.path.join(output_dir, 'model.pkl.gz')
  assert rows['checkpoint'] == f'{checkpoint} (step 3)'
  assert os.path.exists(os.path.join(output_dir, 'model.weights.npy.gz'))
  assert os.path.getsize(os.path.join(output_dir, 'train.log')) > 0
  # run_stats.json names the classes that ran, as the summary does.
  with open(os.path.join(output_dir, 'run_stats.json'), encoding='utf-8') as f:
    stats = json.load(f)
  assert stats['trainer'] == rows['trainer']
  assert stats['reversible_layers'] == rows['reversible layers']
  # The summary's train loss is the last step's, as compare shows it.
  assert rows['train loss, last step'] == (
    f'{stats["loss"][-1]:.4f} nats (step {stats["steps"][-1]})'
  )
  # Our trainer's memory log names them alike.
  log = os.path.join(output_dir, 'memory.jsonl')
  if os.path.exists(log):
    start = next(
      r for r in memory.read_memory_log(log) if r['phase'] == 'start'
    )
    assert start['trainer'] == rows['trainer']
    assert start['reversible_layers'] == rows['reversible layers']
  return rows


@pytest.mark.parametrize(
  'config, flags',
  [(STOCK, []), (MAIN, ['--implementation=stock'])],
  ids=['stock_config', 'implementation_stock'],
)
def test_stock_config_trains_through_the_cli(
  tmp_path, capsys, stock_trax_and_empty_gin, config, flags
):
  """The stock twin, and the main job with --implementation=stock, whose
  config's activation line trax's Loop imports again when it saves the
  operative config, after step 1."""
  del stock_trax_and_empty_gin
  output_dir = str(tmp_path / 'stock')
  result = _Result(*_main(capsys, *_train_args(config, output_dir), *flags))
  rows = _check_trained(result, output_dir)
  # Stock trax throughout: trax_revplus never activated, its checkpoint
  # set (with a manifest) never written.
  import trax_revplus  # pylint: disable=g-import-not-at-top

  assert not trax_revplus.is_active()
  assert not os.path.exists(os.path.join(output_dir, 'model.manifest.json'))
  assert rows['trainer'] == 'trax.optimizers.trainer.ReversibleSerialTrainer'
  # Stock's trainer ran as the baseline, with the one fix current JAX needs
  # on an accelerator (tests/test_compat.py), and says so.
  assert rows['trainer fix'] == (
    "its Loop's RNG on the step's device (as current JAX requires)"
  )
  with open(os.path.join(output_dir, 'run_stats.json'), encoding='utf-8') as f:
    assert json.load(f)['trainer_fix'] == "its Loop's RNG on the step's device"
  assert 'trax_revplus' not in rows['reversible layers']
  assert (
    'trax.layers.reversible.ReversibleHalfResidual x2'
    in (rows['reversible layers'])
  )


@pytest.fixture(name='ours_run', scope='module')
def fixture_ours_run(tmp_path_factory):
  """The tiny main job trained by `trax-revplus train`: (result, dir)."""
  output_dir = str(tmp_path_factory.mktemp('ours') / 'run')
  return _run(_train_args(MAIN, output_dir)), output_dir


def test_activated_twin_trains_and_its_checkpoint_loads(ours_run):
  result, output_dir = ours_run
  rows = _check_trained(result, output_dir)
  assert rows['trainer'] == 'trax_revplus.trainer.ReversibleSerialTrainer'
  assert (
    'trax_revplus.layers.ReversibleHalfResidual x2'
    in (rows['reversible layers'])
  )
  assert 'trax.layers.reversible' not in rows['reversible layers']

  # The checkpoint loads into the same model with Layer.init_from_file.
  from trax import layers as tl  # pylint: disable=g-import-not-at-top
  from trax import models  # pylint: disable=g-import-not-at-top
  from trax import shapes  # pylint: disable=g-import-not-at-top
  import trax_revplus  # pylint: disable=g-import-not-at-top

  cli.parse_configs([MAIN], TINY)
  try:
    model = models.ReformerLM(mode='eval')
    model.init_from_file(
      os.path.join(output_dir, 'model.pkl.gz'),
      weights_only=True,
      input_signature=shapes.ShapeDtype((1, 32), np.int32),
    )
    loaded, _ = tl.flatten_weights_and_state(model.weights, model.state)
    saved = tl.np_from_file(
      os.path.join(output_dir, 'model.weights.npy.gz'), compresslevel=0
    )
    assert len(loaded) == len(saved)
    for a, b in zip(loaded, saved):
      np.testing.assert_array_equal(np.asarray(a), b)
  finally:
    import gin  # pylint: disable=g-import-not-at-top

    gin.clear_config()
    trax_revplus.deactivate()


# Resuming the run of `ours_run`, in this process, from copies of its dir.


def _resume(capsys, output_dir, *bindings, steps=4, implementation='config'):
  code, out, err = _main(
    capsys,
    'train',
    f'--config_file={MAIN}',
    f'--output_dir={output_dir}',
    '--progress_every_n_steps=1',
    f'--implementation={implementation}',
    *[
      f'--config={b}'
      for b in TINY + [f'train.steps = {steps}'] + list(bindings)
    ],
  )
  import trax_revplus  # pylint: disable=g-import-not-at-top

  trax_revplus.deactivate()
  return code, out, err


def _copy_run(ours_run, tmp_path):
  import shutil  # pylint: disable=g-import-not-at-top

  assert ours_run[0].returncode == 0, ours_run[0].stderr[-3000:]
  path = tmp_path / 'run'
  shutil.copytree(ours_run[1], path)
  return path


def _manifest_counters(path):
  import json  # pylint: disable=g-import-not-at-top

  manifest = json.loads((path / 'model.manifest.json').read_text())
  return manifest['step'], manifest['data_counters']


def test_a_resumed_run_reads_its_programs_from_the_compilation_cache(
  ours_run, tmp_path, capsys
):
  del capsys
  path = _copy_run(ours_run, tmp_path)
  # In a process of its own, as `ours_run` trained: this process compiles
  # under the suite's settings (conftest), other cache keys.
  result = _run(_train_args(MAIN, str(path)) + ['--config=train.steps = 4'])
  assert result.returncode == 0, result.stderr[-3000:]
  assert (
    'programs read from the compilation cache'
    in _summary(result.stdout)['train time']
  )


def test_out_of_device_memory_is_one_line_and_keeps_the_checkpoint(
  ours_run, tmp_path, capsys, monkeypatch
):
  from trax_revplus import checkpoints  # pylint: disable=g-import-not-at-top
  from trax_revplus.trainer._step import step_context  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top

  path = _copy_run(ours_run, tmp_path)
  call = step_context.StepContext.call

  def short_of_memory(*args):
    del args
    raise jax.errors.JaxRuntimeError(
      'RESOURCE_EXHAUSTED: Out of memory while trying to allocate 4096 bytes.'
    )

  def failing(self, fn, args):  # The device is short from step 5 on.
    return call(self, short_of_memory if self.step >= 5 else fn, args)

  monkeypatch.setattr(step_context.StepContext, 'call', failing)
  # Resumed at step 3: step 4 trains (and is checkpointed), step 5 fails.
  code, out, err = _resume(capsys, path, steps=6)
  assert code == 1
  assert 'step 4/6  loss' in out
  line = _one_line_error(err)
  assert line.startswith('trax-revplus train: error: out of device memory in ')
  assert 'at step 5: it asked for 4.0 KiB' in line
  assert 'device_memory_budget_bytes' in line
  ok, manifest, reason = checkpoints.verify(str(path), 'model')
  assert ok, reason
  assert manifest['step'] == 4


def test_an_unwritable_compilation_cache_is_one_line(tmp_path, capsys):
  blocker = tmp_path / 'a_file'
  blocker.write_text('')
  code, out, err = _main(
    capsys,
    *_train_args(MAIN, str(tmp_path / 'run')),
    f'--compilation_cache_dir={blocker}/cache',
  )
  assert code == 2 and not out
  line = _one_line_error(err)
  assert f'{blocker}/cache cannot be written' in line
  assert '--nocompilation_cache' in line
  assert not (tmp_path / 'run').exists()


@pytest.mark.parametrize(
  'content', [b'', b'\x80\x04garbage'], ids=['empty', 'garbage']
)
def test_damaged_data_counters_file_resumes_from_the_verified_set(
  ours_run, tmp_path, capsys, content
):
  path = _copy_run(ours_run, tmp_path)
  step, counters = _manifest_counters(path)
  assert step == 3 and counters
  (path / 'data_counters0.pkl').write_bytes(content)
  code, out, err = _resume(capsys, path)
  assert code == 0, err
  assert 'Traceback' not in err
  assert 'step 4/4  loss ' in out and 'step 1/4' not in out
  assert 'data_counters0.pkl is unreadable' in err
  assert 'holds data counters' not in err  # Nothing left to disagree.
  # The data position came from the set: one batch further, not restarted.
  step, after = _manifest_counters(path)
  assert step == 4
  assert after == {k: v + 1 for k, v in counters.items()}


def _flip_middle_byte(file_path):
  data = bytearray(file_path.read_bytes())
  data[len(data) // 2] ^= 0xFF
  file_path.write_bytes(bytes(data))


def test_both_sets_damaged_stop_with_one_line(ours_run, tmp_path, capsys):
  path = _copy_run(ours_run, tmp_path)
  _flip_middle_byte(path / 'model.weights.npy.gz')
  _flip_middle_byte(path / 'model.prev.weights.npy.gz')
  code, out, err = _resume(capsys, path)
  assert code == 1
  line = _one_line_error(err)
  assert line.startswith('trax-revplus train: error: checkpoint set model in')
  assert 'model.weights.npy.gz is damaged' in line
  assert 'model.prev.weights.npy.gz is damaged' in line
  assert line.endswith(
    'to load it anyway, unverified, move '
    'model.manifest.json out of it (a set without a '
    'manifest loads as stock trax loads it)'
  )
  assert 'step 1/' not in out
  # Followed, that advice loads the set unverified, which fails; the line
  # then leaves the advice out.
  (path / 'model.manifest.json').rename(tmp_path / 'moved.manifest.json')
  pkl = path / 'model.pkl.gz'
  pkl.write_bytes(pkl.read_bytes()[:100])
  code, out, err = _resume(capsys, path)
  assert code == 1
  lines = err.strip().splitlines()
  assert 'has no model.manifest.json' in lines[0]  # The warning.
  assert 'Traceback' not in err and len(lines) == 2, err
  assert 'cannot be read' in lines[1] and 'a file of it is damaged' in lines[1]
  assert lines[1].endswith('or give another --output_dir'), lines[1]


def test_run_already_at_its_last_step_says_so(ours_run, tmp_path, capsys):
  path = _copy_run(ours_run, tmp_path)
  code, out, err = _resume(capsys, path, steps=3)
  assert code == 0, err
  rows = _summary(out)
  assert rows['steps'] == (
    '3 (0 in this run: the checkpoint was at train.steps = 3 already)'
  )
  assert rows['checkpoint'] == (
    f'{path}/model.pkl.gz (step 3, as loaded: no step ran, nothing new to save)'
  )
  assert 'None' not in out.split('== summary ==')[1]


def test_final_checkpoint_is_saved_whatever_checkpoints_at_says(
  tmp_path, capsys
):
  # trax's Loop saves at the steps of train.checkpoints_at alone: none of
  # this run's, so it writes no checkpoint at all.
  path = tmp_path / 'run'
  late = '--config=train.checkpoints_at = [100]'
  code, out, err = _main(capsys, *_train_args(MAIN, path), late)
  import trax_revplus  # pylint: disable=g-import-not-at-top

  trax_revplus.deactivate()
  assert code == 0, err
  assert 'Traceback' not in err
  assert _summary(out)['checkpoint'] == f'{path}/model.pkl.gz (step 3)'
  assert _manifest_counters(path)[0] == 3
  # The same command with one more step resumes from it.
  code, out, err = _resume(capsys, path, 'train.checkpoints_at = [100]')
  assert code == 0, err
  assert 'step 4/4  loss ' in out and 'step 1/4' not in out
  assert _summary(out)['steps'] == '4 (1 in this run)'
  assert _summary(out)['checkpoint'] == f'{path}/model.pkl.gz (step 4)'


def test_stock_traxs_failing_load_is_one_line_naming_the_fix(
  ours_run, tmp_path, capsys
):
  path = _copy_run(ours_run, tmp_path)
  code, out, err = _resume(capsys, path, implementation='stock')
  assert code == 1
  assert _one_line_error(err) == (
    f'trax-revplus train: error: cannot load the checkpoint in {path} '
    f"(TypeError: unsupported operand type(s) for ==: 'ArrayImpl' and "
    f"'tuple'); stock trax's load fails so on current JAX: resume without "
    f'--implementation=stock (trax_revplus loads the checkpoint), or give '
    f'another --output_dir'
  )
  assert 'step 4/4' not in out
  # As it says: trax_revplus loads it.
  code, out, err = _resume(capsys, path, implementation='config')
  assert code == 0, err
  assert 'step 4/4  loss ' in out and 'step 1/4' not in out


@pytest.mark.parametrize('implementation', ['config', 'stock'])
def test_checkpoint_of_another_model_is_a_usage_error(
  ours_run, tmp_path, capsys, implementation
):
  path = _copy_run(ours_run, tmp_path)
  code, out, err = _resume(
    capsys,
    path,
    'ReformerLM.d_model = 32',
    'ReformerLM.d_ff = 64',
    implementation=implementation,
  )
  assert code == 2
  # trax prints a line per weight it could not place; its log keeps them.
  assert 'tensor of shape' not in out and 'match shapes' not in out, out
  line = _one_line_error(err)
  if implementation == 'config':  # trax_revplus's load: the set verified.
    # The first array that does not fit, named, in the one line.
    assert re.search(
      rf'checkpoint {re.escape(str(path))}/model\.pkl\.gz \(step 3\) does '
      r'not fit this model \(IndexError: \w[\w ]* array \d+ is '
      r'float32\[[\d, ]+\] in the checkpoint and float32\[[\d, ]+\] in '
      r'the model\): it was written by a model of another shape',
      line,
    ), line
  else:  # Stock trax's load.
    log = (path / 'train.log').read_text()
    assert 'Not inserted tensor of shape' in log
    assert (
      f'the checkpoint in {path} does not fit this model (IndexError):'
      f' it was written by a model of another shape'
    ) in line
  assert line.endswith('give another --output_dir')


def test_stock_failing_in_its_steps_is_one_line(
  tmp_path, capsys, stock_trax_and_empty_gin, monkeypatch
):
  """Stock trax failing in its own steps (on a TPU, current JAX refuses
  the host RNG its memory-efficient Loop hands its step's programs) is one
  line naming the error; its traceback goes to the log."""
  del stock_trax_and_empty_gin
  from trax.optimizers import trainer as trax_trainer  # pylint: disable=g-import-not-at-top

  def fails(self, *args, **kwargs):
    del self, args, kwargs
    raise ValueError(
      'Received incompatible devices for jitted computation.\n'
      'Got argument rng of fbo with device ids [0] on platform CPU'
    )

  monkeypatch.setattr(trax_trainer.ReversibleSerialTrainer, 'one_step', fails)
  output_dir = str(tmp_path / 'stock')
  code, _, err = _main(capsys, *_train_args(STOCK, output_dir))
  assert code == 1
  line = _one_line_error(err)
  log = os.path.join(output_dir, 'train.log')
  assert line == (
    'trax-revplus train: error: stock trax failed in its steps: ValueError: '
    'Received incompatible devices for jitted computation. Got argument rng '
    f'of fbo with device ids [0] on platform CPU (its traceback is in {log})'
  )
  with open(log) as f:
    logged = f.read()
  assert 'Traceback' in logged and 'incompatible devices' in logged


def test_profile_and_step_floor(tmp_path, capsys):
  """--profile=2-3: one JAX profiler trace, begun as step 2 began and ended
  after step 3, readable by TensorBoard (.xplane.pb) and Perfetto.
  --step_floor: the floor and the model's arithmetic in the summary and
  run_stats.json."""
  output_dir = str(tmp_path / 'profiled')
  result = _Result(
    *_main(
      capsys, *_train_args(MAIN, output_dir), '--profile=2-3', '--step_floor'
    )
  )
  rows = _check_trained(result, output_dir)
  with open(os.path.join(output_dir, 'run_stats.json'), encoding='utf-8') as f:
    stats = json.load(f)
  floor = stats['step_floor']
  # The tiny main job: batch 2, a plan of whole-batch calls or slices.
  assert floor['rows_per_call'] * floor['calls_per_step'] == 2
  assert floor['flops_per_step'] == pytest.approx(
    floor['calls_per_step']
    * sum(k['flops'] * k['count'] for k in floor['kinds'])
  )
  assert floor['step_floor_seconds'] == min(
    floor['layer_floor_seconds'], floor['whole_program_seconds']
  )
  ratio = stats['median_step_seconds'] / floor['step_floor_seconds']
  assert rows['step floor'].startswith(f'{floor["step_floor_seconds"]:.4g} s (')
  assert rows['step floor'].endswith(f'the median step is {ratio:.2f}x it')
  assert rows['arithmetic'].startswith(
    f'{floor["flops_per_step"] / 1e12:.4g} TFLOP a step a device'
  )
  # The layer kinds holding the step back, largest share first, each with
  # its rate from its own figures; the floor ran at the plan's attention
  # pairs at once.
  first = floor['shares'][0]
  kind = next(k for k in floor['kinds'] if k['name'] == first['name'])
  assert first['tflops_per_second'] == pytest.approx(
    kind['flops'] / kind['seconds'] / 1e12
  )
  assert rows['floor by layer kind'].startswith(
    f'{first["name"]} x {first["count"]}: {first["share_of_floor"]:.0%}, '
  )
  heads = floor['parallel_heads']
  assert (
    'attention 1 (example, head) pair at a time'
    in (stats['planning'][0]['plan'])
  ) == (heads == 1)
  # The run's peak host memory is its steps', kept before the floor ran.
  assert rows['peak host memory'] == (
    f'{stats["peak_host_rss_bytes"] / 2**20:.0f} MiB (RSS)'
  )
  profile_dir = os.path.join(output_dir, 'profile')
  assert (
    f'profile of steps 2-3 in {profile_dir} (TensorBoard, or '
    'perfetto_trace.json.gz in ui.perfetto.dev)'
  ) in result.stdout.splitlines()
  # The line comes after step 3 ends, before its progress line.
  assert result.stdout.index('step 2/3') < result.stdout.index('profile of')
  runs = os.listdir(os.path.join(profile_dir, 'plugins', 'profile'))
  assert len(runs) == 1
  trace_dir = os.path.join(profile_dir, 'plugins', 'profile', runs[0])
  files = os.listdir(trace_dir)
  assert any(f.endswith('.xplane.pb') for f in files)
  with gzip.open(
    os.path.join(trace_dir, 'perfetto_trace.json.gz'), 'rt', encoding='utf-8'
  ) as f:
    events = json.load(f)['traceEvents']
  # The trace holds the steps' compiled programs running.
  names = {e.get('name', '') for e in events}
  assert any(n.startswith('PjitFunction(') for n in names), sorted(names)[:50]
  # Resumed past the steps named: one line, nothing traced.
  resumed = _Result(
    *_main(
      capsys,
      *_train_args(MAIN, output_dir),
      '--config=train.steps = 4',
      '--profile=2-3',
    )
  )
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert (
    'profile of steps 2-3: nothing traced, the run resumed at step 4, past them'
  ) in resumed.stdout.splitlines()
  assert len(os.listdir(os.path.join(profile_dir, 'plugins', 'profile'))) == 1
