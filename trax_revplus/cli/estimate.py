"""`trax-revplus estimate`: will a config's training step fit a device?

Checks what `train` checks, with the same code and lines (`preflight`), and
the --json path (`output_files`), before anything is built; then the
config's inputs (one batch, for its shapes), that the batch splits over
--n_devices and into the trainer's `batch_slices`, and that the model
builds, each mistake reported as `train` reports it (`failures`), before
anything is compiled. Then it parses the gin config as `train` does,
builds the config's model three
times (trax's default `Trainer`, stock trax's `ReversibleSerialTrainer`,
trax_revplus's), compiles what one step of each would run and composes XLA's
memory analysis of those programs into the step's peak device bytes
(`trax_revplus.device_memory`); runs no step. The batch's shapes come from
the config's inputs (trax's `Inputs` reads one batch to learn them).
trax_revplus's trainer is built with `device_memory_budget_bytes` set to
`--device_memory` (which overrides, with a warning line, a budget the config
sets), so its figures are those of the plan it would run under that
memory. A trainer that cannot be built or compiled here gets a
one-line error in its row instead of figures. Third-party warnings known to
be harmless (`noise.KNOWN_NOISE`) are not shown; any other is one line.
"""

import argparse
import copy
import json
import logging as std_logging
import sys
from typing import Any, Optional

from trax_revplus import output_files
from trax_revplus.cli import failures
from trax_revplus.cli import gin_config
from trax_revplus.cli import noise
from trax_revplus.cli import preflight
from trax_revplus.cli.messages import warning_line
from trax_revplus.cli.sizes import human_bytes
from trax_revplus.cli.sizes import parse_bytes
from trax_revplus.errors import EXIT_OK
from trax_revplus.errors import EXIT_RUNTIME
from trax_revplus.errors import one_line
from trax_revplus.errors import UserError

COMMAND = 'estimate'
TRAINERS = ('default', 'stock', 'revplus')


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

  def __init__(self, bindings: list[str]):
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
      # As `train` reports it (e.g. corpus files that match nothing).
      raise _as_train_reports(e, bindings) or UserError(
          f"cannot read the config's inputs: {one_line(e)}",
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


def _as_train_reports(error: Exception, bindings: list[str]
                      ) -> Optional[UserError]:
  """`error` as `train` reports it when building its Loop, or None."""
  return failures.user_error(error, '', False, bindings)


def check_model(cfg, bindings: list[str]) -> None:
  """Builds and initializes the config's model as `train` would.

  Before any trainer: a model the config cannot build is the config's
  mistake, reported as `train` reports it (the same line: the model is
  initialized the way `train`'s run initializes it, block by block for
  the memory-efficient trainer), not a trainer's row.

  Raises:
    UserError: as `train` (exit status 2 for a model its bindings cannot
      build), or exit status 1 for an error nobody could foresee.
  """
  # pylint: disable=g-import-not-at-top
  from trax import fastmath
  from trax.optimizers import trainer as stock_lib
  import trax_revplus
  from trax_revplus import trainer as rev_lib
  # pylint: enable=g-import-not-at-top
  mode = gin_config.bound_value('train.use_memory_efficient_trainer', False)
  try:
    if mode and not gin_config.is_reference(mode):
      _blocks(rev_lib if trax_revplus.is_active() else stock_lib, cfg)
    else:
      cfg.model().init(_signature(cfg.batch),
                       rng=fastmath.random.get_prng(0))
  except Exception as e:  # pylint: disable=broad-except
    raise _as_train_reports(e, bindings) or UserError(
        f"cannot build the config's model: {one_line(e)}; fix the model "
        f'bindings (train.model, ...)', EXIT_RUNTIME) from None


def check_batch(cfg, n_devices: int, device_memory_bytes: Optional[int],
                bindings: list[str]) -> None:
  """Checks what a step on the config's batch needs, as the trainers will.

  The batch splits over `n_devices` (that many devices exist), the
  trainer's budget can be resolved, and, without a budget (when the
  configured `batch_slices` is used, not the planner's), `batch_slices`
  divides each device's rows.

  Raises:
    UserError (exit status 2): as `train` reports each.
  """
  # pylint: disable=g-import-not-at-top
  from trax_revplus import placement as placement_lib
  from trax_revplus import validation
  from trax_revplus.trainer import budget as budget_lib
  from trax_revplus.trainer import options as options_lib
  # pylint: enable=g-import-not-at-top
  options = options_lib.validate_gin_bindings()
  try:
    validation.check_n_devices(n_devices)
    validation.check_batch(cfg.batch, n_devices)
    setting = (options.device_memory_budget_bytes
               if device_memory_bytes is None else device_memory_bytes)
    budget = budget_lib.budget_bytes(setting,
                                     placement_lib.Placement(n_devices))
    if budget is None:
      validation.check_batch_slices(options.batch_slices,
                                    cfg.batch[0].shape[0] // n_devices)
  except validation.ConfigurationError as e:
    raise _as_train_reports(e, bindings) from None


def check_inputs_and_batch(bindings: list[str], n_devices: int,
                           device_memory_bytes: Optional[int] = None):
  """Reads one batch of the parsed config's inputs and checks it
  (`check_batch`) as `train`'s run will; returns the config to build from.

  Raises:
    UserError: as `train` reports the config's mistakes (exit status 2), or
      1 when the inputs cannot be read.
  """
  cfg = _Config(bindings)
  check_batch(cfg, n_devices, device_memory_bytes, bindings)
  return cfg


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
  """(TrainerMemory, plan line, the budget it planned for, the plans it
  weighed: `weighing.Weighing`) of trax_revplus's trainer.

  With `device_memory_bytes` (--device_memory) the trainer plans for it;
  without, for the budget its settings give (the config's
  `device_memory_budget_bytes`, by default the device's own size where the
  backend reports it). The plan, the least plan and the plans weighed come
  from one search: a plan is accounted once.
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
  try:
    plan = trainer.planned(cfg.batch).plan
    step = trainer.device_memory_of(cfg.batch)
    note = ('fits' if budget_bytes is not None else
            'no budget: as configured')
  except planner.DeviceMemoryBudgetError:
    plan = step = None
  least_plan, least = trainer.least_device_memory_of(cfg.batch)
  if plan is None:
    plan, step = least_plan, least
    note = (f'no plan fits {human_bytes(budget_bytes)}; the least needs '
            f'{least.peak_device_bytes} bytes')
  settings = dict(plan.settings(), n_calls=plan.n_calls)
  result = device_memory.trainer_memory(
      'revplus', trainer, cfg.batch, backend, step=step, plan=settings,
      least=(dict(least_plan.settings(), n_calls=least_plan.n_calls), least))
  return (result, f'{plan.describe()} ({note})', budget_bytes,
          trainer.planner.weighing(cfg.batch))


def estimate(device_memory_bytes: Optional[int], n_devices: int,
             bindings: list[str] = ()):
  """Builds and accounts the three trainers of the parsed config.

  First reads the inputs, checks the batch (`check_batch`) and builds the
  model (`check_model`): a mistake there is the config's, one line, before
  anything is compiled.

  Returns:
    (backend, {trainer: TrainerMemory}, revplus plan line or None,
    batch types, the budget revplus planned for or None, the plans revplus
    weighed (`weighing.Weighing`) or None).

  Raises:
    UserError: as `train` reports the config's mistakes.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import trax_revplus  # pylint: disable=g-import-not-at-top
  from trax_revplus import device_memory  # pylint: disable=g-import-not-at-top
  bindings = list(bindings)
  backend = jax.default_backend()
  activated = trax_revplus.is_active()
  cfg = check_inputs_and_batch(bindings, n_devices, device_memory_bytes)
  check_model(cfg, bindings)
  results, plan_line, budget, plans = {}, [None], [device_memory_bytes], [
      None]
  try:
    trax_revplus.deactivate()
    results['default'] = device_memory.account(
        'default', backend, 1, lambda: _default(cfg, backend))
    results['stock'] = device_memory.account(
        'stock', backend, 1, lambda: _stock(cfg, backend))
    trax_revplus.activate()

    def revplus():
      memory, plan_line[0], budget[0], plans[0] = _revplus(
          cfg, backend, n_devices, device_memory_bytes)
      return memory
    results['revplus'] = device_memory.account('revplus', backend, n_devices,
                                               revplus)
  finally:
    if not activated:
      trax_revplus.deactivate()
  return backend, results, plan_line[0], cfg.batch, budget[0], plans[0]


def table(backend, results, plan_line, batch, device_memory_bytes,
          n_devices, plans=None) -> str:
  """The printed report; `plans` (`weighing.Weighing` or None): the plans
  revplus weighed, listed under its plan."""
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
  if plans is not None and plans.weighed and results['revplus'].error is None:
    lines.append('')
    lines.append('revplus plans weighed (* the chosen plan):')
    lines.extend(plans.lines())
  return '\n'.join(lines)


def to_json(backend, results, plan_line, device_memory_bytes,
            n_devices, plans=None) -> dict:
  """The object `--json` writes; revplus's has the plans it weighed
  (`plans`, a `weighing.Weighing`) as `plans`."""
  out = {'backend': backend, 'device_memory_bytes': device_memory_bytes,
         'n_devices': n_devices,
         'trainers': {name: results[name].to_json(device_memory_bytes)
                      for name in TRAINERS}}
  if plan_line is not None and 'error' not in out['trainers']['revplus']:
    out['trainers']['revplus']['plan_line'] = plan_line
    if plans is not None:
      out['trainers']['revplus']['plans'] = plans.to_json()
  return out


def _budget_override_warning(device_memory_bytes: Optional[int]
                             ) -> Optional[str]:
  """A line when --device_memory replaces a budget the config sets."""
  from trax_revplus.trainer import options  # pylint: disable=g-import-not-at-top
  configured = options.validate_gin_bindings().device_memory_budget_bytes
  bound = 'device_memory_budget_bytes' in _bound_trainer_settings()
  if device_memory_bytes is None or not bound:
    return None
  return (f'--device_memory={device_memory_bytes} bytes overrides the '
          f"config's {preflight.TRAINER}.device_memory_budget_bytes = "
          f'{configured!r}; trax_revplus plans for --device_memory')


def _bound_trainer_settings() -> dict:
  import gin  # pylint: disable=g-import-not-at-top
  return gin.get_bindings(preflight.TRAINER)


def _json_writer(text: str):
  def fill(f) -> None:
    f.write(text.encode('utf-8'))
  return fill


def run(flags: argparse.Namespace) -> int:
  """Runs `trax-revplus estimate` with the parsed flags.

  Every check comes before the first compile: the flags, the --json path,
  the config's settings (`preflight`, as `train`), the inputs, the batch
  and the model.

  Returns:
    0 done.

  Raises:
    UserError: exit status 2 for a bad flag or config (as `train` would
      exit for the same config), 1 when the config's inputs cannot be read
      or the JSON cannot be written.
  """
  from trax_revplus.cli import train  # pylint: disable=g-import-not-at-top
  device_memory_bytes = None
  if flags.device_memory is not None:
    try:
      device_memory_bytes = parse_bytes(flags.device_memory)
    except ValueError as e:
      raise UserError(str(e)) from None
  if flags.json:
    output_files.check(flags.json, '--json', allow_stdout=True)
  config_files, bindings = train.configs_from_flags(flags)
  gin_config.import_trax()
  gin_config.parse_configs(config_files, bindings)
  # Not `no_effect_warnings`: estimate builds trax_revplus's trainer with
  # the trainer settings whatever train.use_memory_efficient_trainer says.
  preflight.check_config()
  override = _budget_override_warning(device_memory_bytes)
  if override:
    print(warning_line(COMMAND, override), file=sys.stderr, flush=True)
  # Compiling the trainers' programs raises third-party warnings (e.g. JAX's
  # on donations stock's programs cannot use): known ones are dropped, any
  # other is one line on stderr.
  with noise.route_warnings(std_logging.NullHandler(),
                            std_logging.StreamHandler(sys.stderr)):
    backend, results, plan_line, batch, budget, plans = estimate(
        device_memory_bytes, flags.n_devices, bindings)
  if budget is not None:
    device_memory_bytes = budget
  report = table(backend, results, plan_line, batch, device_memory_bytes,
                 flags.n_devices, plans)
  if flags.json == output_files.STDOUT:  # The JSON alone on stdout.
    print(report, file=sys.stderr, flush=True)
  else:
    print(report, flush=True)
  if flags.json:
    text = json.dumps(to_json(backend, results, plan_line,
                              device_memory_bytes, flags.n_devices, plans),
                      indent=1, sort_keys=True) + '\n'
    output_files.write(flags.json, _json_writer(text), '--json')
  return EXIT_OK
