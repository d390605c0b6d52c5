"""The fix for gin's "doesn't have a parameter" error on one of ours."""

import inspect
import re


_OUR_CONFIGURABLES = {
    'ReversibleSerialTrainer': ('trax_revplus.trainer',
                                'ReversibleSerialTrainer'),
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
        'fastest. Remove the binding'),
}


def removed_setting_message(configurable, name):
  """One line: setting `name` of `configurable` was removed, and the fix."""
  return f'{configurable}.{name} was removed: {REMOVED_SETTINGS[name]}.'


# gin's error for a name that is not a parameter, or (a configurable with an
# allowlist) not in its allowlist.
_UNKNOWN_PARAMETER = re.compile(
    r"Configurable '([\w.]+)' doesn't (?:have a parameter named|include "
    r"kwarg) '(\w+)'")


def parameters_of(configurable):
  """Names a trax_revplus gin configurable accepts (list of str)."""
  import importlib  # pylint: disable=g-import-not-at-top
  module, name = _OUR_CONFIGURABLES[configurable]
  target = getattr(importlib.import_module(module), name)
  if hasattr(target, 'gin_parameters'):  # keyword settings, listed there
    return [n for n in target.gin_parameters if n not in ('self', 'loop')]
  if inspect.isclass(target):
    target = target.__init__
  names = [p.name for p in inspect.signature(target).parameters.values()
           if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
  return [n for n in names if n not in ('self', 'loop')]


def _our_unknown_knob(message):
  """(configurable, knob) of gin's "doesn't have a parameter" error on a
  trax_revplus configurable, or None."""
  match = _UNKNOWN_PARAMETER.search(message)
  if not match:
    return None
  configurable, knob = match.groups()
  short = configurable.rsplit('.', 1)[-1]
  if short not in _OUR_CONFIGURABLES or not (
      configurable == short or configurable.startswith('trax_revplus')):
    return None
  return configurable, knob


def removed_knob_message(message):
  """For gin's "doesn't have a parameter" error on a removed setting of the
  trainer, `removed_setting_message`; else None."""
  found = _our_unknown_knob(message)
  if found is None:
    return None
  configurable, knob = found
  if (configurable.rsplit('.', 1)[-1] != 'ReversibleSerialTrainer' or
      knob not in REMOVED_SETTINGS):
    return None
  return removed_setting_message(configurable, knob)


def unknown_knob_hint(message):
  """For gin's "doesn't have a parameter" error on one of ours, the fix.

  Args:
    message: str, gin's error message.

  Returns:
    str such as "trax_revplus.ReversibleSerialTrainer has no knob
    'no_such_knob'; its knobs: blocks, ..." or None if the message is not
    about a trax_revplus configurable.
  """
  found = _our_unknown_knob(message)
  if found is None:
    return None
  configurable, knob = found
  short = configurable.rsplit('.', 1)[-1]
  return (f'{configurable} has no knob {knob!r}; its knobs: '
          f'{", ".join(parameters_of(short))}')
