"""trax_revplus's plan as gin bindings, and what no binding pins.

`estimate` prints the plan its trainer would run as lines a gin config
file (or `--config`) takes unchanged: each dimension of the plan that is a
setting of `trax_revplus.ReversibleSerialTrainer`
(`options.TrainerOptions`), at the plan's value, where pinning that value
keeps the plan. Pinned so, the planner keeps them and chooses the rest
(under the same budget, the same plan), which are shown apart on one
line: what the planner derives (the layers fused into the loss layer's
program, prefetching, what waits on the host), the segment lengths of a
plan that runs the whole model in one program (a pinned length excludes
that program), and a value no setting takes (attention heads at once
None, the attention layers as configured, or by kind of layer, which only
'auto' gives).
"""

from typing import Any

from trax_revplus import validation

TRAINER = 'trax_revplus.ReversibleSerialTrainer'


def _accepted(name: str, value: Any) -> bool:
  """Whether trainer setting `name` takes `value`."""
  # Here: it imports trax, once the flags are checked.
  # pylint: disable-next=g-import-not-at-top
  from trax_revplus.trainer._plan import options

  try:
    options.TrainerOptions.of({name: value})
  except validation.TrainerOptionError:
    return False
  return True


def split(settings: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
  """The plan's dimensions as (settable, chosen by the planner alone).

  Args:
    settings: the plan as `StepPlan.settings()` names it; an 'n_calls'
      entry (`device_memory.TrainerMemory.plan`) is left out.

  Returns:
    Two dicts in the plan's order: the settings taking the plan's value,
    and the rest.
  """
  # Here: it imports trax, once the flags are checked.
  # pylint: disable-next=g-import-not-at-top
  from trax_revplus.trainer._plan import options

  names = set(options.TrainerOptions.field_names())
  if settings.get('fused_layers'):
    # The whole model in the loss layer's program: its segment lengths
    # describe that program; pinned, a length excludes it
    # (`trainer._search.candidates`).
    names -= {'segment_max_layers', 'backward_segment_max_layers'}
  settable, derived = {}, {}
  for name, value in settings.items():
    if name == 'n_calls':
      continue
    if name in names and _accepted(name, value):
      settable[name] = value
    else:
      derived[name] = value
  return settable, derived


def lines(settings: dict[str, Any], plan_line: str) -> list[str]:
  """The plan as `estimate` prints it.

  Args:
    settings: the plan (`device_memory.TrainerMemory.plan`, with
      'n_calls').
    plan_line: its line, `StepPlan.describe()` then whether it fits, e.g.
      'segment_max_layers=16, ..., 1 call per step (fits)'.

  Returns:
    'revplus plan: 1 call per step (fits); as gin bindings:', one gin
    binding per line, then 'revplus plan, left to the planner (no binding
    pins it): segment_max_layers=16, ...'.
  """
  settable, derived = split(settings)
  # The plan line repeats the plan's settings, then says what it does.
  described = ', '.join(
    f'{k}={v}' for k, v in settings.items() if k != 'n_calls'
  )
  what = (
    plan_line[len(described) + 2 :]
    if plan_line.startswith(described + ', ')
    else plan_line
  )
  out = [f'revplus plan: {what}; as gin bindings:']
  out += [f'{TRAINER}.{name} = {value!r}' for name, value in settable.items()]
  if derived:
    out.append(
      'revplus plan, left to the planner (no binding pins it): '
      + ', '.join(f'{k}={v}' for k, v in derived.items())
    )
  return out
