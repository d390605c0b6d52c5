"""The `trax-revplus` command: help, settings and one-line errors.

Training runs of the tiny main job and resuming them:
tests/cli/test_cli_runs.py.
"""

import argparse
import os
import subprocess

import pytest

from trax_revplus import cli
from trax_revplus.cli import noise
from trax_revplus.cli import parser
from trax_revplus.multiprocess.config import resolve_config
from trax_revplus.multiprocess.errors import DistributedUsageError

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


def _run(args, timeout=None):
  return subprocess.run(
    cli_command() + args,
    capture_output=True,
    text=True,
    timeout=timeout,
    cwd=REPO,
    check=False,
  )


def _one_line_error(err):
  lines = err.strip().splitlines()
  assert len(lines) == 1, err
  assert 'Traceback' not in err
  return lines[0]


def test_errors_before_trax_import_are_one_line(tmp_path):
  result = _run(['train', f'--config_file={tmp_path}/missing.gin'])
  assert result.returncode == 2
  line = _one_line_error(result.stderr)
  assert line == (
    f'trax-revplus train: error: config file not found: {tmp_path}/missing.gin'
  )


def _main(capsys, *args):
  code = cli.main(['trax-revplus'] + list(args))
  out, err = capsys.readouterr()
  return code, out, err


@pytest.fixture(name='bad_gin')
def fixture_bad_gin(tmp_path):
  path = tmp_path / 'bad.gin'
  path.write_text('train.steps = = 3\nthis is not gin (\n')
  return str(path)


@pytest.mark.parametrize(
  'case',
  [
    'missing_config',
    'unparsable_config',
    'unknown_configurable',
    'unknown_parameter',
    'unwritable_output_dir',
    'empty_corpus_glob',
    'no_model',
    'bad_flag',
    'stray_argument',
    'empty_output_dir',
  ],
)
def test_user_errors_are_one_line_without_traceback(
  case, tmp_path, bad_gin, capsys
):
  not_a_dir = tmp_path / 'file'
  not_a_dir.write_text('x')
  out_dir = f'--output_dir={tmp_path}/out'
  args, code, text = {
    'missing_config': (
      ['--config_file=/no/such.gin', out_dir],
      2,
      'config file not found: /no/such.gin',
    ),
    'unparsable_config': (
      [f'--config_file={bad_gin}', out_dir],
      2,
      f'cannot parse config file {bad_gin}',
    ),
    'unknown_configurable': (
      [f'--config_file={STOCK}', out_dir, '--config=nosuch_thing.size = 1'],
      2,
      'nosuch_thing',
    ),
    'unknown_parameter': (
      [f'--config_file={STOCK}', out_dir, '--config=ReformerLM.d_modle = 8'],
      2,
      'd_modle',
    ),
    'unwritable_output_dir': (
      [f'--config_file={STOCK}', f'--output_dir={not_a_dir}/run'],
      1,
      'is not a directory',
    ),
    'empty_corpus_glob': (
      [
        f'--config_file={STOCK}',
        out_dir,
        f"--config=local_text_inputs.paths = '{tmp_path}/none/*.txt'",
      ],
      1,
      'none/*.txt',
    ),
    'no_model': (
      ['--config=train.steps = 1', out_dir],
      2,
      'no model configured',
    ),
    'bad_flag': (['--config_fil=x.gin'], 2, 'config_fil'),
    'stray_argument': (
      [f'--config_file={STOCK}', 'extra'],
      2,
      'unexpected arguments: extra',
    ),
    'empty_output_dir': (
      [f'--config_file={STOCK}', '--output_dir='],
      2,
      'argument --output_dir: must be a path, got an empty one',
    ),
  }[case]
  got, out, err = _main(capsys, 'train', *args)
  assert got == code, err
  line = _one_line_error(err)
  assert line.startswith('trax-revplus train: error: ')
  assert text in line
  assert '== summary ==' not in out
  import trax_revplus  # pylint: disable=g-import-not-at-top

  trax_revplus.deactivate()


def _flags_of(command):
  """The flags `command` defines: {name: argparse action}."""
  # pylint: disable=protected-access
  top = parser.build()
  commands = next(
    a for a in top._actions if isinstance(a, argparse._SubParsersAction)
  )
  return {
    a.dest: a
    for a in commands.choices[command]._actions
    if a.option_strings and a.dest != 'help'
  }


@pytest.mark.parametrize(
  'command,flags',
  [
    (
      'train',
      [
        'config_file',
        'config',
        'output_dir',
        'progress_every_n_steps',
        'memory_log_every_n_steps',
        'profile',
        'step_floor',
        'implementation',
        'num_processes',
        'process_id',
        'coordinator_address',
        'join_timeout_seconds',
        'heartbeat_timeout_seconds',
        'compilation_cache_dir',
        'nocompilation_cache',
      ],
    ),
    ('launch', ['num_processes', 'stop_grace_seconds', 'max_local_processes']),
    (
      'estimate',
      [
        'config_file',
        'config',
        'device_memory',
        'n_devices',
        'least',
        'json',
        'compilation_cache_dir',
        'nocompilation_cache',
      ],
    ),
    (
      'compare',
      [
        'config_file',
        'config',
        'steps',
        'seed',
        'output_dir',
        'step_floor',
        'device_accounting',
      ],
    ),
    ('plot-memory', ['output']),
  ],
)
def test_help_documents_every_flag(command, flags, capsys):
  code, out, err = _main(capsys, command, '--help')
  assert code == 0 and not err
  assert out.startswith(f'usage: trax-revplus {command}')
  defined = _flags_of(command)
  assert sorted(defined) == sorted(flags)
  for name in flags:
    action = defined[name]
    if action.nargs == 0:  # A switch, e.g. --nodevice_accounting.
      assert action.option_strings[0] in out
    else:
      assert f'--{name}=' in out
    assert action.help.split()[0] in out


def test_top_level_usage_and_unknown_command(capsys):
  code, out, _ = _main(capsys, '--help')
  assert code == 0
  for command in ('train', 'compare', 'plot-memory', 'estimate', 'launch'):
    assert f'\n  {command} ' in out
  code, _, err = _main(capsys)
  assert code == 2 and err.startswith('usage:')
  code, _, err = _main(capsys, 'fly')
  assert code == 2
  assert "unknown command 'fly'" in _one_line_error(err)


def test_plot_memory_needs_an_existing_run_dir(tmp_path, capsys):
  code, _, err = _main(capsys, 'plot-memory', str(tmp_path / 'nope'))
  assert code == 2
  assert 'run directory not found' in _one_line_error(err)


# Bad inputs: each is one line on stderr, no traceback, the exit status of
# its kind; checked before any training step.


@pytest.mark.parametrize(
  'bindings,text',
  [
    (['train.steps = 0'], 'train.steps = 0: must be a positive int'),
    (['train.steps = -3'], 'train.steps = -3: must be a positive int'),
    (["train.steps = 'abc'"], "train.steps = 'abc': must be a positive int"),
    (['train.steps = 2.5'], 'train.steps = 2.5: must be a positive int'),
    (['train.eval_frequency = 0'], 'train.eval_frequency = 0'),
    (
      ['train.use_memory_efficient_trainer = 3'],
      'train.use_memory_efficient_trainer = 3: must be one of False, True, 2',
    ),
    (
      [
        'train.permanent_checkpoint_frequency = 2',
        'train.permanent_checkpoints_at = [1, 2]',
      ],
      'train.permanent_checkpoint_frequency and '
      'train.permanent_checkpoints_at are both set',
    ),
    (
      ["trax_revplus.ReversibleSerialTrainer.on_non_finite = 'warn'"],
      'the trainer rejects its settings: on_non_finite must be one of '
      "('raise', 'skip', 'ignore'), got 'warn'; fix "
      'trax_revplus.ReversibleSerialTrainer.on_non_finite in the config',
    ),
    (
      ['trax_revplus.ReversibleSerialTrainer.batch_slices = 0'],
      'the trainer rejects its settings: batch_slices must be an int >= 1',
    ),
  ],
  ids=[
    'steps_0',
    'steps_negative',
    'steps_str',
    'steps_float',
    'eval_frequency_0',
    'trainer_mode',
    'permanent_both',
    'on_non_finite',
    'batch_slices',
  ],
)
def test_bad_settings_are_usage_errors_before_any_work(
  bindings, text, tmp_path, capsys
):
  _check_usage_error_before_any_work(
    capsys, tmp_path, text, *[f'--config={b}' for b in bindings]
  )


def _check_usage_error_before_any_work(capsys, tmp_path, text, *flags):
  """`train` on the tiny main job with `flags` ends in one line holding
  `text`, exit status 2, nothing built or written."""
  out_dir = tmp_path / 'out'
  code, out, err = _main(
    capsys,
    'train',
    f'--config_file={MAIN}',
    f'--output_dir={out_dir}',
    *[f'--config={b}' for b in TINY],
    *flags,
  )
  import trax_revplus  # pylint: disable=g-import-not-at-top

  trax_revplus.deactivate()
  assert code == 2, err
  assert text in _one_line_error(err)
  assert 'output in' not in out  # Nothing was built.
  assert not out_dir.exists()


_NOT_STEPS = 'must be a step N or steps N-M in the digits 0-9, e.g. 3-4'


@pytest.mark.parametrize(
  'value,text',
  [
    ('0', "--profile: steps count from 1, got '0'"),
    ('4-3', "--profile: must be steps N-M with N <= M, got '4-3'"),
    ('x', f"--profile: {_NOT_STEPS}, got 'x'"),
    ('3-', f"--profile: {_NOT_STEPS}, got '3-'"),
    ('1_0', f"--profile: {_NOT_STEPS}, got '1_0'"),
    ('7', '--profile=7 names steps past train.steps = 3; give steps up to 3'),
    (
      '3-9',
      '--profile=3-9 names steps past train.steps = 3; give steps up to 3',
    ),
  ],
  ids=[
    'zero',
    'backwards',
    'not_a_step',
    'open_range',
    'underscore',
    'one_step_past',
    'past_the_run',
  ],
)
def test_bad_profile_steps_are_usage_errors_before_any_work(
  value, text, tmp_path, capsys
):
  _check_usage_error_before_any_work(
    capsys, tmp_path, text, f'--profile={value}'
  )


# Numbers in flags, in the ASCII digits 0-9 only: Python's int() and
# float() also read other scripts' digits (U+0663 ARABIC-INDIC DIGIT THREE,
# U+FF13 FULLWIDTH DIGIT THREE), '_' between digits, '+' and spaces. The
# config file is missing: the flag is refused before it is looked for (a
# flag let through ends in 'config file not found', at once).
_MISSING = '--config_file=/no/such.gin'
_POSITIVE = 'must be a positive integer in the digits 0-9, got'


@pytest.mark.parametrize(
  'args,text',
  [
    (['train', '--profile=\u0663'], f"--profile: {_NOT_STEPS}, got '\u0663'"),
    (
      ['train', '--profile=1-\uff13'],
      f"--profile: {_NOT_STEPS}, got '1-\uff13'",
    ),
    (
      ['train', '--progress_every_n_steps=\u0663'],
      f"--progress_every_n_steps: {_POSITIVE} '\u0663'",
    ),
    (
      ['train', '--progress_every_n_steps=\uff13'],
      f"--progress_every_n_steps: {_POSITIVE} '\uff13'",
    ),
    (
      ['train', '--progress_every_n_steps=1_0'],
      f"--progress_every_n_steps: {_POSITIVE} '1_0'",
    ),
    (
      ['train', '--progress_every_n_steps=+3'],
      f"--progress_every_n_steps: {_POSITIVE} '+3'",
    ),
    (
      ['train', '--memory_log_every_n_steps= 3'],
      f"--memory_log_every_n_steps: {_POSITIVE} ' 3'",
    ),
    (
      ['train', '--num_processes=\u0662'],
      f"--num_processes: {_POSITIVE} '\u0662'",
    ),
    (
      ['train', '--process_id=\u0660'],
      "--process_id: must be an integer in the digits 0-9, got '\u0660'",
    ),
    (
      ['train', '--join_timeout_seconds=\u0663'],
      f"--join_timeout_seconds: {_POSITIVE} '\u0663'",
    ),
    (
      ['train', '--heartbeat_timeout_seconds=\u0663'],
      f"--heartbeat_timeout_seconds: {_POSITIVE} '\u0663'",
    ),
    (['compare', '--steps=\u0663'], f"--steps: {_POSITIVE} '\u0663'"),
    (
      ['compare', '--seed=\u0663'],
      "--seed: must be an integer in the digits 0-9, got '\u0663'",
    ),
    (['estimate', '--n_devices=\u0662'], f"--n_devices: {_POSITIVE} '\u0662'"),
    (
      ['launch', '--num_processes=\u0662', '--'],
      f"--num_processes: {_POSITIVE} '\u0662'",
    ),
    (
      ['launch', '--num_processes=2', '--max_local_processes=\u0662', '--'],
      f"--max_local_processes: {_POSITIVE} '\u0662'",
    ),
    (
      [
        'launch',
        '--num_processes=2',
        '--stop_grace_seconds=\u0661\u0660',
        '--',
      ],
      '--stop_grace_seconds: must be a positive number of seconds in the '
      "digits 0-9, e.g. 10 or 2.5, got '\u0661\u0660'",
    ),
    (
      ['launch', '--num_processes=2', '--', '--profile=\u0663'],
      f"--profile: {_NOT_STEPS}, got '\u0663'",
    ),
  ],
  ids=[
    'train_profile',
    'train_profile_range',
    'train_progress_arabic_indic',
    'train_progress_fullwidth',
    'train_progress_underscore',
    'train_progress_plus',
    'train_memory_log_space',
    'train_num_processes',
    'train_process_id',
    'train_join_timeout',
    'train_heartbeat_timeout',
    'compare_steps',
    'compare_seed',
    'estimate_n_devices',
    'launch_num_processes',
    'launch_max_local_processes',
    'launch_stop_grace_seconds',
    'launch_train_profile',
  ],
)
def test_numbers_in_flags_are_ascii_digits_only(args, text, capsys):
  code, out, err = _main(capsys, *args, _MISSING)
  assert code == 2, err
  assert _one_line_error(err) == (
    f'trax-revplus {args[0]}: error: argument {text}'
  )
  assert not out


def test_numbers_in_other_flags_are_ascii_digits_only(capsys):
  # Read after the flags: --device_memory by estimate, first thing;
  # --coordinator_address as the run joins (so called here directly).
  code, _, err = _main(
    capsys, 'estimate', _MISSING, '--device_memory=\u0661GiB'
  )
  assert code == 2
  assert _one_line_error(err).startswith(
    "trax-revplus estimate: error: --device_memory='\u0661GiB' is not a size"
  )
  with pytest.raises(DistributedUsageError) as raised:
    resolve_config(2, 0, 'localhost:\u0661\u0662\u0663\u0664')
  assert str(raised.value).startswith(
    "--coordinator_address='localhost:\u0661\u0662\u0663\u0664' is not "
    'HOST:PORT with a port in 1..65535'
  )
  assert raised.value.exit_code == 2


def test_numbers_in_flags_in_ascii_digits_are_read():
  flags = parser.parse(
    [
      'train',
      f'--config_file={MAIN}',
      '--profile=03-0012',
      '--progress_every_n_steps=007',
      '--process_id=0',
    ]
  )
  assert isinstance(flags, argparse.Namespace)
  assert (flags.profile.first, flags.profile.last) == (3, 12)
  assert (flags.progress_every_n_steps, flags.process_id) == (7, 0)
  flags = parser.parse(['compare', f'--config_file={MAIN}', '--seed=-5'])
  assert isinstance(flags, argparse.Namespace) and flags.seed == -5
  for grace, seconds in (
    ('10', 10.0),
    ('2.5', 2.5),
    ('.5', 0.5),
    ('1e1', 10.0),
  ):
    flags = parser.parse(
      [
        'launch',
        '--num_processes=2',
        f'--stop_grace_seconds={grace}',
        '--',
        f'--config_file={MAIN}',
      ]
    )
    assert isinstance(flags, argparse.Namespace)
    assert flags.stop_grace_seconds == seconds


def test_contradicting_repeated_flags_are_a_usage_error(capsys):
  code, _, err = _main(
    capsys,
    'train',
    f'--config_file={MAIN}',
    '--implementation=stock',
    '--implementation=revplus',
  )
  assert code == 2
  assert _one_line_error(err) == (
    'trax-revplus train: error: --implementation=stock and '
    '--implementation=revplus contradict each other; give '
    '--implementation once'
  )
  code, _, err = _main(
    capsys, 'compare', f'--config_file={MAIN}', '--steps=2', '--steps=3'
  )
  assert code == 2 and '--steps=2 and --steps=3' in _one_line_error(err)
  code, _, err = _main(
    capsys, 'plot-memory', '.', '--output=a.png', '--output=b.png'
  )
  assert code == 2 and 'contradict' in _one_line_error(err)


@pytest.mark.parametrize(
  'bindings,code,text',
  [
    (
      ['local_text_inputs.batch_size = 0'],
      2,
      'local_text_inputs.batch_size must be >= 1',
    ),
    (
      ['ReformerLM.d_attention_key = None', 'ReformerLM.n_heads = 3'],
      2,
      'cannot build the model ReformerLM: TypeError',
    ),
    # Raised by the model's constructor, before trax builds its Loop.
    (
      ['ReformerLM.ff_activation = None'],
      2,
      "cannot build the model ReformerLM: TypeError: 'NoneType' object is "
      'not callable',
    ),
    # Raised by the trainer as the Loop's first step plans, inside gin's
    # call of train.
    (
      ['trax_revplus.ReversibleSerialTrainer.parallel_heads = 3'],
      2,
      'trax-revplus train: error: the trainer rejects its settings: '
      'trax_revplus.ReversibleSerialTrainer.parallel_heads = 3 does not '
      'divide the 2 heads of SelfAttention (nor do they divide it); use 1, a '
      "divisor of 2 or a multiple of it, or 'auto'.",
    ),
  ],
  ids=['batch_size', 'model', 'model_constructor', 'parallel_heads'],
)
def test_errors_while_building_are_one_line(
  bindings, code, text, tmp_path, capsys
):
  got, out, err = _main(
    capsys,
    'train',
    f'--config_file={MAIN}',
    f'--output_dir={tmp_path / "out"}',
    *[f'--config={b}' for b in TINY + bindings],
  )
  import trax_revplus  # pylint: disable=g-import-not-at-top

  trax_revplus.deactivate()
  assert got == code, err
  line = _one_line_error(err)
  assert text in line
  assert 'In call to configurable' not in line  # gin's call site.
  if 'parallel_heads' in bindings[0]:
    assert line == text
  if 'd_attention_key = None' in bindings[0]:
    assert line.endswith('check ReformerLM.d_attention_key = None')
  if 'ff_activation = None' in bindings[0]:
    assert line.endswith('check ReformerLM.ff_activation = None')
  assert '== summary ==' not in out


def test_second_run_into_a_busy_output_dir_stops_at_once(tmp_path, capsys):
  # The lock is held here, as a first run would hold it (each lock is an
  # flock of its own open file, so one process can hold and be refused).
  from trax_revplus.cli import output_dir  # pylint: disable=g-import-not-at-top

  busy = tmp_path / 'busy'
  busy.mkdir()
  first = output_dir.OutputDirLock(str(busy), 'trax-revplus train')
  assert first.acquire() is None
  try:
    code, out, err = _main(
      capsys, 'train', f'--config_file={MAIN}', f'--output_dir={busy}'
    )
  finally:
    first.release()
  assert code == 1
  lock = busy / 'trax-revplus.lock'
  assert _one_line_error(err) == (
    f'trax-revplus train: error: output dir {busy} is in use by '
    f'process {os.getpid()} (trax-revplus train, since '
    f'{err.split(", since ")[1].split(")")[0]}), which holds {lock}; wait '
    f'for it to end, stop it, or give another --output_dir'
  )
  assert not out
  assert os.listdir(busy) == []


def test_known_warnings_go_to_the_log_only(tmp_path, capsys):
  import logging  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  import warnings  # pylint: disable=g-import-not-at-top

  log = logging.FileHandler(tmp_path / 'train.log')
  terminal = logging.StreamHandler(sys.stderr)
  with warnings.catch_warnings():
    warnings.simplefilter('always')
    with noise.route_warnings(log, terminal):
      warnings.warn(
        'jax.process_count has been renamed to '
        'jax.process_count. This alias will eventually be '
        'removed',
        DeprecationWarning,
        stacklevel=1,
      )
      warnings.warn(
        'GzipFile was opened for writing, but this will change '
        'in future Python releases.',
        FutureWarning,
        stacklevel=1,
      )
      warnings.warn('a new problem', RuntimeWarning, stacklevel=1)
  log.close()
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1
  assert err[0].startswith('warning: RuntimeWarning: a new problem (')
  assert err[0].endswith('test_cli.py:' + err[0].rsplit(':', 1)[1])
  logged = (tmp_path / 'train.log').read_text()
  for text in (
    'jax.process_count has been renamed',
    'GzipFile was opened',
    'a new problem',
  ):
    assert text in logged
  for entry in noise.KNOWN_NOISE:
    assert entry.reason and entry.source


def test_output_dir_lock_names_its_holder_and_takes_over_a_dead_one(tmp_path):
  import json  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  from trax_revplus.cli import output_dir  # pylint: disable=g-import-not-at-top

  lock_file = tmp_path / 'trax-revplus.lock'
  first = output_dir.OutputDirLock(str(tmp_path), 'first')
  assert first.acquire() is None
  second = output_dir.OutputDirLock(str(tmp_path), 'second')
  with pytest.raises(cli.UserError) as info:
    second.acquire()
  assert info.value.exit_code == 1
  assert str(info.value).startswith(
    f'output dir {tmp_path} is in use by process {os.getpid()} (first, since '
  )
  first.release()
  assert not lock_file.exists()
  # A holder that was killed leaves its record; the kernel freed its lock.
  dead = subprocess.run(
    [sys.executable, '-c', 'import os; print(os.getpid())'],
    capture_output=True,
    text=True,
    check=True,
  )
  pid = int(dead.stdout)
  lock_file.write_text(
    json.dumps({'pid': pid, 'command': 'trax-revplus train'})
  )
  warning = second.acquire()
  assert warning == (
    f'took over the lock of {tmp_path} left by process {pid} '
    f'(trax-revplus train), which ended without releasing it '
    f'(killed or crashed)'
  )
  assert json.loads(lock_file.read_text())['pid'] == os.getpid()
  second.release()
  assert not lock_file.exists()


def test_plot_memory_exit_statuses(tmp_path, capsys):
  code, _, err = _main(capsys, 'plot-memory', str(tmp_path))
  assert code == 2 and 'No memory log at' in _one_line_error(err)
  (tmp_path / 'memory.jsonl').write_text('')
  code, _, err = _main(capsys, 'plot-memory', str(tmp_path))
  assert code == 2 and 'holds no memory records' in _one_line_error(err)
  (tmp_path / 'memory.jsonl').write_text('{"step": 1, "pha')
  code, _, err = _main(capsys, 'plot-memory', str(tmp_path))
  assert code == 1 and 'is corrupt' in _one_line_error(err)
  (tmp_path / 'memory.jsonl').write_text(
    '{"step": 1, "phase": "forward", "host_rss_bytes": 1048576}\n'
  )
  not_a_dir = tmp_path / 'file'
  not_a_dir.write_text('x')
  code, _, err = _main(
    capsys, 'plot-memory', str(tmp_path), f'--output={not_a_dir}/m.png'
  )
  assert code == 1
  assert _one_line_error(err).startswith(
    f'trax-revplus plot-memory: error: cannot write '
    f'--output={not_a_dir}/m.png: '
  )
  code, out, err = _main(capsys, 'plot-memory', str(tmp_path))
  assert code == 0 and out.strip() == str(tmp_path / 'memory.png')


def test_trainer_settings_without_effect_are_named_in_a_warning(
  tmp_path, capsys
):
  # The default Trainer does not read trax_revplus's trainer settings. The
  # corpus glob matches nothing, so the run ends once its log exists.
  out_dir = tmp_path / 'out'
  code, _, err = _main(
    capsys,
    'train',
    f'--config_file={MAIN}',
    f'--output_dir={out_dir}',
    *[
      f'--config={b}'
      for b in TINY
      + [
        'train.use_memory_efficient_trainer = False',
        'trax_revplus.ReversibleSerialTrainer.segment_max_layers = 2',
        "local_text_inputs.paths = '/no/such/corpus/*.txt'",
      ]
    ],
  )
  import trax_revplus  # pylint: disable=g-import-not-at-top

  trax_revplus.deactivate()
  assert code == 1, err
  lines = err.strip().splitlines()
  assert lines[0] == (
    'trax-revplus train: warning: '
    'trax_revplus.ReversibleSerialTrainer.segment_max_layers has no '
    "effect: train.use_memory_efficient_trainer is False (trax's "
    "default), so the run trains with trax's default Trainer; set it to "
    "True (or 2) to train with trax_revplus's ReversibleSerialTrainer"
  )
  assert lines[-1].startswith('trax-revplus train: error: ')
  assert len(lines) == 2, err
  assert (
    'segment_max_layers has no effect' in (out_dir / 'train.log').read_text()
  )


def test_trainer_settings_in_use_get_no_warning(tmp_path, capsys):
  code, _, err = _main(
    capsys,
    'train',
    f'--config_file={MAIN}',
    f'--output_dir={tmp_path / "out"}',
    *[
      f'--config={b}'
      for b in TINY
      + [
        'trax_revplus.ReversibleSerialTrainer.segment_max_layers = 2',
        "local_text_inputs.paths = '/no/such/corpus/*.txt'",
      ]
    ],
  )
  import trax_revplus  # pylint: disable=g-import-not-at-top

  trax_revplus.deactivate()
  assert code == 1
  assert 'warning' not in err
  assert len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_an_error_in_the_first_step_is_the_last_line(tmp_path, capsys):
  # A budget no plan fits stops the first step; the trainer's memory log
  # is closed within the run (its last record is 'end'), so nothing it
  # logs comes after the error line.
  import json  # pylint: disable=g-import-not-at-top

  out_dir = tmp_path / 'out'
  code, _, err = _main(
    capsys,
    'train',
    f'--config_file={MAIN}',
    f'--output_dir={out_dir}',
    *[
      f'--config={b}'
      for b in TINY
      + [
        'trax_revplus.ReversibleSerialTrainer.device_memory_budget_bytes = 1000'
      ]
    ],
  )
  import trax_revplus  # pylint: disable=g-import-not-at-top

  trax_revplus.deactivate()
  assert code == 2, err
  line = _one_line_error(err)
  assert line.startswith(
    'trax-revplus train: error: DeviceMemoryBudgetError:'
    ' no plan fits device_memory_budget_bytes=1000'
  )
  records = [
    json.loads(l) for l in (out_dir / 'memory.jsonl').read_text().splitlines()
  ]
  assert records[-1]['phase'] == 'end'
  import gc  # pylint: disable=g-import-not-at-top

  gc.collect()  # Nothing left to close, and so to print.
  assert not capsys.readouterr().err


def test_unbound_train_settings_keep_trax_defaults(stock_trax_and_empty_gin):
  # Only a model bound: train.steps and train.eval_steps keep trax's valid
  # defaults (bound to None, they are mistakes).
  from trax_revplus.cli import settings  # pylint: disable=g-import-not-at-top

  cli.import_trax_quietly()
  cli.parse_configs([], ['train.model = @trax.models.ReformerLM'])
  settings.check_train_settings()
  cli.parse_configs(
    [], ['train.model = @trax.models.ReformerLM', 'train.eval_steps = None']
  )
  with pytest.raises(
    cli.UserError, match='train.eval_steps = None: must be a positive int'
  ):
    settings.check_train_settings()


@pytest.mark.parametrize(
  'signum,ignored_before,inside_except',
  [(15, False, False), (2, True, False), (15, False, True)],
  ids=['sigterm', 'sigint_inherited_ignored', 'sigterm_in_a_broad_except'],
)
def test_a_signal_ends_any_command_in_one_line(
  signum, ignored_before, inside_except, tmp_path, capsys, monkeypatch
):
  import signal  # pylint: disable=g-import-not-at-top
  import threading  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top

  if threading.current_thread() is not threading.main_thread():
    pytest.skip('signal handlers are installed from the main thread only')
  from trax_revplus.cli import plot_memory  # pylint: disable=g-import-not-at-top

  def interrupted(unused_flags):
    try:
      os.kill(os.getpid(), signum)
      time.sleep(600)  # The handler raises from here at once.
    except Exception:  # pylint: disable=broad-except
      # As code that reports any error does (trax's layer init, estimate's
      # accounting): the stop must pass through it.
      if not inside_except:
        raise
    raise AssertionError('the signal did not end the command')

  monkeypatch.setattr(plot_memory, 'run', interrupted)
  previous = signal.signal(
    signum, signal.SIG_IGN if ignored_before else signal.getsignal(signum)
  )
  try:
    code, out, err = _main(capsys, 'plot-memory', str(tmp_path))
    after = signal.getsignal(signum)
  finally:
    signal.signal(signum, previous)
  name = signal.Signals(signum).name
  assert code == 128 + signum
  assert _one_line_error(err) == (
    f'trax-revplus plot-memory: error: interrupted by {name}'
  )
  assert not out
  assert after == (signal.SIG_IGN if ignored_before else previous)


def test_warnings_on_the_terminal_are_the_commands_own_lines(tmp_path, capsys):
  # absl's warnings (e.g. a checkpoint's) and Python's alike, one line each.
  import warnings  # pylint: disable=g-import-not-at-top

  from absl import logging  # pylint: disable=g-import-not-at-top

  from trax_revplus.cli import run_log  # pylint: disable=g-import-not-at-top

  with run_log.run_logging(str(tmp_path), ''):
    logging.warning(
      'checkpoint %s is damaged;\n  loading the previous set', 'X'
    )
    warnings.warn('a new problem', RuntimeWarning, stacklevel=1)
  err = capsys.readouterr().err.strip().splitlines()
  assert err[0] == (
    'trax-revplus train: warning: checkpoint X is damaged; loading the '
    'previous set'
  )
  assert err[1].startswith(
    'trax-revplus train: warning: RuntimeWarning: a new problem ('
  )
  assert len(err) == 2
  logged = (tmp_path / 'train.log').read_text()
  assert 'checkpoint X is damaged' in logged and 'a new problem' in logged
