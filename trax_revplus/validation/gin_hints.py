"""The fix for gin's "doesn't have a parameter" error on one of ours."""

import importlib
import inspect
import re


_OUR_CONFIGURABLES = {
  'ReversibleSerialTrainer': (
    'trax_revplus.trainer',
    'ReversibleSerialTrainer',
  ),
  'local_text_inputs': ('trax_revplus.data', 'local_text_inputs'),
  'ProgressPrinter': ('trax_revplus.progress', 'ProgressPrinter'),
}


# Settings of `trax_revplus.ReversibleSerialTrainer` that were removed, and
# what to do instead (the end of a sentence).
REMOVED_SETTINGS = {
  'store_activations': (
    'keeping every activation ran slower than recomputing it through '
    'the reversible layers (docs/performance.md); under a '
    'device_memory_budget_bytes the planner runs the whole model in one '
    "program, as trax's default Trainer, where that fits and is "
    'fastest. Remove the binding'
  ),
}


def removed_setting_message(configurable: str, name: str) -> str:
  """One line: setting `name` of `configurable` was removed, and the fix."""
  return f'{configurable}.{name} was removed: {REMOVED_SETTINGS[name]}.'


# gin's error for a name that is not a parameter, or (a configurable with an
# allowlist) not in its allowlist.
_UNKNOWN_PARAMETER = re.compile(
  r"Configurable '([\w.]+)' doesn't (?:have a parameter named|include "
  r"kwarg) '(\w+)'"
)


def settings_of(configurable: str) -> list[str]:
  """The settings a trax_revplus gin configurable takes (list of str), in
  its order: its parameters with a default value. Those without one are
  what trax passes it (the trainer's `blocks`, `loss_layer` and
  `optimizer_fn`, `ProgressPrinter`'s `loop`); a config does not set them.
  """
  module, name = _OUR_CONFIGURABLES[configurable]
  target = getattr(importlib.import_module(module), name)
  signature = inspect.signature(
    target.__init__ if inspect.isclass(target) else target
  )
  named = [
    p
    for p in signature.parameters.values()
    if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
  ]
  passed = {p.name for p in named if p.default is p.empty}
  # The trainer's settings beyond trax's arguments come as **settings;
  # gin's allowlist names them all.
  names = getattr(target, 'gin_parameters', None) or [p.name for p in named]
  return [n for n in names if n not in passed]


def _our_unknown_knob(message: str) -> tuple[str, str] | None:
  """(configurable, knob) of gin's "doesn't have a parameter" error on a
  trax_revplus configurable, or None."""
  match = _UNKNOWN_PARAMETER.search(message)
  if not match:
    return None
  configurable, knob = match.groups()
  short = configurable.rsplit('.', 1)[-1]
  if short not in _OUR_CONFIGURABLES or not (
    configurable == short or configurable.startswith('trax_revplus')
  ):
    return None
  return configurable, knob


def removed_knob_message(message: str) -> str | None:
  """For gin's "doesn't have a parameter" error on a removed setting of the
  trainer, `removed_setting_message`; else None."""
  found = _our_unknown_knob(message)
  if found is None:
    return None
  configurable, knob = found
  if (
    configurable.rsplit('.', 1)[-1] != 'ReversibleSerialTrainer'
    or knob not in REMOVED_SETTINGS
  ):
    return None
  return removed_setting_message(configurable, knob)


def unknown_knob_hint(message: str) -> str | None:
  """For gin's "doesn't have a parameter" error on one of ours, the fix.

  Args:
    message: str, gin's error message.

  Returns:
    str such as "trax_revplus.ReversibleSerialTrainer has no setting
    'no_such_knob'; its settings: n_devices, ..." (`settings_of`) or None
    if the message is not about a trax_revplus configurable.
  """
  found = _our_unknown_knob(message)
  if found is None:
    return None
  configurable, knob = found
  short = configurable.rsplit('.', 1)[-1]
  return (
    f'{configurable} has no setting {knob!r}; its settings: '
    f'{", ".join(settings_of(short))}'
  )
