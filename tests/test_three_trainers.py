"""`three_trainers.account_three`: trax's two trainers accounted beside
trax_revplus's planning, with the figures of a sequential accounting.

References: each of trax's trainers built afresh and accounted on its own,
compiling each program when its walk meets it (`device_memory.
trainer_memory`, the accounting `estimate` ran before its trainers were
accounted beside each other); the order of the accounting's steps as its
hook (`three_trainers.on_event`) reports them, not wall time.
"""

import pytest

from cli_cases import MAIN
from cli_cases import TINY_MODEL
from trax_revplus import device_memory
from trax_revplus import three_trainers
from trax_revplus.cli import gin_config
from trax_revplus.cli import parsed_config
from trax_revplus.device_memory import default_trainer
from trax_revplus.device_memory import stock_trainer

pytestmark = pytest.mark.usefixtures('stock_trax_and_empty_gin')

BINDINGS = ['sequence_length = 32'] + TINY_MODEL


def _config():
  gin_config.import_trax_quietly()
  gin_config.parse_configs([MAIN], list(BINDINGS))
  cfg = parsed_config.check_inputs_and_batch(list(BINDINGS), 1)
  parsed_config.check_model(cfg, list(BINDINGS))
  return cfg


def _sequential(cfg, name):
  """trax's trainer `name` built afresh and accounted on this thread, each
  program compiled when met."""
  import trax_revplus  # pylint: disable=g-import-not-at-top

  trax_revplus.deactivate()
  build = {'default': three_trainers._default, 'stock': three_trainers._stock}
  trainer = build[name](cfg)
  return device_memory.trainer_memory(name, trainer, cfg.batch, 'cpu')


def test_other_trainers_compile_while_ours_plans_with_the_same_figures(
  monkeypatch,
):
  events = []
  monkeypatch.setattr(
    three_trainers, 'on_event', lambda *event: events.append(event)
  )
  cfg = _config()
  three = three_trainers.account_three(cfg, 'cpu', 1, 2**30, least=False)

  # The order: ours built and its settings checked against the batch
  # before anything compiles; trax's trainers built and their programs
  # traced (their compilations started) before ours plans; their figures
  # composed after.
  assert events == [
    ('built', 'revplus'),
    ('checked', 'revplus'),
    ('built', 'default'),
    ('traced', 'default'),
    ('built', 'stock'),
    ('traced', 'stock'),
    ('planned', 'revplus'),
    ('accounted', 'default'),
    ('accounted', 'stock'),
  ]
  # Nothing left for a later accounting to pick up.
  assert not default_trainer._started
  assert not stock_trainer._started
  for name in ('default', 'stock'):
    got = three.trainers[name]
    assert got.error is None and got.refused is None, got
    want = _sequential(cfg, name)
    assert got.to_json(2**30) == want.to_json(2**30), name
    assert [c.name for c in got.step.calls] == [c.name for c in want.step.calls]
  assert three.trainers['revplus'].error is None
  assert three.plan is not None and three.plan.fits


def test_a_started_step_is_composed_from_its_own_programs():
  """`start_*_trainer_step` then `*_trainer_step` of the same trainer and
  batch: the figures of the step compiled as met; another batch's step is
  walked afresh."""
  cfg = _config()
  import trax_revplus  # pylint: disable=g-import-not-at-top

  trax_revplus.deactivate()
  default = three_trainers._default(cfg)
  stock = three_trainers._stock(cfg)
  programs = default_trainer.start_default_trainer_step(default, cfg.batch)
  stock_programs = stock_trainer.start_stock_trainer_step(stock, cfg.batch)
  # Started on the compile threads; each compile's span is timed once a
  # thread takes it (on a busy machine, after the call returns).
  programs.wait()
  stock_programs.wait()
  assert programs.compile_spans and stock_programs.compile_spans
  ahead = default_trainer.default_trainer_step(default, cfg.batch)
  stock_ahead = stock_trainer.stock_trainer_step(stock, cfg.batch)
  assert ahead == default_trainer.default_trainer_step(default, cfg.batch)
  assert stock_ahead == stock_trainer.stock_trainer_step(stock, cfg.batch)
  # The program's call keeps its name (the loop over what is held once
  # renamed it).
  assert [c.name for c in ahead.calls] == [
    'update (forward, backward, optimizer)'
  ]
  # Started for step 1, asked for step 2: not that walk's.
  stock_trainer.start_stock_trainer_step(stock, cfg.batch)
  assert stock_trainer.stock_trainer_step(stock, cfg.batch, step=2) == (
    stock_trainer.stock_trainer_step(stock, cfg.batch, step=2)
  )


def test_a_program_refused_ahead_is_the_error_of_the_walk_compiling_as_met(
  monkeypatch,
):
  """Stock's backward programs refused for memory: the started walk (its
  programs compiled beside each other) reports the call the walk that
  compiles each program when it meets it stops at, with the same bytes."""
  import jax  # pylint: disable=g-import-not-at-top

  cfg = _config()
  import trax_revplus  # pylint: disable=g-import-not-at-top

  trax_revplus.deactivate()
  compile_ = jax.stages.Lowered.compile

  def refusing(lowered, *args, **kwargs):
    if '_reverse_and_fbo' in lowered.as_text()[:2000]:
      raise RuntimeError(
        'RESOURCE_EXHAUSTED: Out of memory while trying to allocate '
        '123456789 bytes.'
      )
    return compile_(lowered, *args, **kwargs)

  monkeypatch.setattr(jax.stages.Lowered, 'compile', refusing)
  rows = []
  for ahead in (False, True):
    stock = three_trainers._stock(cfg)
    if ahead:
      stock_trainer.start_stock_trainer_step(stock, cfg.batch)
    rows.append(
      device_memory.account(
        'stock',
        'cpu',
        1,
        lambda t=stock: device_memory.trainer_memory(
          'stock', t, cfg.batch, 'cpu'
        ),
      )
    )
  assert rows[0].refused is not None and 'backward layer' in rows[0].refused
  assert rows[1] == rows[0]
