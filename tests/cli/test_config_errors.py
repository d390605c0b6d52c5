"""A config gin cannot parse or apply, in every command that reads one.

Each mistake is one line, exit status 2, naming the file or binding and
the position in it, before anything runs (no compilation, no training
process, no launched process). `launch` checks the syntax before it
starts the processes; the names are looked up in each process, as
`train` does (tests/multiprocess/).
"""

import pytest

from cli_cases import MAIN
from trax_revplus import cli
from trax_revplus import compare
from trax_revplus import device_memory
from trax_revplus.multiprocess import launcher

_MACRO_FIX = 'bind it (e.g. --config="no_such_macro = ..."), or fix the name'


def _files(tmp_path):
  """Config files with mistakes: {name: path}."""
  (tmp_path / 'open_bracket.gin').write_text(
    'ReformerLM.n_layers = 1\nReformerLM.d_model = (128\n'
  )
  (tmp_path / 'includes.gin').write_text(
    f"include '{MAIN}'\ninclude 'open_bracket.gin'\n"
  )
  (tmp_path / 'syntax.gin').write_text('train.steps = = 3\n')
  (tmp_path / 'macro.gin').write_text(
    f"include '{MAIN}'\ntrain.eval_steps = %no_such_macro\n"
  )
  return {
    name: str(tmp_path / f'{name}.gin')
    for name in ('open_bracket', 'includes', 'syntax', 'macro')
  }


# (config files, bindings, the line after 'error: '); `{name}` is the path
# of that file of `_files`.
_CASES = {
  'binding_open_bracket': (
    [MAIN],
    ['ReformerLM.d_model = (128'],
    "cannot apply --config='ReformerLM.d_model = (128': column 22: "
    "'(' is never closed",
  ),
  'binding_open_bracket_line_2': (
    [MAIN],
    ['train.steps = 3\ntrain.eval_steps = [1,'],
    "cannot apply --config='train.steps = 3\\ntrain.eval_steps = [1,': "
    "line 2, column 20: '[' is never closed",
  ),
  'file_open_bracket': (
    ['{open_bracket}'],
    [],
    "cannot parse config file {open_bracket}: line 2, column 22: '(' is "
    'never closed',
  ),
  'included_file_open_bracket': (
    ['{includes}'],
    [],
    'cannot parse config file {includes}: {open_bracket}, line 2, '
    "column 22: '(' is never closed",
  ),
  'file_syntax': (
    ['{syntax}'],
    [],
    'cannot parse config file {syntax}: line 1, column 15: Unable to '
    'parse value.',
  ),
  'binding_syntax': (
    [MAIN],
    ['train.steps == 3'],
    "cannot apply --config='train.steps == 3': column 13: Couldn't parse "
    "statement, expected ':' or '='.",
  ),
  'unknown_configurable': (
    [MAIN],
    ['nosuch_thing.size = 1'],
    "cannot apply --config='nosuch_thing.size = 1': column 1: No "
    "configurable matching 'nosuch_thing'.",
  ),
  'unknown_parameter': (
    [MAIN],
    ['ReformerLM.d_modle = 8'],
    "cannot apply --config='ReformerLM.d_modle = 8': column 12: "
    "Configurable 'ReformerLM' doesn't have a parameter named "
    "'d_modle'.",
  ),
  'unbound_macro_in_binding': (
    [MAIN],
    ['train.steps = %no_such_macro'],
    "cannot apply --config='train.steps = %no_such_macro': column 15: "
    f'macro %no_such_macro is not bound; {_MACRO_FIX}',
  ),
  'unbound_macro_in_file': (
    ['{macro}'],
    [],
    'cannot parse config file {macro}: line 2, column 20: macro '
    f'%no_such_macro is not bound; {_MACRO_FIX}',
  ),
}
# What `launch` checks itself: the text, not the names in it.
_SYNTAX = (
  'binding_open_bracket',
  'binding_open_bracket_line_2',
  'file_open_bracket',
  'included_file_open_bracket',
  'file_syntax',
  'binding_syntax',
)


@pytest.fixture(name='nothing_runs')
def fixture_nothing_runs(monkeypatch):
  """Fails the test if a command gets past reading its config."""

  def ran(*unused_args, **unused_kwargs):
    raise AssertionError('the command went on after a bad config')

  monkeypatch.setattr(device_memory, 'account', ran)
  monkeypatch.setattr(compare.runs, 'run_streaming', ran)
  monkeypatch.setattr(launcher, 'launch', ran)


def _command_line(command, config_files, bindings, output_dir):
  flags = [f'--config_file={f}' for f in config_files]
  flags += [f'--config={b}' for b in bindings]
  if command == 'estimate':
    return [command, *flags]
  flags.append(f'--output_dir={output_dir}')
  if command == 'launch':
    return [command, '--num_processes=2', '--', *flags]
  return [command, *flags]


# compare finds a mistake in a process of its own (it imports trax there,
# seconds each): two kinds of mistake run in the default suite, the rest
# with the tests marked slow.
_COMPARE_IN_SUITE = ('file_syntax', 'unknown_parameter')


def _command_and_case():
  for case in _CASES:
    for command in ('train', 'estimate', 'compare', 'launch'):
      slow = command == 'compare' and case not in _COMPARE_IN_SUITE
      yield pytest.param(
        command,
        case,
        id=f'{case}-{command}',
        marks=[pytest.mark.slow] if slow else [],
      )


@pytest.mark.parametrize('command,case', list(_command_and_case()))
def test_a_config_mistake_is_one_line_naming_where(
  command, case, tmp_path, capsys, nothing_runs
):
  del nothing_runs
  if command == 'launch' and case not in _SYNTAX:
    pytest.skip('each process looks the names up, as train does')
  files = _files(tmp_path)
  config_files, bindings, line = _CASES[case]
  config_files = [f.format(**files) for f in config_files]
  output_dir = tmp_path / 'out'
  code = cli.main(
    [
      'trax-revplus',
      *_command_line(command, config_files, bindings, output_dir),
    ]
  )
  out, err = capsys.readouterr()
  import trax_revplus  # pylint: disable=g-import-not-at-top

  trax_revplus.deactivate()
  assert code == 2, err
  assert err.splitlines() == [
    f'trax-revplus {command}: error: {line.format(**files)}'
  ], err
  assert not out
  assert not output_dir.exists()
