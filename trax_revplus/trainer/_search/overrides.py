"""Settings a device memory budget replaced: one notice each.

Under a budget the planner chooses the step's plan (`planner`); a setting
the user gave explicitly is kept where it pins a dimension of the plan
(`segment_max_layers`, `backward_segment_max_layers`, the plan's
dimensions: `dimensions.DIMENSIONS`), but the plan that runs may still
differ from it: a budget may replace a dimension's slicing
(`dimensions.PlanDimension.replaced`), `n_async_layers` is only the
deepest copy-back the planner tries, and the fused program (every layer in
the loss program) has no backward segments of its own. `replaced` names
each explicit setting the chosen plan does not run as given, with the
value used and why, so that the person who set it hears of it on the
terminal (`trax_revplus.notices`) and not only in `train.log`.
"""

from typing import Collection

from absl import logging

from trax_revplus import notices
from trax_revplus.trainer._plan import dimensions
from trax_revplus.trainer._plan import options as options_lib
from trax_revplus.trainer._plan import plan as plan_lib


def _message(name: str, value: object, used: object, why: str) -> str:
  return (
    f'{options_lib.GIN_CONFIGURABLE}.{name} = {value!r} was replaced '
    f'by {used!r} under the device memory budget: {why}; set '
    f'{options_lib.GIN_CONFIGURABLE}.device_memory_budget_bytes = None '
    f'to run the settings as given'
  )


def replaced(
  plan: plan_lib.StepPlan,
  options: options_lib.TrainerOptions,
  explicit: Collection[str],
  budget_bytes: int,
) -> list[str]:
  """One line per explicitly set setting `plan` does not run as given.

  Args:
    plan: the `plan.StepPlan` chosen under the budget.
    options: the trainer's `options.TrainerOptions`.
    explicit: names of the settings given explicitly (gin bindings or the
      constructor's keyword arguments).
    budget_bytes: int, the budget the plan was chosen for.

  Returns:
    list of str, each naming the setting, the value set, the value used
    and why; empty where every explicit setting runs as given.
  """
  out = []
  budget = f'{budget_bytes} bytes'
  fused = plan.fused_from < plan.loss
  for dimension in dimensions.DIMENSIONS:
    name, used = dimension.name, getattr(plan, dimension.name)
    value = getattr(options, name)
    if (
      dimension.replaced
      and name in explicit
      and value != options_lib.AUTO
      and used != value
    ):
      out.append(_message(name, value, used, f'{dimension.replaced} {budget}'))
  if (
    'n_async_layers' in explicit
    and plan.n_async_layers != options.n_async_layers
  ):
    out.append(
      _message(
        'n_async_layers',
        options.n_async_layers,
        plan.n_async_layers,
        f'under a budget it is the deepest copy-back tried, and the plans '
        f'with a deeper one need more than {budget}',
      )
    )
  backward = options.backward_segment_max_layers
  if (
    'backward_segment_max_layers' in explicit
    and backward != options_lib.AUTO
    and fused
  ):
    out.append(
      _message(
        'backward_segment_max_layers',
        backward,
        plan.settings()['backward_segment_max_layers'],
        'the fastest plan that fits runs every layer in the loss program, '
        'which has no backward segments of its own',
      )
    )
  return out


def notify_replaced(
  plan: plan_lib.StepPlan,
  options: options_lib.TrainerOptions,
  explicit: Collection[str],
  budget_bytes: int,
  notified: set[str],
) -> None:
  """Logs and notifies (`trax_revplus.notices`) each line of `replaced`
  not in `notified` yet (which it adds to): once per run, not per batch
  shape."""
  for line in replaced(plan, options, explicit, budget_bytes):
    if line not in notified:
      notified.add(line)
      logging.info('warning: %s', line)
      notices.notify(line)
