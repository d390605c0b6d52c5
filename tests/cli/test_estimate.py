"""`trax-revplus estimate` on the tiny main job: the table, the JSON, the
plan under a device memory, and one-line errors, in-process.

References: the default Trainer's and stock's figures from the accounting
of their own one_step programs (tests/test_device_memory.py checks those
against real steps); a device memory just below trax_revplus's peak must
not fit. For a config `train` rejects, `train` itself is the reference:
estimate must end with the same status and line, and before compiling
anything (the accounting is replaced by a test failure).
"""

import json
import os

import pytest

from cli_cases import MAIN
from cli_cases import TINY_MODEL
from trax_revplus import cli
from trax_revplus import device_memory
from trax_revplus.cli import estimate
from trax_revplus.cli import estimate_report

TINY = ['sequence_length = 32'] + TINY_MODEL
PREFIX = 'trax-revplus estimate: error: '


def _estimate(capsys, *flags, bindings=()):
  code = cli.main(
    [
      'trax-revplus',
      'estimate',
      f'--config_file={MAIN}',
      *[f'--config={b}' for b in TINY + list(bindings)],
      *flags,
    ]
  )
  out, err = capsys.readouterr()
  import trax_revplus  # pylint: disable=g-import-not-at-top

  trax_revplus.deactivate()
  return code, out, err


# The lines the planner prints while it plans (`planning_log`), and
# while trax's trainers are accounted (`three_trainers`).
_PROGRESS = ('planning: ', 'planned in ', 'least plan: ', 'accounting: ')


def _one_line(err):
  """The one line on stderr besides the planner's progress."""
  lines = [
    line for line in err.strip().splitlines() if not line.startswith(_PROGRESS)
  ]
  assert len(lines) == 1, err
  assert 'Traceback' not in err
  return lines[0]


@pytest.fixture(name='no_compile')
def fixture_no_compile(monkeypatch):
  """Fails the test if estimate gets as far as accounting a trainer."""

  def compiled(*unused_args, **unused_kwargs):
    raise AssertionError('estimate compiled before rejecting the config')

  monkeypatch.setattr(device_memory, 'account', compiled)


@pytest.mark.slow
def test_estimate_table_and_json(tmp_path, capsys):
  path = tmp_path / 'estimate.json'
  code, out, err = _estimate(
    capsys, '--device_memory=1GiB', '--least', f'--json={path}'
  )
  assert code == 0, err
  # Known third-party noise from compiling stock's programs stays off:
  # stderr holds the planner's progress alone.
  assert err and all(line.startswith(_PROGRESS) for line in err.splitlines())
  assert 'backend cpu' in out
  assert 'device memory: 1.0 GiB (1073741824 bytes)' in out
  for name in estimate_report.TRAINERS:
    assert f'\n{name} ' in out
  assert 'revplus plan: 1 call per step (fits); as gin bindings:\n' in out
  data = json.loads(path.read_text())
  assert data['backend'] == 'cpu'
  assert data['device_memory_bytes'] == 2**30
  assert set(data['trainers']) == {'default', 'stock', 'revplus'}
  for name, figures in data['trainers'].items():
    assert 'error' not in figures, (name, figures)
    for key in (
      'peak_device_bytes',
      'host_weights_and_slots_bytes',
      'largest_program_bytes',
    ):
      assert isinstance(figures[key], int) and figures[key] >= 0, key
    assert figures['fits'] is True
    assert figures['peak_device_bytes'] >= figures['largest_program_bytes']
  assert data['trainers']['default']['host_weights_and_slots_bytes'] == 0
  rev = data['trainers']['revplus']
  assert rev['host_weights_and_slots_bytes'] == (
    rev['weights_bytes'] + rev['slots_bytes']
  )
  _check_plans(out, rev, 2**30)
  # The least plan (saved inputs and states on the host, as stock keeps
  # them) needs no more than stock's step.
  assert rev['least_plan']['saved_on_host'] or rev['least_plan']['fused_layers']
  assert (
    rev['min_peak_device_bytes']
    <= (data['trainers']['stock']['peak_device_bytes'])
  )
  assert rev['planning']['programs_compiled'] >= 1
  assert rev['planning']['plan_compile_seconds'] <= rev['planning']['seconds']
  assert 'revplus planning: ' in out
  assert os.listdir(tmp_path) == ['estimate.json']

  # Just below the smaller peak: that trainer does not fit, and the JSON
  # goes through a link to its target, the link kept.
  need = min(
    rev['peak_device_bytes'], data['trainers']['stock']['peak_device_bytes']
  )
  link = tmp_path / 'link.json'
  link.symlink_to('estimate.json')
  code, out, err = _estimate(
    capsys, f'--device_memory={need - 1}', f'--json={link}'
  )
  assert code == 0, err
  assert f'({need - 1} bytes)' in out
  assert link.is_symlink()
  data = json.loads(path.read_text())
  assert data['device_memory_bytes'] == need - 1
  assert data['trainers']['stock']['fits'] is (
    data['trainers']['stock']['peak_device_bytes'] <= need - 1
  )
  rev_small = data['trainers']['revplus']
  _check_plans(out, rev_small, need - 1)
  if rev_small['peak_device_bytes'] > need - 1:
    assert rev_small['fits'] is False
    assert 'no plan fits' in rev_small['plan_line']
    # Nothing fits: the least is weighed without --least.
    assert rev_small['min_peak_device_bytes'] == rev_small['peak_device_bytes']
  else:
    # A plan fits and --least was not given: the least is not weighed.
    assert rev_small['min_peak_device_bytes'] is None
    assert 'revplus least device/step: not weighed' in out
  assert sorted(os.listdir(tmp_path)) == ['estimate.json', 'link.json']


def _check_plans(out, rev, budget_bytes):
  """The plans revplus weighed, printed and in its JSON: the chosen one
  (where one fits) is the plan it ran, marked once; fits is the peak
  within the budget; no step time is measured."""
  plans = rev['plans']
  assert plans
  chosen = [p for p in plans if p['chosen']]
  if rev['fits']:
    [plan] = chosen
    assert plan['peak_device_bytes'] == rev['peak_device_bytes']
    assert (
      dict(plan['settings'], n_calls=plan['calls_per_step']) == (rev['plan'])
    )
    # The plan's calls are the accounted step's (units of swaps alone make
    # no call).
    assert rev['plan']['n_calls'] == rev['n_calls']
    assert plan['describe'] in rev['plan_line']
  else:
    assert not chosen
  for plan in plans:
    assert plan['fits'] is (plan['peak_device_bytes'] <= budget_bytes)
    assert isinstance(plan['calls_per_step'], int)
    assert plan['calls_per_step'] >= 1
    assert plan['step_seconds'] is None
  listed = out.split('revplus plans weighed (* the chosen plan):\n')[1]
  rows = listed.splitlines()[1:]
  assert len(rows) == len(plans)
  assert [row[0] for row in rows].count('*') == len(chosen)
  for row, plan in zip(rows, plans):
    assert f'{plan["peak_device_bytes"]} B (' in row
    assert row.endswith(plan['describe'].rsplit(', ', 1)[0])
    assert ' yes ' in row if plan['fits'] else ' no ' in row
    assert row.split()[-1].startswith('params_on_device=')


@pytest.mark.slow
@pytest.mark.parametrize(
  'device_memory', ['1GiB', '200KiB'], ids=['fused', 'segments_and_chunks']
)
def test_plan_bindings_give_the_same_plan(device_memory, tmp_path, capsys):
  """The bindings estimate prints for its plan, given back to it under the
  same device memory, give that plan."""
  first, second = tmp_path / 'first.json', tmp_path / 'second.json'
  code, out, err = _estimate(
    capsys, f'--device_memory={device_memory}', f'--json={first}'
  )
  assert code == 0, err
  listed = out.split('; as gin bindings:\n', 1)[1].splitlines()
  bindings = [
    line
    for line in listed
    if line.startswith('trax_revplus.ReversibleSerialTrainer.')
  ]
  assert bindings and listed[len(bindings)].startswith(
    'revplus plan, left to the planner (no binding pins it): '
  )
  code, _, err = _estimate(
    capsys,
    f'--device_memory={device_memory}',
    f'--json={second}',
    bindings=bindings,
  )
  assert code == 0, err
  plans = [
    json.loads(path.read_text())['trainers']['revplus']
    for path in (first, second)
  ]
  assert plans[1]['plan'] == plans[0]['plan']
  assert plans[1]['peak_device_bytes'] == plans[0]['peak_device_bytes']


@pytest.mark.slow
def test_device_memory_overriding_the_config_says_so(tmp_path, capsys):
  code, out, err = _estimate(
    capsys,
    '--device_memory=1GiB',
    f'--json={tmp_path / "e.json"}',
    bindings=[
      'trax_revplus.ReversibleSerialTrainer.'
      'device_memory_budget_bytes = 100000000'
    ],
  )
  assert code == 0, err
  assert _one_line(err) == (
    'trax-revplus estimate: warning: --device_memory=1073741824 bytes '
    "overrides the config's trax_revplus.ReversibleSerialTrainer."
    'device_memory_budget_bytes = 100000000; trax_revplus plans for '
    '--device_memory'
  )
  assert (
    json.loads((tmp_path / 'e.json').read_text())['device_memory_bytes']
    == 2**30
  )
  assert 'device memory: 1.0 GiB (1073741824 bytes)' in out


_GIVE_SIZE = ': give bytes or a number with a unit, e.g. 16GiB, 40GB, 512MiB'
_GIVE_ONE = '; give the memory of one device, e.g. 16GiB'


@pytest.mark.parametrize(
  'flag,text',
  [
    ('--device_memory=abc', "--device_memory='abc' is not a size" + _GIVE_SIZE),
    ('--device_memory=0', "--device_memory='0' is zero" + _GIVE_ONE),
    (
      '--device_memory=-5GiB',
      "--device_memory='-5GiB' is not a size" + _GIVE_SIZE,
    ),
    (
      '--device_memory=0.5',
      "--device_memory='0.5' is not a whole number of "
      'bytes; give whole bytes or a unit, e.g. 512MiB',
    ),
    (
      '--device_memory=1e30',
      "--device_memory='1e30' is more than any device "
      'holds (at most 1125899906842624 bytes, 1 PiB)' + _GIVE_ONE,
    ),
    (
      '--n_devices=0',
      'argument --n_devices: must be a positive integer, got 0',
    ),
    ('--json={dir}', '--json={dir} is a directory; give the path of a file'),
  ],
  ids=[
    'not_a_size',
    'zero',
    'negative',
    'half_a_byte',
    'too_large',
    'no_devices',
    'json_directory',
  ],
)
def test_bad_flags_are_one_line_usage_errors(
  flag, text, tmp_path, capsys, no_compile
):
  del no_compile
  flag, text = flag.format(dir=tmp_path), text.format(dir=tmp_path)
  extra = [] if flag.startswith('--json') else [f'--json={tmp_path}/e.json']
  code, out, err = _estimate(capsys, flag, *extra)
  assert code == 2, err
  assert _one_line(err) == PREFIX + text
  assert not out
  assert os.listdir(tmp_path) == []


def test_an_unwritable_json_path_is_refused_before_compiling(
  tmp_path, capsys, no_compile
):
  del no_compile
  code, out, err = _estimate(capsys, f'--json={tmp_path}/no/e.json')
  assert code == 1
  assert _one_line(err) == (
    f'{PREFIX}cannot write --json={tmp_path}/no/'
    f'e.json: directory {tmp_path}/no does not exist;'
    f' create it first'
  )
  assert not out


def test_parse_bytes():
  assert estimate.parse_bytes('16GiB') == 16 * 2**30
  assert estimate.parse_bytes('40GB') == 40 * 10**9
  assert estimate.parse_bytes('512 mib') == 512 * 2**20
  assert estimate.parse_bytes('1e9') == 10**9
  assert estimate.parse_bytes('1.5GiB') == 3 * 2**29
  # Exactly, where a float would round: 2**50 - 1 has 16 digits.
  assert estimate.parse_bytes(str(2**50 - 1)) == 2**50 - 1
  assert estimate.parse_bytes('1125899906842623B') == 2**50 - 1
  for bad in (
    '',
    'GiB',
    '1 parsec',
    '0',
    '0.5',
    '1e-9',
    '1e30',
    '1e999999999',
    '1.0000000000000000000000000001',
  ):
    with pytest.raises(ValueError):
      estimate.parse_bytes(bad)


# A config train rejects: estimate rejects it with train's status and line,
# before anything is compiled.
_REJECTED = {
  'trainer_mode': (
    ['train.use_memory_efficient_trainer = 3'],
    2,
    'train.use_memory_efficient_trainer = 3: must be one of False, True, 2',
  ),
  'on_non_finite': (
    ["trax_revplus.ReversibleSerialTrainer.on_non_finite = 'warn'"],
    2,
    'the trainer rejects its settings: on_non_finite must be one of '
    "('raise', 'skip', 'ignore'), got 'warn'; fix "
    'trax_revplus.ReversibleSerialTrainer.on_non_finite in the config',
  ),
  'batch_slices': (
    ['trax_revplus.ReversibleSerialTrainer.batch_slices = 3'],
    2,
    'BatchSlicesError: trax_revplus.ReversibleSerialTrainer.batch_slices'
    ' = 3 does not divide the 2 rows of the batch each device gets; use '
    'one of [1, 2], or a batch whose rows per device are a multiple of '
    '3.',
  ),
  'model': (
    ['ReformerLM.d_attention_key = None', 'ReformerLM.n_heads = 3'],
    2,
    'cannot build the model ReformerLM: TypeError',
  ),
  'corpus': (
    ["local_text_inputs.paths = '/no/such/corpus/*.txt'"],
    1,
    "Path or glob '/no/such/corpus/*.txt' matches no file",
  ),
  'no_model': (['train.model = None'], 2, 'no model configured'),
}


@pytest.mark.parametrize('case', sorted(_REJECTED))
def test_estimate_rejects_what_train_rejects(
  case, tmp_path, capsys, no_compile
):
  del no_compile
  bindings, code, text = _REJECTED[case]
  got, out, err = _estimate(
    capsys, f'--json={tmp_path / "e.json"}', bindings=bindings
  )
  estimate_line = _one_line(err)
  assert got == code, err
  assert estimate_line.startswith(PREFIX)
  assert text in estimate_line
  assert not out
  assert not (tmp_path / 'e.json').exists()
  # The reference: train, on the same config.
  got, _, err = _main_train(capsys, tmp_path / 'run', bindings)
  train_line = _one_line(err)
  assert got == code, err
  assert train_line.startswith('trax-revplus train: error: ')
  assert (
    train_line[len('trax-revplus train: error: ') :]
    == estimate_line[len(PREFIX) :]
  )


def test_n_devices_the_host_lacks_is_one_line(tmp_path, capsys, no_compile):
  del no_compile
  code, _, err = _estimate(
    capsys, '--n_devices=64', f'--json={tmp_path / "e.json"}'
  )
  assert code == 2
  assert _one_line(err).startswith(
    f'{PREFIX}DeviceCountError: n_devices=64 but this process has '
  )


def _main_train(capsys, output_dir, bindings):
  code = cli.main(
    [
      'trax-revplus',
      'train',
      f'--config_file={MAIN}',
      f'--output_dir={output_dir}',
      '--config=train.steps = 1',
      *[f'--config={b}' for b in TINY + list(bindings)],
    ]
  )
  out, err = capsys.readouterr()
  import trax_revplus  # pylint: disable=g-import-not-at-top

  trax_revplus.deactivate()
  return code, out, err


def test_sequence_chunks_the_sequence_refutes_stop_before_other_trainers(
  tmp_path, capsys, monkeypatch
):
  """The sequence length is known once the model's stack is traced: the
  revplus trainer is accounted first, and its SequenceChunksError is
  train's line and status, before trax's trainers compile."""
  accounted = []
  account = device_memory.account

  def recording(trainer, *args, **kwargs):
    accounted.append(trainer)
    return account(trainer, *args, **kwargs)

  monkeypatch.setattr(device_memory, 'account', recording)
  bindings = ['trax_revplus.ReversibleSerialTrainer.sequence_chunks = 3']
  got, out, err = _estimate(
    capsys, f'--json={tmp_path / "e.json"}', bindings=bindings
  )
  line = _one_line(err)
  assert got == 2, err
  assert line == (
    f'{PREFIX}SequenceChunksError: trax_revplus.ReversibleSerialTrainer.'
    'sequence_chunks = 3 does not divide the sequence length 32 of the '
    "loss layer's inputs; use a divisor of 32, e.g. one of [1, 2, 4, 8, "
    '16, 32].'
  )
  assert accounted == ['revplus']
  assert not out
  assert not (tmp_path / 'e.json').exists()
  got, _, err = _main_train(capsys, tmp_path / 'run', bindings)
  assert got == 2, err
  assert _one_line(err).endswith(line[len(PREFIX) :])
