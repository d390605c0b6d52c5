"""`trax-revplus estimate`: will a config's training step fit a device?

Parses the gin config as `train` does, builds the config's model three
times (trax's default `Trainer`, stock trax's `ReversibleSerialTrainer`,
trax_revplus's), compiles what one step of each would run and composes XLA's
memory analysis of those programs into the step's peak device bytes
(`trax_revplus.device_memory`); runs no step. The batch's shapes come from
the config's inputs (trax's `Inputs` reads one batch to learn them).
trax_revplus's trainer is built with `device_memory_budget_bytes` set to
`--device_memory`, so its figures are those of the plan it would run under
that memory. A trainer that cannot be built or compiled here gets a
one-line error in its row instead of figures. Third-party warnings known to
be harmless (`noise.KNOWN_NOISE`) are not shown; any other is one line.
"""

import argparse
import copy
import json
import logging as std_logging
import os
import re
import sys
from typing import Any, Optional

from trax_revplus.cli import gin_config
from trax_revplus.cli import noise
from trax_revplus.errors import EXIT_OK
from trax_revplus.errors import EXIT_RUNTIME
from trax_revplus.errors import one_line
from trax_revplus.errors import UserError

COMMAND = 'estimate'
TRAINERS = ('default', 'stock', 'revplus')
_UNITS = {'': 1, 'b': 1, 'kb': 10**3, 'mb': 10**6, 'gb': 10**9,
          'tb': 10**12, 'kib': 2**10, 'mib': 2**20, 'gib': 2**30,
          'tib': 2**40}


def parse_bytes(text: str) -> int:
  """'16GiB', '16 GB', '512MiB', '1e9' -> bytes (int).

  Raises:
    ValueError: not a positive number with an optional unit (B, kB, MB,
      GB, TB, KiB, MiB, GiB, TiB; case-insensitive).
  """
  match = re.fullmatch(r'\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*'
                       r'([a-zA-Z]*)\s*', text)
  unit = match and match.group(2).lower()
  if not match or unit not in _UNITS:
    raise ValueError(f'--device_memory={text!r} is not a size: give bytes '
                     'or a number with a unit, e.g. 16GiB, 40GB, 512MiB')
  value = int(float(match.group(1)) * _UNITS[unit])
  if value < 1:
    raise ValueError(f'--device_memory={text!r} must be positive, e.g. 16GiB')
  return value


def human_bytes(n: Optional[int]) -> str:
  if n is None:
    return '-'
  for unit, size in (('GiB', 2**30), ('MiB', 2**20), ('KiB', 2**10)):
    if n >= size:
      return f'{n / size:.1f} {unit}'
  return f'{n} B'


def _bound(name: str, default: Any) -> Any:
  """The value gin would pass for `name`, references made callables."""
  return copy.deepcopy(gin_config.bound_value(name, default))


def _batch_types(inputs_fn):
  """The batch's `jax.ShapeDtypeStruct`s from the config's inputs."""
  import jax  # pylint: disable=g-import-not-at-top
  inputs = inputs_fn() if callable(inputs_fn) else inputs_fn
  shapes, dtypes = inputs.example_shape_dtype
  return tuple(jax.ShapeDtypeStruct(tuple(s), d)
               for s, d in zip(shapes, dtypes))


class _Config:
  """What `train` would build from the parsed config."""

  def __init__(self):
    from trax import layers as tl  # pylint: disable=g-import-not-at-top
    from trax import optimizers  # pylint: disable=g-import-not-at-top
    from trax.data import inputs as trax_inputs  # pylint: disable=g-import-not-at-top
    self.model_fn = _bound('train.model', None)
    if self.model_fn is None:
      raise UserError('no model configured: bind train.model, e.g. '
                      "--config='train.model = @trax.models.ReformerLM'")
    self._tl = tl
    self.loss()  # fails here on a bad loss binding
    self.optimizer = _bound('train.optimizer', optimizers.Adafactor)
    inputs = _bound('train.inputs', trax_inputs.batcher)
    try:
      self.batch = _batch_types(inputs)
    except Exception as e:  # pylint: disable=broad-except
      raise UserError(f"cannot read the config's inputs: {one_line(e)}",
                      EXIT_RUNTIME) from None

  def model(self):
    """A new model (train mode)."""
    return self.model_fn(mode='train')

  def loss(self):
    """A new loss layer."""
    return (_bound('train.loss_fn', None) or
            self._tl.WeightedCategoryCrossEntropy())


def _signature(batch):
  from trax import shapes  # pylint: disable=g-import-not-at-top
  return tuple(shapes.ShapeDtype(x.shape, x.dtype) for x in batch)


def _default(cfg, backend):
  from trax import fastmath  # pylint: disable=g-import-not-at-top
  from trax import layers as tl  # pylint: disable=g-import-not-at-top
  from trax import optimizers  # pylint: disable=g-import-not-at-top
  from trax_revplus import device_memory  # pylint: disable=g-import-not-at-top
  model = tl.Serial(cfg.model(), cfg.loss())
  model.init(_signature(cfg.batch), rng=fastmath.random.get_prng(0))
  opt = cfg.optimizer()
  opt.tree_init(model.weights)
  trainer = optimizers.Trainer(model, opt, n_devices=1)
  return device_memory.trainer_memory('default', trainer, cfg.batch, backend)


def _blocks(module, cfg):
  from trax import fastmath  # pylint: disable=g-import-not-at-top
  blocks, loss_layer = module.extract_reversible_blocks([cfg.model(),
                                                         cfg.loss()])
  module.init_reversible_blocks(blocks, loss_layer, _signature(cfg.batch),
                                fastmath.random.get_prng(0))
  return blocks, loss_layer


def _stock(cfg, backend):
  from trax.optimizers import trainer as stock_lib  # pylint: disable=g-import-not-at-top
  from trax_revplus import device_memory  # pylint: disable=g-import-not-at-top
  blocks, loss_layer = _blocks(stock_lib, cfg)
  trainer = stock_lib.ReversibleSerialTrainer(blocks, loss_layer,
                                              cfg.optimizer, n_devices=1)
  return device_memory.trainer_memory('stock', trainer, cfg.batch, backend)


def _revplus(cfg, backend, n_devices, device_memory_bytes):
  """(TrainerMemory, plan line, the budget it planned for) of trax_revplus's
  trainer.

  With `device_memory_bytes` (--device_memory) the trainer plans for it;
  without, for the budget its settings give (the config's
  `device_memory_budget_bytes`, by default the device's own size where the
  backend reports it).
  """
  from trax_revplus import device_memory  # pylint: disable=g-import-not-at-top
  from trax_revplus import trainer as rev_lib  # pylint: disable=g-import-not-at-top
  from trax_revplus.trainer import planner  # pylint: disable=g-import-not-at-top
  blocks, loss_layer = _blocks(rev_lib, cfg)
  budget = ({} if device_memory_bytes is None else
            {'device_memory_budget_bytes': device_memory_bytes})
  trainer = rev_lib.ReversibleSerialTrainer(
      blocks, loss_layer, cfg.optimizer, n_devices=n_devices,
      memory_log_tensorboard=False, output_dir=None, **budget)
  budget_bytes = trainer.planner.budget_bytes
  least_plan, least = trainer.least_device_memory_of(cfg.batch)
  try:
    planned = trainer.planned(cfg.batch)
    plan, step, note = planned.plan, trainer.device_memory_of(cfg.batch), (
        'fits' if budget_bytes is not None else 'no budget: as configured')
  except planner.DeviceMemoryBudgetError:
    plan, step = least_plan, least
    note = (f'no plan fits {human_bytes(budget_bytes)}; the least needs '
            f'{least.peak_device_bytes} bytes')
  settings = dict(plan.settings(), n_calls=plan.n_calls)
  result = device_memory.trainer_memory(
      'revplus', trainer, cfg.batch, backend, step=step, plan=settings,
      least=(dict(least_plan.settings(), n_calls=least_plan.n_calls), least))
  return result, f'{plan.describe()} ({note})', budget_bytes


def estimate(device_memory_bytes: Optional[int], n_devices: int):
  """Builds and accounts the three trainers of the parsed config.

  Returns:
    (backend, {trainer: TrainerMemory}, revplus plan line or None,
    batch types).
  """
  import jax  # pylint: disable=g-import-not-at-top
  import trax_revplus  # pylint: disable=g-import-not-at-top
  from trax_revplus import device_memory  # pylint: disable=g-import-not-at-top
  backend = jax.default_backend()
  activated = trax_revplus.is_active()
  cfg = _Config()
  try:
    cfg.model()
  except UserError:
    raise
  except Exception as e:  # pylint: disable=broad-except
    raise UserError(f"cannot build the config's model: {one_line(e)}; fix "
                    'the model bindings (train.model, ...)',
                    EXIT_RUNTIME) from None
  results, plan_line, budget = {}, [None], [device_memory_bytes]
  try:
    trax_revplus.deactivate()
    results['default'] = device_memory.account(
        'default', backend, 1, lambda: _default(cfg, backend))
    results['stock'] = device_memory.account(
        'stock', backend, 1, lambda: _stock(cfg, backend))
    trax_revplus.activate()

    def revplus():
      memory, plan_line[0], budget[0] = _revplus(cfg, backend, n_devices,
                                                 device_memory_bytes)
      return memory
    results['revplus'] = device_memory.account('revplus', backend, n_devices,
                                               revplus)
  finally:
    if not activated:
      trax_revplus.deactivate()
  return backend, results, plan_line[0], cfg.batch, budget[0]


def table(backend, results, plan_line, batch, device_memory_bytes,
          n_devices) -> str:
  """The printed report."""
  shapes = ', '.join(f'{x.dtype}{list(x.shape)}' for x in batch)
  lines = [
      f'figures compiled for backend {backend} (XLA memory analysis; other '
      f'backends compile differently), per device, one training step on '
      f'batch ({shapes}), trax_revplus on {n_devices} device(s)',
      f'device memory: {human_bytes(device_memory_bytes)}' +
      (f' ({device_memory_bytes} bytes)' if device_memory_bytes else
       ' not given (--device_memory)'),
      '',
      f'{"trainer":<9}{"peak device/step":>18}{"least device/step":>19}'
      f'{"host weights+slots":>20}{"largest program":>17}{"fits":>6}',
  ]
  for name in TRAINERS:
    r = results[name]
    if r.error is not None:
      lines.append(f'{name:<9}error: {r.error}')
      continue
    fits = r.fits(device_memory_bytes)
    fits = '-' if fits is None else ('yes' if fits else 'no')
    lines.append(f'{name:<9}{human_bytes(r.peak_device_bytes):>18}'
                 f'{human_bytes(r.min_peak_device_bytes):>19}'
                 f'{human_bytes(r.host_weights_and_slots_bytes):>20}'
                 f'{human_bytes(r.largest_program_bytes):>17}{fits:>6}')
  if plan_line:
    lines.append('')
    lines.append(f'revplus plan: {plan_line}')
  peak = results['revplus'].step
  if peak is not None:
    lines.append(f'revplus {peak.describe()}')
  return '\n'.join(lines)


def to_json(backend, results, plan_line, device_memory_bytes,
            n_devices) -> dict:
  out = {'backend': backend, 'device_memory_bytes': device_memory_bytes,
         'n_devices': n_devices,
         'trainers': {name: results[name].to_json(device_memory_bytes)
                      for name in TRAINERS}}
  if plan_line is not None and 'error' not in out['trainers']['revplus']:
    out['trainers']['revplus']['plan_line'] = plan_line
  return out


def run(flags: argparse.Namespace) -> int:
  """Runs `trax-revplus estimate` with the parsed flags.

  Returns:
    0 done.

  Raises:
    UserError: exit status 2 for a bad flag or config, 1 when the config's
      model or inputs cannot be built or the JSON cannot be written.
  """
  from trax_revplus.cli import train  # pylint: disable=g-import-not-at-top
  device_memory_bytes = None
  if flags.device_memory is not None:
    try:
      device_memory_bytes = parse_bytes(flags.device_memory)
    except ValueError as e:
      raise UserError(str(e)) from None
  if flags.json and os.path.isdir(flags.json):
    raise UserError(f'--json={flags.json} is a directory; give a file path')
  config_files, bindings = train.configs_from_flags(flags)
  gin_config.import_trax()
  gin_config.parse_configs(config_files, bindings)
  from trax_revplus.trainer import options  # pylint: disable=g-import-not-at-top
  from trax_revplus import validation  # pylint: disable=g-import-not-at-top
  try:
    options.validate_gin_bindings()
  except validation.TrainerOptionError as e:
    raise UserError(one_line(e)) from None
  # Compiling the trainers' programs raises third-party warnings (e.g. JAX's
  # on donations stock's programs cannot use): known ones are dropped, any
  # other is one line on stderr.
  with noise.route_warnings(std_logging.NullHandler(),
                            std_logging.StreamHandler(sys.stderr)):
    backend, results, plan_line, batch, budget = estimate(
        device_memory_bytes, flags.n_devices)
  if budget is not None:
    device_memory_bytes = budget
  print(table(backend, results, plan_line, batch, device_memory_bytes,
              flags.n_devices))
  sys.stdout.flush()
  if flags.json:
    text = json.dumps(to_json(backend, results, plan_line,
                              device_memory_bytes, flags.n_devices),
                      indent=1, sort_keys=True)
    tmp = flags.json + '.tmp'
    try:
      with open(tmp, 'w') as f:
        f.write(text + '\n')
      os.replace(tmp, flags.json)
    except OSError as e:
      raise UserError(f'cannot write {flags.json}: {e.strerror or e}',
                      EXIT_RUNTIME) from None
  return EXIT_OK
