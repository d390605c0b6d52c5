"""A step's memory log: its records, their fields, and every byte moved.

The bytes each phase must copy are computed from the layers' own weights,
slots and the batch (one device, where a copy of a host array counts its
bytes), not from the trainer's counters.
"""

import pytest

from trax import fastmath
from trax import layers as tl
from trax import optimizers

import trainer_cases as cases
from trax_revplus import memory
from trax_revplus import run_classes
from trax_revplus import trainer as rev_trainer

pytestmark = pytest.mark.usefixtures('stock_trax')

_PHASE = ['seconds', 'h2d_bytes', 'd2h_bytes']
_RELEASED = ['host_released_bytes']
_FREED = ['freed_arrays', 'freed_bytes']
# The step's composed XLA peak and the phase's (device_memory), and its
# accounted host peaks.
_DEVICE = [
  'peak_device_bytes',
  'phase_peak_device_bytes',
  'peak_host_bytes',
  'phase_peak_host_bytes',
]
_UNIT = ['layer', 'layer_name', 'n_layers', 'seconds']
_INIT = [
  'layer',
  'layer_name',
  'weights_bytes',
  'slots_bytes',
  'host_rss_added_bytes',
]
_START = [
  'process_index',
  'pid',
  'trainer',
  'reversible_layers',
  'process_start_time',
  'host_peak_bytes',
  'host_peak_source',
]
_STEP = [
  'process_index',
  'pid',
  'host_peak_bytes',
  'host_peak_source',
  'seconds',
  'recorded',
]
_BETWEEN = ['host_peak_between_steps_bytes']
# What a measured host peak is compared with (`host_peak_bytes` less the
# first).
_HOST = ['host_rss_backend_open_bytes', 'peak_host_bytes']


def _caller_fields(record):
  """The record's fields after its probes' (the trainer's), in order."""
  return [
    k
    for k in record
    if k not in ('step', 'phase', 'time')
    and k != 'host_rss_bytes'
    and not k.startswith('device_')
  ]


def _trained(tmp_path, n_steps):
  batch = cases.batch()
  first, revs, loss = cases.basic_model()
  model = tl.Serial([first] + revs + [loss])
  model.init(batch, rng=fastmath.random.get_prng(12))
  trainer = rev_trainer.ReversibleSerialTrainer(
    [(first.sublayers, revs)],
    loss,
    optimizers.Adam,
    n_devices=1,
    segment_max_layers=2,
    free_accelerators_on_step=True,
    memory_log_every_n_steps=1,
    memory_log_per_layer=True,
    memory_log_tensorboard=False,
    output_dir=str(tmp_path),
  )
  for step, (rng, lr) in enumerate(zip(cases.RNGS, cases.LRS)):
    if step < n_steps:
      trainer.one_step(batch, rng, step=step + 1, learning_rate=lr)
  return trainer, memory.read_memory_log(tmp_path / 'memory.jsonl')


def test_records_and_fields_of_each_phase_and_unit(tmp_path):
  trainer, records = _trained(tmp_path, 2)
  names = [l.name for l in trainer.all_layers]
  segments = f'{names[1]}..{names[2]}', f'{names[3]}..{names[4]}'
  expected = [(0, 'init', _INIT)] * 6 + [(0, 'start', _START)]
  for step in (1, 2):
    expected += [
      (step, 'free', _PHASE + _FREED + _RELEASED),
      (step, 'forward', _UNIT),
      (step, 'forward', _UNIT),
      (step, 'forward', _UNIT),
      (step, 'forward', _PHASE + _RELEASED + _DEVICE),
      (step, 'loss', _PHASE + _RELEASED + _DEVICE),
      (step, 'free', _PHASE + _FREED + _RELEASED),
      (step, 'backward', _UNIT),
      (step, 'backward', _UNIT),
      (step, 'backward', _UNIT),
      (step, 'backward', _PHASE + _RELEASED + _DEVICE),
      (step, 'step', _STEP + _PHASE[1:] + _BETWEEN * (step > 1) + _HOST),
    ]
  assert [(r['step'], r['phase'], _caller_fields(r)) for r in records] == (
    expected
  )
  units = [
    (r['layer'], r['layer_name'], r['n_layers'])
    for r in records[7:18]
    if 'layer' in r
  ]
  assert units == [
    (0, names[0], 1),
    (1, segments[0], 2),
    (3, segments[1], 2),
    (3, segments[1], 2),
    (1, segments[0], 2),
    (0, names[0], 1),
  ]
  assert [r['layer'] for r in records[:6]] == list(range(6))
  # Outside a Loop the start record names the trainer and its own layers.
  start = records[6]
  assert start['trainer'] == run_classes.qualified_name(type(trainer))
  assert start['trainer'] == 'trax_revplus.trainer.ReversibleSerialTrainer'
  assert start['reversible_layers'] == (
    run_classes.reversible_layers(trainer.all_layers)
  )
  assert start['reversible_layers'].endswith('.ReversibleHalfResidual x2')


def test_each_phase_counts_the_bytes_it_moves(tmp_path):
  trainer, records = _trained(tmp_path, 2)
  layers = trainer.all_layers
  slots = [s for std, revs in trainer.slots[:-1] for s in [std] + list(revs)]
  slots.append(trainer.slots[-1])
  weights = [memory.array_bytes(l.weights) for l in layers]
  state = [memory.array_bytes(l.state) for l in layers]
  params = [w + memory.array_bytes(s) for w, s in zip(weights, slots)]
  batch = memory.array_bytes(cases.batch())
  # Forward: the batch, then each unit's weights and state. Loss: its
  # weights, slots and state, and the first backward unit's (layers 3-4)
  # weights and slots, placed ahead. Backward: the other units'. Every
  # updated layer's weights, slots and state come back.
  expected = {
    'forward': (batch + sum(weights[:5]) + sum(state[:5]), 0),
    'loss': (
      params[5] + state[5] + params[3] + params[4],
      params[5] + state[5],
    ),
    'backward': (
      params[0] + params[1] + params[2],
      sum(params[:5]) + sum(state[:5]),
    ),
  }
  for step in (1, 2):
    moved = {
      r['phase']: (r['h2d_bytes'], r['d2h_bytes'])
      for r in records
      if r['step'] == step and 'layer' not in r and r['phase'] in expected
    }
    assert moved == expected
    assert all(
      r['h2d_bytes'] == 0
      for r in records
      if r['step'] == step and r['phase'] == 'free'
    )
