"""What `estimate` prints and writes: its table and its `--json` object.

`estimate.run` accounts the three trainers (`estimate.estimate`); this
module words the figures: one row per trainer (or the line saying why it
has none), the plan revplus would run as gin bindings and the plans it
weighed (`table`), and the same figures as JSON (`to_json`). Kept apart
from `estimate`, which checks the flags and the config and runs the
accounting, so that the report's layout is read in one place.
"""

from typing import TYPE_CHECKING, Mapping

from trax_revplus.byte_sizes import format_bytes
from trax_revplus.cli import plan_bindings

if TYPE_CHECKING:  # JAX and trax load when the trainers are accounted
  from trax_revplus import device_memory
  from trax_revplus.trainer._search import weighed_plans

  Results = Mapping[str, device_memory.TrainerMemory]

TRAINERS = ('default', 'stock', 'revplus')


_TRAIN_RUNS_NOTES = {
  'default': (
    'train.use_memory_efficient_trainer is False or unset '
    "(trax's default): `train` would run trax's default Trainer "
    '(the default row), not a trax_revplus plan; set it to True '
    'for the revplus rows'
  ),
  'stock': (
    'the config does not import trax_revplus.activate: `train` '
    "would run stock trax's memory-efficient trainer (the stock "
    'row); add that line for the revplus rows'
  ),
}


def table(
  backend: str,
  results: 'Results',
  plan_line: str | None,
  batch: tuple,
  device_memory_bytes: int | None,
  n_devices: int,
  plans: 'weighed_plans.Weighing | None' = None,
  runs: str = 'revplus',
) -> str:
  """The printed report; `plans` (`weighed_plans.Weighing` or None): the plans
  revplus weighed, listed under its plan; `runs`: the trainer `train`
  would run (`estimate.train_runs`), a note where it is not revplus."""
  shapes = ', '.join(f'{x.dtype}{list(x.shape)}' for x in batch)
  lines = [
    f'figures compiled for backend {backend} (XLA memory analysis; other '
    f'backends compile differently), per device, one training step on '
    f'batch ({shapes}), asked for {n_devices} device(s)',
    f'device memory: {format_bytes(device_memory_bytes, unit=None)}'
    + (
      f' ({device_memory_bytes} bytes)'
      if device_memory_bytes
      else ' not given (--device_memory)'
    ),
  ]
  host_budget = None if plans is None else plans.host_budget_bytes
  if host_budget is not None:
    lines.append(
      f'host memory revplus plans for: '
      f'{format_bytes(host_budget, unit=None)} ({host_budget} '
      f'bytes)'
    )
  if runs in _TRAIN_RUNS_NOTES:
    lines.append(f'note: {_TRAIN_RUNS_NOTES[runs]}')
  lines += [
    '',
    f'{"trainer":<9}{"peak device/step":>18}{"least device/step":>19}'
    f'{"peak host/step":>16}{"host weights+slots":>20}'
    f'{"largest program":>17}{"fits":>6}  devices',
  ]
  for name in TRAINERS:
    r = results[name]
    if r.error is not None:
      lines.append(f'{name:<9}error: {r.error}')
      continue
    if r.refused is not None:
      lines.append(f'{name:<9}does not fit this device: {r.refused}')
      continue
    if r.step_error is not None:
      lines.append(f'{name:<9}fails at step 1: {r.step_error}')
      continue
    fits = r.fits(device_memory_bytes)
    fits_text = '-' if fits is None else ('yes' if fits else 'no')
    sizes = [
      format_bytes(n, unit=None)
      for n in (
        r.peak_device_bytes,
        r.min_peak_device_bytes,
        r.peak_host_bytes,
        r.host_weights_and_slots_bytes,
        r.largest_program_bytes,
      )
    ]
    lines.append(
      f'{name:<9}{sizes[0]:>18}{sizes[1]:>19}{sizes[2]:>16}'
      f'{sizes[3]:>20}{sizes[4]:>17}{fits_text:>6}  '
      f'{r.devices_text()}'
    )
  if plan_line:
    settings = results['revplus'].plan
    assert settings is not None, 'a plan line names the plan revplus ran'
    lines.append('')
    lines.extend(plan_bindings.lines(settings, plan_line))
  peak = results['revplus'].step
  if peak is not None:
    lines.append(f'revplus {peak.describe()}')
    lines.append(f'revplus {peak.describe_host()}')
    if not results['revplus'].least_weighed:
      lines.append(
        'revplus least device/step: not weighed, a plan fits (--least '
        "weighs it, compiling the leanest plans' programs too)"
      )
  if plans is not None and plans.cost is not None:
    lines.append(f'revplus planning: {plans.cost.describe()}')
  if plans is not None and plans.weighed and results['revplus'].error is None:
    lines.append('')
    lines.append('revplus plans weighed (* the chosen plan):')
    lines.extend(plans.lines())
  return '\n'.join(lines)


def to_json(
  backend: str,
  results: 'Results',
  plan_line: str | None,
  device_memory_bytes: int | None,
  n_devices: int,
  plans: 'weighed_plans.Weighing | None' = None,
  runs: str = 'revplus',
) -> dict:
  """The object `--json` writes; revplus's has the plans it weighed
  (`plans`, a `weighed_plans.Weighing`) as `plans`; `train_runs` is the trainer
  `train` would run (`estimate.train_runs`)."""
  trainers = {
    name: results[name].to_json(device_memory_bytes) for name in TRAINERS
  }
  revplus = trainers['revplus']
  if plan_line is not None and 'error' not in revplus:
    revplus['plan_line'] = plan_line
    if plans is not None:
      revplus['plans'] = plans.to_json()
      revplus['host_memory_budget_bytes'] = plans.host_budget_bytes
      revplus['planning'] = None if plans.cost is None else plans.cost.to_json()
  return {
    'backend': backend,
    'device_memory_bytes': device_memory_bytes,
    'n_devices': n_devices,
    'train_runs': runs,
    'trainers': trainers,
  }
