"""The `trax-revplus` command: training runs, help, and one-line errors."""

import os
import subprocess

import numpy as np
import pytest

from trax_revplus import cli

from cli_cases import cli_command
from cli_cases import REPO
from cli_cases import MAIN
from cli_cases import STOCK
from cli_cases import TINY_MODEL

# The main job shrunk to a few steps of a tiny model: 3 steps, eval and
# checkpoint at steps 1 and 2, so the CLI saves the final checkpoint itself.
TINY = ['train.steps = 3', 'train.eval_frequency = 2',
        'sequence_length = 32'] + TINY_MODEL


def _run(args, timeout=600):
  return subprocess.run(cli_command() + args, capture_output=True, text=True,
                        timeout=timeout, cwd=REPO, check=False)


def _train_args(config, output_dir):
  return (['train', f'--config_file={config}', f'--output_dir={output_dir}',
           '--progress_every_n_steps=1'] +
          [f'--config={binding}' for binding in TINY])


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
  for step in (1, 2, 3):
    assert f'step {step}/3  loss ' in result.stdout
  rows = _summary(result.stdout)
  assert rows['steps'].startswith('3 ')
  assert rows['final eval loss'].endswith('(step 2)')
  checkpoint = os.path.join(output_dir, 'model.pkl.gz')
  assert rows['checkpoint'] == f'{checkpoint} (step 3)'
  assert os.path.exists(os.path.join(output_dir, 'model.weights.npy.gz'))
  assert os.path.getsize(os.path.join(output_dir, 'train.log')) > 0
  return rows


def test_stock_config_trains_through_the_cli(tmp_path):
  output_dir = str(tmp_path / 'stock')
  rows = _check_trained(_run(_train_args(STOCK, output_dir)), output_dir)
  assert rows['trainer'] == 'trax.optimizers.trainer.ReversibleSerialTrainer'
  assert 'trax_revplus' not in rows['reversible layers']
  assert 'trax.layers.reversible.ReversibleHalfResidual x2' in (
      rows['reversible layers'])


def test_activated_twin_trains_and_its_checkpoint_loads(tmp_path):
  output_dir = str(tmp_path / 'ours')
  rows = _check_trained(_run(_train_args(MAIN, output_dir)), output_dir)
  assert rows['trainer'] == 'trax_revplus.trainer.ReversibleSerialTrainer'
  assert 'trax_revplus.layers.ReversibleHalfResidual x2' in (
      rows['reversible layers'])
  assert 'trax.layers.reversible' not in rows['reversible layers']

  # The checkpoint loads into the same model with Layer.init_from_file.
  from trax import layers as tl  # pylint: disable=g-import-not-at-top
  from trax import models  # pylint: disable=g-import-not-at-top
  from trax import shapes  # pylint: disable=g-import-not-at-top
  import trax_revplus  # pylint: disable=g-import-not-at-top
  cli.parse_configs([MAIN], TINY)
  try:
    model = models.ReformerLM(mode='eval')
    model.init_from_file(os.path.join(output_dir, 'model.pkl.gz'),
                         weights_only=True,
                         input_signature=shapes.ShapeDtype((1, 32), np.int32))
    loaded, _ = tl.flatten_weights_and_state(model.weights, model.state)
    saved = tl.np_from_file(os.path.join(output_dir, 'model.weights.npy.gz'),
                            compresslevel=0)
    assert len(loaded) == len(saved)
    for a, b in zip(loaded, saved):
      np.testing.assert_array_equal(np.asarray(a), b)
  finally:
    import gin  # pylint: disable=g-import-not-at-top
    gin.clear_config()
    trax_revplus.deactivate()


def _one_line_error(err):
  lines = err.strip().splitlines()
  assert len(lines) == 1, err
  assert 'Traceback' not in err
  return lines[0]


def test_errors_before_trax_import_are_fast_and_one_line(tmp_path):
  result = _run(['train', f'--config_file={tmp_path}/missing.gin'],
                timeout=60)
  assert result.returncode == 2
  line = _one_line_error(result.stderr)
  assert line == (f'trax-revplus train: error: config file not found: '
                  f'{tmp_path}/missing.gin')


def test_unknown_binding_is_one_line_in_a_fresh_process(tmp_path):
  result = _run(['train', f'--config_file={STOCK}',
                 '--config=train.no_such_setting = 3',
                 f'--output_dir={tmp_path}/out'])
  assert result.returncode == 2
  line = _one_line_error(result.stderr)
  assert 'no_such_setting' in line
  assert not os.path.exists(tmp_path / 'out')


def _main(capsys, *args):
  code = cli.main(['trax-revplus'] + list(args))
  out, err = capsys.readouterr()
  return code, out, err


@pytest.fixture(name='bad_gin')
def fixture_bad_gin(tmp_path):
  path = tmp_path / 'bad.gin'
  path.write_text('train.steps = = 3\nthis is not gin (\n')
  return str(path)


@pytest.mark.parametrize('case', [
    'missing_config', 'unparsable_config', 'unknown_configurable',
    'unknown_parameter', 'unwritable_output_dir', 'empty_corpus_glob',
    'no_model', 'bad_flag', 'stray_argument'])
def test_user_errors_are_one_line_without_traceback(case, tmp_path, bad_gin,
                                                    capsys):
  not_a_dir = tmp_path / 'file'
  not_a_dir.write_text('x')
  out_dir = f'--output_dir={tmp_path}/out'
  args, code, text = {
      'missing_config': (['--config_file=/no/such.gin', out_dir], 2,
                         'config file not found: /no/such.gin'),
      'unparsable_config': ([f'--config_file={bad_gin}', out_dir], 2,
                            f'cannot parse config file {bad_gin}'),
      'unknown_configurable': ([f'--config_file={STOCK}', out_dir,
                                '--config=nosuch_thing.size = 1'], 2,
                               'nosuch_thing'),
      'unknown_parameter': ([f'--config_file={STOCK}', out_dir,
                             '--config=ReformerLM.d_modle = 8'], 2,
                            'd_modle'),
      'unwritable_output_dir': ([f'--config_file={STOCK}',
                                 f'--output_dir={not_a_dir}/run'], 1,
                                'is not a directory'),
      'empty_corpus_glob': ([f'--config_file={STOCK}', out_dir,
                             f"--config=local_text_inputs.paths = "
                             f"'{tmp_path}/none/*.txt'"], 1,
                            'none/*.txt'),
      'no_model': (['--config=train.steps = 1', out_dir], 2,
                   'no model configured'),
      'bad_flag': (['--config_fil=x.gin'], 2, 'config_fil'),
      'stray_argument': ([f'--config_file={STOCK}', 'extra'], 2,
                         'unexpected arguments: extra'),
  }[case]
  got, out, err = _main(capsys, 'train', *args)
  assert got == code, err
  line = _one_line_error(err)
  assert line.startswith('trax-revplus train: error: ')
  assert text in line
  assert '== summary ==' not in out
  import trax_revplus  # pylint: disable=g-import-not-at-top
  trax_revplus.deactivate()


@pytest.mark.parametrize('command,flags', [
    ('train', ['config_file', 'config', 'output_dir',
               'progress_every_n_steps', 'implementation']),
    ('compare', ['config_file', 'config', 'steps', 'seed', 'output_dir']),
    ('plot-memory', ['output']),
])
def test_help_documents_every_flag(command, flags, capsys):
  code, out, err = _main(capsys, command, '--help')
  assert code == 0 and not err
  assert out.startswith(f'usage: trax-revplus {command}')
  defined = {
      'train': cli._train_flags,  # pylint: disable=protected-access
      'compare': cli._compare_flags,  # pylint: disable=protected-access
      'plot-memory': cli._plot_memory_flags,  # pylint: disable=protected-access
  }[command]()
  assert sorted(defined) == sorted(flags)
  for name in flags:
    assert f'--{name}=' in out
    assert defined[name].help.split()[0] in out


def test_top_level_usage_and_unknown_command(capsys):
  code, out, _ = _main(capsys, '--help')
  assert code == 0
  for command in ('train', 'compare', 'plot-memory'):
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
