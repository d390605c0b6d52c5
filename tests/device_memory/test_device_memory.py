"""trax_revplus.device_memory: XLA's per-program bytes composed into a step's
peak, for trax's default Trainer and stock's ReversibleSerialTrainer.

References: hand-computed compositions; XLA's memory analysis of the
programs the trainers actually call in a real step (their own jitted
functions, recorded with the arguments `one_step` passed) and of an
independent re-implementation of the default Trainer's update.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trax import fastmath
from trax import layers as tl
from trax import optimizers
from trax import shapes
from trax.optimizers import trainer as stock_trainer_lib

import trax_revplus
from trax_revplus.device_memory import composition
from trax_revplus.device_memory import default_trainer
from trax_revplus.device_memory import program
from trax_revplus.device_memory import report
from trax_revplus.device_memory import stock_trainer


@pytest.fixture(autouse=True)
def _stock_names():
  trax_revplus.deactivate()
  yield
  trax_revplus.deactivate()


def _batch():
  inputs = np.arange(8, dtype=np.int32).reshape((2, 4)) % 9
  return (inputs, (2 * inputs) % 9, np.ones((2, 4), dtype=np.float32))


def _abstract_batch():
  return tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in _batch())


def _blocks_and_loss():
  first = tl.Serial(tl.Embedding(9, 4), tl.Dropout(0.5), tl.Dup())
  revs = [
    tl.ReversibleHalfResidual(tl.Dense(4), tl.Dropout(0.2)),
    tl.ReversibleSwap(),
    tl.ReversibleHalfResidual(tl.Dropout(0.5), tl.Dense(4)),
    tl.ReversibleSwap(),
  ]
  loss = tl.Serial(
    tl.Concatenate(), tl.Dense(9), tl.LogSoftmax(), tl.CrossEntropyLoss()
  )
  return first, revs, loss


def _default_trainer():
  first, revs, loss = _blocks_and_loss()
  model = tl.Serial([first] + revs + [loss])
  model.init(shapes.signature(_batch()), rng=fastmath.random.get_prng(0))
  optimizer = optimizers.Adam()
  optimizer.tree_init(model.weights)
  return optimizers.Trainer(model, optimizer, n_devices=1)


def _stock_trainer():
  first, revs, loss = _blocks_and_loss()
  blocks = [(first.sublayers, revs)]
  stock_trainer_lib.init_reversible_blocks(
    blocks, loss, shapes.signature(_batch()), fastmath.random.get_prng(0)
  )
  return stock_trainer_lib.ReversibleSerialTrainer(
    blocks, loss, optimizers.Adam, n_devices=1
  )


@pytest.fixture(scope='module')
def default_case():
  """A default Trainer and its composed step (compiled once per module)."""
  trax_revplus.deactivate()
  trainer = _default_trainer()
  return trainer, default_trainer.default_trainer_step(
    trainer, _abstract_batch()
  )


@pytest.fixture(scope='module')
def stock_case():
  """A stock ReversibleSerialTrainer and its composed step."""
  trax_revplus.deactivate()
  trainer = _stock_trainer()
  return trainer, stock_trainer.stock_trainer_step(trainer, _abstract_batch())


def _recording(fn, calls):
  """`fn`, recording (fn, args) of each call in `calls` before running it."""

  def call(*args):
    calls.append((fn, args))
    return fn(*args)

  return call


def _memory_of(fn, args):
  """XLA's figures for `fn` compiled for `args`, independently of
  `program.analyze`."""
  stats = fn.lower(*args).compile().memory_analysis()
  return (
    stats.argument_size_in_bytes,
    stats.output_size_in_bytes,
    stats.alias_size_in_bytes,
    stats.temp_size_in_bytes,
  )


def _figures(memory):
  return (
    memory.argument_bytes,
    memory.output_bytes,
    memory.alias_bytes,
    memory.temp_bytes,
  )


def test_composition_hand_computed():
  small = program.ProgramMemory(
    argument_bytes=100, output_bytes=50, alias_bytes=20, temp_bytes=30
  )
  large = program.ProgramMemory(
    argument_bytes=10, output_bytes=10, alias_bytes=0, temp_bytes=500
  )
  first = composition.Call(
    'first',
    'forward',
    small,
    [
      composition.Held('stack', 200, passed_bytes=60),
      composition.Held('saved', 40),
    ],
  )
  # 240 held + (100 - 60) fresh arguments + 50 outputs + 30 temps - 20 alias.
  assert first.device_bytes == 340
  assert first.parts() == {
    'stack': 200,
    'saved': 40,
    'arguments placed for the call': 40,
    'outputs': 30,
    'temporaries': 30,
  }
  assert sum(first.parts().values()) == first.device_bytes
  second = composition.Call(
    'second', 'backward', large, [composition.Held('stack', 5)]
  )
  assert second.device_bytes == 5 + 10 + 10 + 500
  step = composition.compose([first, second])
  assert step.peak_device_bytes == 525
  assert step.peak_call is second
  assert step.largest_program_bytes == 520
  assert step.phase_peaks() == {'forward': 340, 'backward': 525}
  assert 'second' in step.describe()


def test_composition_rejects_impossible_counts():
  with pytest.raises(ValueError, match='passed_bytes'):
    composition.Held('stack', 10, passed_bytes=11)
  memory = program.ProgramMemory(
    argument_bytes=5, output_bytes=0, alias_bytes=0, temp_bytes=0
  )
  with pytest.raises(ValueError, match='argument bytes'):
    composition.Call(
      'call', 'forward', memory, [composition.Held('stack', 10, passed_bytes=6)]
    )
  with pytest.raises(ValueError, match='at least one call'):
    composition.compose([])


def test_held_parts_count_an_array_listed_many_times_once():
  """Equal optimizers share one placed copy of their hyperparameters, so a
  part lists it once per layer: the device holds it once, and a call that
  takes it is passed it once."""
  shared = jax.ShapeDtypeStruct((), jnp.float32)
  unused = jax.ShapeDtypeStruct((), jnp.float32)
  stack = jax.ShapeDtypeStruct((4, 8), jnp.float32)
  held = [
    ('optimizer hyperparameters', [[shared, unused]] * 6),
    ('stack', [stack, shared]),
  ]
  args = ([stack], [shared, unused])
  parts = composition.held_parts(held, args, kept=([True], [True, False]))
  assert parts == [
    composition.Held('optimizer hyperparameters', 8, 4),
    composition.Held('stack', 128, 128),
  ]


def test_analyze_tells_kept_arguments_and_reads_xla():
  def fn(x, w, unused, scale):
    return jnp.tanh(x @ w) * scale, jnp.sum(x)

  args = (
    jax.ShapeDtypeStruct((8, 16), jnp.float32),
    jax.ShapeDtypeStruct((16, 16), jnp.float32),
    jax.ShapeDtypeStruct((1000,), jnp.float32),
    2.0,
  )
  analysis = program.analyze(jax.jit(fn), *args)
  assert analysis.kept == (True, True, False, True)
  # The program keeps x, w and the scalar, not the unused argument.
  assert analysis.memory.argument_bytes == (8 * 16 + 16 * 16 + 1) * 4
  assert program.tree_bytes(args, analysis.kept) == (
    analysis.memory.argument_bytes
  )
  assert _figures(analysis.memory) == _memory_of(jax.jit(fn), args)
  assert [tuple(o.shape) for o in analysis.outputs] == [(8, 16), ()]
  donated = program.analyze(jax.jit(fn, donate_argnums=(0,)), *args).memory
  assert donated.alias_bytes == 8 * 16 * 4  # x's buffer holds tanh(x @ w)


def test_default_trainer_figure_is_the_program_one_step_runs():
  trainer = _default_trainer()  # its own: one_step changes the weights
  step = default_trainer.default_trainer_step(trainer, _abstract_batch())
  [call] = step.calls
  calls = []
  # pylint: disable=protected-access
  trainer._accelerated_update_fn = _recording(
    trainer._accelerated_update_fn, calls
  )
  # pylint: enable=protected-access
  trainer.one_step(_batch(), fastmath.random.get_prng(1), step=1)
  [(fn, args)] = calls
  assert _figures(call.program) == _memory_of(fn, args)
  # Weights, slots, state and hyperparameters stay on the device and are
  # the program's arguments, so the step's peak is the program's own bytes.
  assert step.peak_device_bytes == call.program.call_bytes
  weights_bytes, slots_bytes = default_trainer.weights_and_slots_bytes(trainer)
  assert dict((h.name, h.size_bytes) for h in call.held)['weights'] == (
    weights_bytes
  )
  assert slots_bytes == 2 * weights_bytes  # Adam: two slots per weight


def test_default_trainer_figure_matches_an_independent_update(default_case):
  trainer, step = default_case
  model = trainer.model_with_loss
  optimizer = trainer.optimizer

  # trax's single-device update, written anew from its definition.
  def update(weights_and_slots, step, opt_params, batch, state, rng):
    weights, slots = weights_and_slots

    def loss_fn(w):
      return model.pure_fn(batch, w, state, rng)

    (loss, new_state), grads = jax.value_and_grad(loss_fn, has_aux=True)(
      weights
    )
    new_weights, new_slots, stats = optimizer.tree_update(
      jnp.array(step, dtype=jnp.int32),
      grads,
      weights,
      slots,
      opt_params,
      store_slots=False,
    )
    stats['loss'] = loss
    return (new_weights, new_slots), new_state, stats

  args = default_trainer.update_call_args(trainer, _abstract_batch())
  assert _figures(step.calls[0].program) == _memory_of(jax.jit(update), args)


def test_figures_are_the_same_when_compiled_again(default_case):
  trainer, step = default_case
  jax.clear_caches()
  again = default_trainer.default_trainer_step(trainer, _abstract_batch())
  assert again == step


def test_stock_accounting_lists_the_programs_stock_calls(stock_case):
  trainer, step = stock_case
  # pylint: disable=protected-access
  calls = []
  trainer._accelerated_layer_fns = [
    (_recording(std, calls), [_recording(f, calls) for f in revs])
    for std, revs in trainer._accelerated_layer_fns
  ]
  trainer._fbos = [
    (_recording(std, calls), [_recording(f, calls) for f in revs])
    for std, revs in trainer._fbos
  ]
  trainer._loss_fbo = _recording(trainer._loss_fbo, calls)
  # pylint: enable=protected-access
  trainer.one_step(_batch(), fastmath.random.get_prng(1), step=1)
  assert [c.phase for c in step.calls] == (
    ['forward'] * 5 + ['loss'] + ['backward'] * 5
  )
  assert len(calls) == len(step.calls)
  figures = {}  # stock shares one jitted function between equal layers
  for (fn, args), call in zip(calls, step.calls):
    key = (id(fn), program.types_key(args))
    if key not in figures:
      figures[key] = _memory_of(fn, args)
    assert _figures(call.program) == figures[key], call.name
  # Between its calls stock holds the stack; the cotangent stack from the
  # loss layer on.
  names = [{h.name for h in c.held} for c in step.calls]
  assert all('stack' in n for n in names[1:])
  assert all('cotangent stack' in n for n in names[6:])
  assert step.peak_device_bytes == max(c.device_bytes for c in step.calls)


def test_more_devices_give_one_line_errors():
  class TwoDevices:
    _n_devices = 2

  for name, memory_fn in (
    ('stock', report.stock_trainer_memory),
    ('default', report.default_trainer_memory),
  ):
    result = report.account(
      name,
      'cpu',
      2,
      lambda fn=memory_fn: fn(TwoDevices(), _abstract_batch(), 'cpu'),
    )
    assert result.step is None and result.peak_device_bytes is None
    assert result.error.startswith('UnsupportedTrainerError: '), name
    assert '\n' not in result.error and 'n_devices=2' in result.error
    assert result.to_json(2**30) == {
      'error': result.error,
      'runs': None,
      'n_devices': 2,
      'max_devices': None,
    }


def test_trainer_memory_json_and_fits(default_case, stock_case, monkeypatch):
  trainer, step = default_case
  monkeypatch.setattr(
    default_trainer, 'default_trainer_step', lambda *unused_args: step
  )
  memory = report.default_trainer_memory(trainer, _abstract_batch(), 'cpu')
  peak = memory.peak_device_bytes
  assert peak == step.calls[0].device_bytes
  assert memory.fits(peak) and not memory.fits(peak - 1)
  assert memory.fits(None) is None
  data = memory.to_json(peak)
  assert data['peak_device_bytes'] == peak
  assert data['fits'] is True
  assert data['host_weights_and_slots_bytes'] == 0  # on the device
  largest = step.calls[0].program.call_bytes
  assert data['largest_program_bytes'] == largest
  assert data['peak_call'] == step.calls[0].name
  assert sum(data['peak_parts_bytes'].values()) == peak
  trainer, step = stock_case
  monkeypatch.setattr(
    stock_trainer, 'stock_trainer_step', lambda *unused_args: step
  )
  stock = report.stock_trainer_memory(trainer, _abstract_batch(), 'cpu')
  assert stock.host_weights_and_slots_bytes == (
    memory.weights_bytes + memory.slots_bytes
  )
  assert stock.to_json()['fits'] is None
  assert stock.to_json()['phase_peak_device_bytes'] == step.phase_peaks()


def test_trainer_memory_accounts_each_trainer_by_name(
  default_case, stock_case, monkeypatch
):
  from trax_revplus import memory as memory_lib  # pylint: disable=g-import-not-at-top
  from trax_revplus import trainer as rev_trainer_lib  # pylint: disable=g-import-not-at-top

  for name, (trainer, step), module, step_fn, memory_fn in (
    (
      'default',
      default_case,
      default_trainer,
      'default_trainer_step',
      report.default_trainer_memory,
    ),
    (
      'stock',
      stock_case,
      stock_trainer,
      'stock_trainer_step',
      report.stock_trainer_memory,
    ),
  ):
    monkeypatch.setattr(module, step_fn, lambda *unused_args, step=step: step)
    assert report.trainer_memory(
      name, trainer, _abstract_batch(), 'cpu'
    ) == memory_fn(trainer, _abstract_batch(), 'cpu')
  # Stock's trainer is no trax_revplus trainer, whatever it is called.
  with pytest.raises(TypeError, match='no device_memory_of'):
    report.trainer_memory('ours', trainer, _abstract_batch(), 'cpu')
  # trax_revplus's: its own accounting; weights and slots on the host.
  first, revs, loss = _blocks_and_loss()
  blocks = [(first.sublayers, revs)]
  rev_trainer_lib.init_reversible_blocks(
    blocks, loss, shapes.signature(_batch()), fastmath.random.get_prng(0)
  )
  ours = rev_trainer_lib.ReversibleSerialTrainer(
    blocks, loss, optimizers.Adam, n_devices=1, memory_log_tensorboard=False
  )
  memory = report.trainer_memory('revplus', ours, _abstract_batch(), 'cpu')
  assert memory.trainer == 'revplus' and memory.weights_and_slots_on_host
  assert (
    memory.peak_device_bytes
    == ours.device_memory_of(_abstract_batch()).peak_device_bytes
  )
  assert memory.weights_bytes == memory_lib.array_bytes(
    [layer.weights for layer in ours.all_layers]
  )
  assert memory.slots_bytes == memory_lib.array_bytes(
    [o.slots for o in ours._store.optimizers]
  )  # pylint: disable=protected-access
  # A step the caller has (e.g. the smallest plan's) is not accounted again.
  monkeypatch.setattr(ours, 'device_memory_of', None)
  given = report.trainer_memory(
    'revplus', ours, _abstract_batch(), 'cpu', step=step
  )
  assert given.step is step


def _nbytes(tree):
  return sum(
    {
      id(x): np.asarray(x).nbytes for x in jax.tree_util.tree_leaves(tree)
    }.values()
  )


def test_host_bytes_of_stock_and_the_default_trainer(default_case, stock_case):
  """Stock keeps every layer's weights, state and slots on the host, the
  batch, and each block's saved inputs and states from its forward on;
  the default Trainer the batch alone (its weights live on the device);
  on the CPU each call's device bytes are host memory too."""
  batch_bytes = _nbytes(_batch())
  trainer, step = stock_case
  between_steps = _nbytes(
    (
      [l.weights for l in trainer.all_layers],
      [l.state for l in trainer.all_layers],
      trainer.slots,
    )
  )
  loss = next(c for c in step.calls if c.phase == 'loss')
  parts = loss.host_parts()
  assert parts['weights, slots and state'] == between_steps
  assert parts['batch'] == batch_bytes
  # The block's standard layer's inputs (the tokens) and new state, and
  # its reversible layers' old and new states, copied to the host.
  std, revs = trainer._blocks[0]  # pylint: disable=protected-access
  assert parts['saved block inputs and states'] == (
    _nbytes(_batch()[0])
    + _nbytes(tl.Serial(std).state)
    + 2 * _nbytes([l.state for l in revs])
  )
  assert parts['device buffers (host memory here)'] == loss.device_bytes
  first = step.calls[0].host_parts()
  assert 'saved block inputs and states' not in first
  assert step.peak_host_bytes == max(c.host_bytes for c in step.calls)
  _, default_step = default_case
  [call] = default_step.calls
  assert call.host_parts() == {
    'batch': batch_bytes,
    'device buffers (host memory here)': call.device_bytes,
  }
  memory = report.TrainerMemory('stock', 'cpu', 1, step)
  assert memory.to_json()['peak_host_bytes'] == step.peak_host_bytes
