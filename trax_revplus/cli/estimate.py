"""`trax-revplus estimate`: will a config's training step fit a device?

Checks what `train` checks, with the same code and lines (`preflight`), and
the --json path (`output_files`), before anything is built; then the
config's inputs (one batch, for its shapes), that the batch splits over
--n_devices and into the trainer's `batch_slices`, and that the model
builds, each mistake reported as `train` reports it (`parsed_config`),
before anything is compiled. Then it builds the config's model three times
(trax's default `Trainer`, stock trax's `ReversibleSerialTrainer`,
trax_revplus's), compiles what one step of each would run and composes XLA's
memory analysis of those programs into the step's peak device bytes
(`trax_revplus.device_memory`); runs no step. The batch's shapes come from
the config's inputs (trax's `Inputs` reads one batch to learn them).
trax_revplus's trainer is built with `device_memory_budget_bytes` set to
`--device_memory` (which overrides, with a warning line, a budget the config
sets), so its figures are those of the plan it would run under that
memory; the plans it weighed to choose that plan are listed under it
(`weighing.Weighing`). A trainer that cannot be built or compiled here gets
a one-line error in its row instead of figures. Third-party warnings known to
be harmless (`noise.KNOWN_NOISE`) are not shown; any other is one line.
"""

import argparse
import json
import logging as std_logging
import sys
from typing import Optional

from trax_revplus import output_files
from trax_revplus.cli import gin_config
from trax_revplus.cli import noise
from trax_revplus.cli import parsed_config
from trax_revplus.cli import preflight
from trax_revplus.cli.config_flags import configs_from_flags
from trax_revplus.cli.messages import warning_line
from trax_revplus.cli.sizes import human_bytes
from trax_revplus.cli.sizes import parse_bytes
from trax_revplus.errors import EXIT_OK
from trax_revplus.errors import UserError

COMMAND = 'estimate'
TRAINERS = ('default', 'stock', 'revplus')


def _default(cfg, backend):
  from trax import fastmath  # pylint: disable=g-import-not-at-top
  from trax import layers as tl  # pylint: disable=g-import-not-at-top
  from trax import optimizers  # pylint: disable=g-import-not-at-top
  from trax_revplus import device_memory  # pylint: disable=g-import-not-at-top
  model = tl.Serial(cfg.model(), cfg.loss())
  model.init(parsed_config.signature(cfg.batch),
             rng=fastmath.random.get_prng(0))
  opt = cfg.optimizer()
  opt.tree_init(model.weights)
  trainer = optimizers.Trainer(model, opt, n_devices=1)
  return device_memory.trainer_memory('default', trainer, cfg.batch, backend)


def _stock(cfg, backend):
  from trax.optimizers import trainer as stock_lib  # pylint: disable=g-import-not-at-top
  from trax_revplus import device_memory  # pylint: disable=g-import-not-at-top
  blocks, loss_layer = parsed_config.reversible_blocks(stock_lib, cfg)
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
  blocks, loss_layer = parsed_config.reversible_blocks(rev_lib, cfg)
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

  First reads the inputs, checks the batch (`parsed_config.check_batch`)
  and builds the model (`parsed_config.check_model`): a mistake there is
  the config's, one line, before anything is compiled.

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
  cfg = parsed_config.check_inputs_and_batch(bindings, n_devices,
                                             device_memory_bytes)
  parsed_config.check_model(cfg, bindings)
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
  device_memory_bytes = None
  if flags.device_memory is not None:
    try:
      device_memory_bytes = parse_bytes(flags.device_memory)
    except ValueError as e:
      raise UserError(str(e)) from None
  if flags.json:
    output_files.check(flags.json, '--json', allow_stdout=True)
  config_files, bindings = configs_from_flags(flags)
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
