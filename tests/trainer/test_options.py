"""The trainer's settings beyond trax's: checked at once, with clear errors.

Also: the constructor's signature is trax's plus exactly these settings,
with the same defaults, and gin bindings are checked without a trainer.
"""

import inspect

import gin
import jax
import pytest

from trax import layers as tl
from trax import optimizers
from trax.optimizers import trainer as stock_trainer

import trainer_cases as cases
from conftest import split_blocks_trainer
from trax_revplus import trainer as rev_trainer
from trax_revplus import validation
from trax_revplus.memory import host_release as host_memory
from trax_revplus.trainer import TrainerOptions

pytestmark = pytest.mark.usefixtures('stock_trax')


def test_bad_arguments_raise_clear_errors():
  first, revs, loss = cases.basic_model()
  with pytest.raises(ValueError, match='n_async_layers'):
    rev_trainer.ReversibleSerialTrainer(
      [(first.sublayers, revs)], loss, optimizers.Adam, n_async_layers=-1
    )
  with pytest.raises(ValueError, match='n_devices'):
    rev_trainer.ReversibleSerialTrainer(
      [(first.sublayers, revs)], loss, optimizers.Adam, n_devices=64
    )
  with pytest.raises(ValueError, match='compile_ahead'):
    rev_trainer.ReversibleSerialTrainer(
      [(first.sublayers, revs)], loss, optimizers.Adam, compile_ahead='yes'
    )
  with pytest.raises(ValueError, match='backward_segment_max_layers'):
    rev_trainer.ReversibleSerialTrainer(
      [(first.sublayers, revs)],
      loss,
      optimizers.Adam,
      backward_segment_max_layers=0,
    )
  with pytest.raises(ValueError, match=r'host_mmap_threshold: .*\[0, '):
    rev_trainer.ReversibleSerialTrainer(
      [(first.sublayers, revs)],
      loss,
      optimizers.Adam,
      host_mmap_threshold=64 * 2**20,
    )


def test_host_mmap_threshold_goes_to_glibc_unless_none(monkeypatch):
  thresholds = []
  monkeypatch.setattr(host_memory, 'set_mmap_threshold', thresholds.append)
  batch = cases.batch()
  first, revs, loss = cases.basic_model()
  tl.Serial([first] + revs + [loss]).init(batch)
  for kwargs in (
    dict(host_mmap_threshold=2**20),
    dict(host_mmap_threshold=None),
    dict(host_mmap_threshold=0),
    {},
  ):
    rev_trainer.ReversibleSerialTrainer(
      [(first.sublayers, revs)],
      loss,
      optimizers.Adam,
      clear_compilation_caches=False,
      **kwargs,
    )
  # The default, None, leaves glibc's own threshold.
  assert thresholds == [2**20, 0]


def test_memory_log_first_steps_sets_the_steps_recorded_at_the_start():
  log = split_blocks_trainer().memory_log
  assert [log.should_record(s) for s in (1, 10, 11)] == [True, True, False]
  log = split_blocks_trainer(memory_log_first_steps=1).memory_log
  assert [log.should_record(s) for s in (1, 2, 101)] == [True, False, True]


def test_bad_on_non_finite_value():
  with pytest.raises(
    ValueError,
    match=r'on_non_finite must be one of '
    r"\('raise', 'skip', 'ignore'\)",
  ):
    split_blocks_trainer(on_non_finite='warn')


def test_constructor_is_stocks_plus_the_options_as_keywords():
  ours = inspect.signature(rev_trainer.ReversibleSerialTrainer.__init__)
  stock = inspect.signature(stock_trainer.ReversibleSerialTrainer.__init__)
  names = list(ours.parameters)
  assert names[: len(stock.parameters)] == list(stock.parameters)
  for name in stock.parameters:
    assert ours.parameters[name].default == stock.parameters[name].default
  assert names[len(stock.parameters) :] == ['settings']
  assert ours.parameters['settings'].kind is inspect.Parameter.VAR_KEYWORD
  # gin binds exactly stock's arguments and the settings, listed once.
  assert rev_trainer.ReversibleSerialTrainer.gin_parameters == (
    tuple(n for n in stock.parameters if n != 'self')
    + TrainerOptions.field_names()
  )


def test_an_unknown_setting_is_one_line_naming_the_settings():
  with pytest.raises(validation.TrainerOptionError) as e:
    split_blocks_trainer(n_async_layer=2)
  line = str(e.value).splitlines()[0]
  assert line.startswith(
    'trax_revplus.ReversibleSerialTrainer has no setting '
    "'n_async_layer'; its settings: n_async_layers, "
  )


def test_an_unknown_setting_in_gin_names_the_settings():
  import gin  # pylint: disable=g-import-not-at-top

  gin.clear_config()
  try:
    with pytest.raises(ValueError) as e:
      gin.parse_config('trax_revplus.ReversibleSerialTrainer.n_async_layer = 2')
  finally:
    gin.clear_config()
  hint = validation.unknown_knob_hint(str(e.value))
  assert hint.startswith(
    'trax_revplus.ReversibleSerialTrainer has no setting '
    "'n_async_layer'; its settings: n_devices, "
  )
  assert 'batch_slices' in hint


@pytest.mark.parametrize(
  'name,value,allowed',
  [
    ('n_async_layers', -1, 'an int >= 0'),
    ('memory_log_every_n_steps', 0, 'an int >= 1 (1 records every step)'),
    ('memory_log_first_steps', -1, 'an int >= 0'),
    ('memory_log_per_layer', 'yes', 'True or False'),
    ('output_dir', 3, 'None or a directory path (str)'),
    ('donate', 1, 'True or False'),
    ('on_non_finite', 'warn', "one of ('raise', 'skip', 'ignore')"),
    (
      'segment_max_layers',
      2.0,
      "an int >= 1 (1: one call per layer) or 'auto'",
    ),
    ('segment_max_bytes', -1, 'an int >= 0'),
    ('compile_ahead', 'yes', 'True or False'),
    (
      'host_mmap_threshold',
      True,
      "None (glibc's own threshold) or an int number of bytes in [0, "
      "33554432] (glibc's limit)",
    ),
    ('backward_segment_max_layers', 0, "an int >= 1 or 'auto'"),
    ('clear_compilation_caches', None, 'True or False'),
  ],
)
def test_a_bad_setting_gets_one_line_naming_it_the_value_and_the_range(
  name, value, allowed
):
  with pytest.raises(validation.TrainerOptionError) as info:
    TrainerOptions(**{name: value})
  assert str(info.value) == (
    f'trax_revplus.ReversibleSerialTrainer.{name}: {name} must be '
    f'{allowed}, got {value!r}.'
  )
  assert isinstance(info.value, validation.ConfigurationError)
  assert isinstance(info.value, ValueError)
  assert (info.value.name, info.value.value) == (name, value)


@pytest.mark.usefixtures('stock_trax_and_empty_gin')
def test_gin_bindings_are_checked_without_a_trainer_or_a_device(monkeypatch):
  def no_devices(*unused_args, **unused_kwargs):
    raise AssertionError('a device API was called')

  monkeypatch.setattr(jax, 'local_devices', no_devices)
  monkeypatch.setattr(jax, 'local_device_count', no_devices)
  monkeypatch.setattr(jax, 'devices', no_devices)
  gin.parse_config(
    'trax_revplus.ReversibleSerialTrainer.n_async_layers = 3\n'
    "trax_revplus.ReversibleSerialTrainer.on_non_finite = 'skip'\n"
    'trax_revplus.ReversibleSerialTrainer.n_devices = 64\n'
  )
  options = rev_trainer.validate_gin_bindings()
  assert (options.n_async_layers, options.on_non_finite) == (3, 'skip')
  assert options == TrainerOptions(n_async_layers=3, on_non_finite='skip')
  gin.bind_parameter(
    'trax_revplus.ReversibleSerialTrainer.segment_max_layers', 0
  )
  with pytest.raises(validation.TrainerOptionError) as checked:
    rev_trainer.validate_gin_bindings()
  monkeypatch.undo()
  gin.bind_parameter('trax_revplus.ReversibleSerialTrainer.n_devices', None)
  # The constructor raises the same error for the same binding (gin adds
  # a line naming the configurable).
  first, revs, loss = cases.basic_model()
  with pytest.raises(validation.TrainerOptionError) as built:
    rev_trainer.ReversibleSerialTrainer(
      [(first.sublayers, revs)], loss, optimizers.Adam
    )
  assert str(built.value).splitlines()[0] == str(checked.value)
  assert 'segment_max_layers must be an int >= 1' in str(checked.value)
