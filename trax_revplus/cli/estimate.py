"""`trax-revplus estimate`: will a config's training step fit a device?

Checks what `train` checks, with the same code and lines (`preflight`), and
the --json path (`output_files`), before anything is built; then the
config's inputs (one batch, for its shapes), that the batch splits over
--n_devices and into the trainer's batch slices, and that the model
builds, each mistake reported as `train` reports it (`parsed_config`),
before anything is compiled. Then it builds the config's model three times
(trax's default `Trainer`, stock trax's `ReversibleSerialTrainer`,
trax_revplus's), compiles what one step of each would run and composes XLA's
memory analysis of those programs into the step's peak device bytes, and
what each holds on the host into its peak host bytes
(`trax_revplus.three_trainers`, with `trax_revplus.device_memory`); runs
no step. A trainer the backend refuses to compile for memory does not fit
this device: its row says so. The batch's shapes come from the config's
inputs (trax's `Inputs` reads one batch to learn them). trax_revplus's
trainer is built with `device_memory_budget_bytes` set to `--device_memory`
(which overrides, with a warning line, a budget the config sets), so its
figures are those of the plan it would run under that memory (and its
host budget); the plans it weighed to choose that plan are listed under
it (`weighed_plans.Weighing`). Its plan is read back, where one applies,
from the plans `train` and `estimate` store in the compilation cache's
directory (`--compilation_cache_dir`; the trainer's settings that only
decide its log, which `estimate` sets otherwise than `train`, are not part
of a plan's key), and the plan it chooses is kept there for the `train` of
the same config (`trainer._search.plan_store`). A trainer that cannot be
built or compiled here gets a one-line error in its row instead of
figures. Third-party warnings known to be harmless (`noise.KNOWN_NOISE`)
are not shown; any other is one line.
"""

import argparse
import json
import logging as std_logging
import sys
from typing import TYPE_CHECKING, Sequence

import gin

import trax_revplus
from trax_revplus import notices
from trax_revplus import output_files
from trax_revplus import trax_import
from trax_revplus import validation
from trax_revplus.byte_sizes import format_bytes
from trax_revplus.cli import cache_flags
from trax_revplus.cli import estimate_report
from trax_revplus.cli import gin_config
from trax_revplus.cli import noise
from trax_revplus.cli import parsed_config
from trax_revplus.cli import preflight
from trax_revplus.cli.config_flags import configs_from_flags
from trax_revplus.cli.messages import warning_line
from trax_revplus.cli.sizes import parse_bytes
from trax_revplus.errors import EXIT_OK
from trax_revplus.errors import UserError

if TYPE_CHECKING:  # JAX and trax load when the trainers are accounted
  from trax_revplus.cli.estimate_report import Results
  from trax_revplus.trainer._search import weighed_plans

  # `estimate`'s: backend, results, plan line, batch types, budget bytes,
  # the plans revplus weighed.
  Estimate = tuple[
    str, Results, str | None, tuple, int | None, weighed_plans.Weighing | None
  ]

COMMAND = 'estimate'


def _plan_line(plan, budget_bytes: int | None) -> str | None:
  """trax_revplus's plan as the table names it: the plan, then whether it
  fits `budget_bytes`, the budget it planned for.

  Args:
    plan: `three_trainers.RevplusPlan`, or None (no line).
    budget_bytes: int or None (no budget).
  """
  if plan is None:
    return None
  if plan.fits:
    note = 'fits' if budget_bytes is not None else 'no budget: as configured'
  elif plan.reason is not None:
    note = plan.reason
  else:
    note = (
      f'no plan fits {format_bytes(budget_bytes, unit=None)}; the least '
      f'needs {plan.least_peak_device_bytes} bytes'
    )
  return f'{plan.description} ({note})'


def estimate(
  device_memory_bytes: int | None,
  n_devices: int,
  bindings: Sequence[str] = (),
  least: bool = False,
) -> 'Estimate':
  """Checks the parsed config, then builds and accounts its three trainers.

  First reads the inputs, checks the batch (`parsed_config.check_step_settings`)
  and builds the model (`parsed_config.check_model`): a mistake there is
  the config's, one line, before anything is compiled. The accounting is
  `trax_revplus.three_trainers`'.

  Returns:
    (backend, {trainer: TrainerMemory}, revplus plan line or None,
    batch types, the budget revplus planned for or None, the plans revplus
    weighed (`weighed_plans.Weighing`) or None).

  Raises:
    UserError: as `train` reports the config's mistakes.
  """
  jax = trax_import.jax
  # Here: it imports trax, once the flags are checked.
  from trax_revplus import three_trainers  # pylint: disable=g-import-not-at-top

  bindings = list(bindings)
  backend = jax.default_backend()
  cfg = parsed_config.check_inputs_and_batch(
    bindings, n_devices, device_memory_bytes
  )
  parsed_config.check_model(cfg, bindings)
  try:
    three = three_trainers.account_three(
      cfg, backend, n_devices, device_memory_bytes, least
    )
  except (validation.SequenceChunksError, validation.MicroBatchesError) as e:
    raise (
      parsed_config.as_train_reports(e, bindings) or UserError(str(e))
    ) from None
  return (
    backend,
    three.trainers,
    _plan_line(three.plan, three.budget_bytes),
    cfg.batch,
    three.budget_bytes,
    three.weighing,
  )


def train_runs() -> str:
  """The trainer `train` would run on the parsed config: 'default' (trax's
  `Trainer`: `train.use_memory_efficient_trainer` False or unset),
  'stock' (memory-efficient, the config does not activate trax_revplus)
  or 'revplus'."""
  if not gin_config.bound_value('train.use_memory_efficient_trainer', False):
    return 'default'
  return 'revplus' if trax_revplus.is_active() else 'stock'


def _budget_override_warning(device_memory_bytes: int | None) -> str | None:
  """A line when --device_memory replaces a budget the config sets."""
  # Here: it imports trax, once the flags are checked.
  # pylint: disable-next=g-import-not-at-top
  from trax_revplus.trainer import gin_bindings

  configured = gin_bindings.validate_gin_bindings().device_memory_budget_bytes
  bound = 'device_memory_budget_bytes' in _bound_trainer_settings()
  if device_memory_bytes is None or not bound:
    return None
  return (
    f'--device_memory={device_memory_bytes} bytes overrides the '
    f"config's {preflight.TRAINER}.device_memory_budget_bytes = "
    f'{configured!r}; trax_revplus plans for --device_memory'
  )


def _print_progress(line: str) -> None:
  """A progress line (the plans weighed as they are) on stderr: stdout
  holds the table, or the JSON."""
  print(line, file=sys.stderr, flush=True)


def _print_notice(message: str) -> None:
  print(warning_line(COMMAND, message), file=sys.stderr, flush=True)


def _bound_trainer_settings() -> dict:
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
  cache_dir = cache_flags.directory_from_flags(flags)
  gin_config.import_trax_quietly()
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
  # A setting the budget's plan replaces is one warning line (`notices`).
  with (
    noise.route_warnings(
      std_logging.NullHandler(),
      std_logging.StreamHandler(sys.stderr),
      noise.CommandLine(COMMAND, python_warning=True),
    ),
    notices.listening(_print_notice),
    notices.showing_progress(_print_progress),
    cache_flags.enabled(cache_dir),
  ):
    backend, results, plan_line, batch, budget, plans = estimate(
      device_memory_bytes, flags.n_devices, bindings, flags.least
    )
  if budget is not None:
    device_memory_bytes = budget
  runs = train_runs()
  report = estimate_report.table(
    backend,
    results,
    plan_line,
    batch,
    device_memory_bytes,
    flags.n_devices,
    plans,
    runs,
  )
  if flags.json == output_files.STDOUT:  # The JSON alone on stdout.
    print(report, file=sys.stderr, flush=True)
  else:
    print(report, flush=True)
  if flags.json:
    text = (
      json.dumps(
        estimate_report.to_json(
          backend,
          results,
          plan_line,
          device_memory_bytes,
          flags.n_devices,
          plans,
          runs,
        ),
        indent=1,
        sort_keys=True,
      )
      + '\n'
    )
    output_files.write(flags.json, _json_writer(text), '--json')
  return EXIT_OK
