"""Unknown gin settings of ours: the error lists the settings there are
(only settings: not what trax passes the configurable itself).
"""

import os

import pytest

from trax_revplus import validation


pytestmark = pytest.mark.usefixtures('stock_trax')


def test_unknown_knob_hint_lists_our_knobs():
  import gin  # pylint: disable=g-import-not-at-top

  with pytest.raises(ValueError) as info:
    gin.parse_config('trax_revplus.ReversibleSerialTrainer.no_such_knob = 1')
  gin.clear_config()
  hint = validation.unknown_knob_hint(str(info.value))
  assert hint.startswith(
    'trax_revplus.ReversibleSerialTrainer has no setting '
    "'no_such_knob'; its settings: n_devices, "
    'memoize_jit, free_accelerators_on_step, adasum, '
  )
  assert 'on_non_finite' in hint and 'n_async_layers' in hint
  # What trax's Loop passes the trainer is no setting.
  for argument in ('blocks', 'loss_layer', 'optimizer_fn'):
    assert argument not in hint
  assert (
    validation.unknown_knob_hint(
      "Configurable 'ReformerLM' doesn't have a parameter named 'x'"
    )
    is None
  )


@pytest.mark.parametrize(
  'configurable,passed',
  [
    ('ReversibleSerialTrainer', ('blocks', 'loss_layer', 'optimizer_fn')),
    ('ProgressPrinter', ('loop',)),
    ('local_text_inputs', ()),
  ],
)
def test_settings_lists_hold_settings_only(configurable, passed):
  settings = validation.settings_of(configurable)
  assert settings and not set(passed) & set(settings)
  if configurable == 'ReversibleSerialTrainer':
    from trax_revplus.trainer import TrainerOptions  # pylint: disable=g-import-not-at-top

    assert settings == [
      'n_devices',
      'memoize_jit',
      'free_accelerators_on_step',
      'adasum',
      *TrainerOptions.field_names(),
    ]


def _train_with_binding(tmp_path, capsys, binding):
  """`trax-revplus train` of the main job with `binding`: (exit status,
  stderr lines)."""
  import gin  # pylint: disable=g-import-not-at-top
  from trax_revplus import cli  # pylint: disable=g-import-not-at-top

  repo = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  )
  config = os.path.join(repo, 'gin_configs', 'reformer_char_lm.gin')
  try:
    code = cli.main(
      [
        'trax-revplus',
        'train',
        f'--config_file={config}',
        f'--output_dir={tmp_path}',
        f'--config={binding}',
      ]
    )
  finally:
    gin.clear_config()
  return code, capsys.readouterr().err.strip().splitlines()


def test_cli_unknown_knob_of_ours_is_one_line(tmp_path, capsys):
  code, err = _train_with_binding(
    tmp_path, capsys, 'trax_revplus.ReversibleSerialTrainer.no_such_knob = 1'
  )
  assert code == 2
  assert len(err) == 1
  # gin's own message comes first (its wording varies with gin's version and
  # the configurable's allowlist), then ours.
  assert err[0].startswith(
    "trax-revplus train: error: cannot apply --config='trax_revplus."
    "ReversibleSerialTrainer.no_such_knob = 1': column 38: Configurable "
    "'trax_revplus.ReversibleSerialTrainer' "
  )
  assert "'no_such_knob'" in err[0].split(';', 1)[0]
  assert (
    '; trax_revplus.ReversibleSerialTrainer has no setting '
    "'no_such_knob'; its settings: n_devices, memoize_jit"
  ) in err[0]
  assert not os.listdir(tmp_path)


def test_cli_removed_setting_is_one_line_saying_so(tmp_path, capsys):
  code, err = _train_with_binding(
    tmp_path,
    capsys,
    "trax_revplus.ReversibleSerialTrainer.store_activations = 'always'",
  )
  assert code == 2
  assert err == [
    'trax-revplus train: error: cannot apply --config="trax_revplus.'
    "ReversibleSerialTrainer.store_activations = 'always'\": column 38: "
    + validation.removed_setting_message(
      'trax_revplus.ReversibleSerialTrainer', 'store_activations'
    )
  ]
  assert not os.listdir(tmp_path)
