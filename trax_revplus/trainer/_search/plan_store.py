"""Chosen plans, kept so that a config plans once per device.

Planning under a budget that the fastest plan does not fit compiles
candidate plans before the first step; a resumed run, a second run of the
same config, or `estimate` and `train` of one config would pay that again.
`PlanStore` keeps each chosen plan in a `plans.json`. A run reads back one
store (the planner's `Planner.plan_stores`): the compilation cache's
directory's where the cache is on (`train` and `estimate` turn it on, by
default in `~/.cache/trax_revplus/jax`: every config's plans, shared by
both commands and every output directory), else the run's output
directory's. It keeps the plan it chose there, and in its output
directory's `plans.json` too, the record of the plans the run used (what
`compare` reads).

An entry's key (`plan_key`) is what its plan depends on: the config
(`describe_config`: the model's layers and their weights' shapes, the
batch's shapes, dtypes and layout over the devices, and the trainer's
settings but those that only decide what a run logs or where it writes,
`UNPLANNED_SETTINGS`) and where it is planned (`environment`: the versions
of JAX, jaxlib, trax and trax_revplus, the backend, the devices' kind and
count). Each entry records the range of budgets it is the answer for: from
its own peak device bytes up to (not including) the least bytes that
excluded a faster plan. A plan is read back only for the same key and a
budget in that range; the planner then accounts it as it would any plan
(its compilation is the step's own) and runs it only where it still fits.

What a run finds is one line: a plan that applies, the planner's `planned
in ... (the plan kept in PATH)` line; where none applies, a progress line
naming what differs between this run and the nearest stored plan (the
model, the batch, a trainer setting, the versions, the devices' kind or
count, the budget; `PlanStore.lookup`); a file that cannot be used (not
readable, a directory, not a plans file of this version, a damaged entry),
one warning line. The run then plans afresh and keeps its plan: a stored
plan saves time, never decides a result (it is the plan the same key and
budget would choose).
"""

import contextlib
import dataclasses
import hashlib
from importlib import metadata
import json
import os
import secrets
from typing import Any, Mapping, Sequence

from absl import logging
import jax
from trax import layers as tl

from trax_revplus import notices
from trax_revplus.byte_sizes import format_apart
from trax_revplus.trainer._plan import dimensions
from trax_revplus.trainer._plan import plan as plan_lib

FILENAME = 'plans.json'
# 10: each entry says, in words, what in its plan can change stock trax's
# float32 summation order (`REORDERINGS`). 11: keyed by the config alone,
# each entry with its `environment`. 12: keyed by the config and the
# environment, each entry with its `config` described, so that a plan that
# does not apply names what differs. 13: each plan says whether weights and
# slots stay on the device (`params_on_device`). 14: `parallel_heads` may
# name each kind of attention layer's own number (`plan.PairsByKind`).
FORMAT = 'trax_revplus plans 14'
# The key of an entry's list of what in its plan can change stock trax's
# float32 summation order (`dimensions.reorderings`): read by
# `compare.exactness`, which imports neither JAX nor the trainer.
REORDERINGS = 'summation_order_changes'
# The trainer's settings (`options.TrainerOptions`) a plan does not depend
# on: what a run logs and where it writes (`estimate` builds its trainer
# without TensorBoard or an output directory, and `train --memory_log_...`
# sets the log's, yet both plan alike), and the budgets, which an entry's
# range of budgets stands for (the host's changes from run to run). Every
# other setting, a new one included, is part of the key.
UNPLANNED_SETTINGS = (
  'output_dir',
  'memory_log_every_n_steps',
  'memory_log_per_layer',
  'memory_log_tensorboard',
  'memory_log_first_steps',
  'clear_compilation_caches',
  'device_memory_budget_bytes',
  'host_memory_budget_bytes',
)


def _version(distribution: str) -> str:
  try:
    return metadata.version(distribution)
  except metadata.PackageNotFoundError:
    return 'unknown'


class StoredPlanIgnoredWarning(UserWarning):
  """A plans file could not be used, or a plan not kept: the run plans
  afresh."""


def environment(
  platform: str, device_kind: str, n_devices: int
) -> dict[str, Any]:
  """Where a plan is planned: the versions of JAX, jaxlib, trax and
  trax_revplus, the backend's platform ('cpu', 'gpu', 'tpu'), the kind of
  its devices (`jax.Device.device_kind`, e.g. 'TPU v5 lite') and the
  devices of the run (all processes)."""
  return {
    **{
      name: _version(name) for name in ('jax', 'jaxlib', 'trax', 'trax_revplus')
    },
    'platform': platform,
    'device_kind': device_kind,
    'n_devices': n_devices,
  }


def _sha256(text: str) -> str:
  return hashlib.sha256(text.encode()).hexdigest()


def describe_config(
  batch_key: Any,
  settings: Mapping[str, Any],
  layers: Sequence[tl.Layer],
  host_batch: Any = None,
) -> dict[str, Any]:
  """What decides a step's plan besides where it runs, as JSON data.

  Args:
    batch_key: the shapes, dtypes and shardings of the batch
      (`weighers.batch_key`: its tree structure, then (shape, dtype,
      sharding) per leaf).
    settings: the trainer's settings (`dataclasses.asdict` of its
      `options.TrainerOptions`); those in `UNPLANNED_SETTINGS` are left out.
    layers: the trainer's layers by index (trax `Layer`s, host weights).
    host_batch: the batch's types as the host holds it (this process's
      rows, unsharded: `on_types.StepTypes.host_batch`), or None: those of
      `batch_key`.

  Returns:
    dict: 'model' (a digest of the layers and their weights' shapes and
    dtypes), 'batch' (the host batch's shapes and dtypes, e.g. 'int32[2,
    32], float32[2, 32]', whatever the device count), 'batch_layout' (a
    digest of its tree structure and placed shapes and shardings, which
    the device count decides) and 'settings' ({name: value}).
  """
  model = [
    (
      repr(layer),
      [
        (tuple(x.shape), str(x.dtype))
        for x in jax.tree_util.tree_leaves(layer.weights)
        if hasattr(x, 'shape')
      ],
    )
    for layer in layers
  ]
  treedef, leaves = batch_key
  host = (
    [
      (tuple(x.shape), str(x.dtype))
      for x in jax.tree_util.tree_leaves(host_batch)
    ]
    if host_batch is not None
    else [(shape, dtype) for shape, dtype, _ in leaves]
  )
  batch = ', '.join(
    f'{dtype}[{", ".join(str(n) for n in shape)}]' for shape, dtype in host
  )
  layout = (
    repr(treedef),
    [(shape, repr(sharding)) for shape, _, sharding in leaves],
  )
  # As JSON reads them back, so that a stored config compares equal.
  planned = json.loads(
    json.dumps(
      {
        name: value
        for name, value in settings.items()
        if name not in UNPLANNED_SETTINGS
      },
      default=repr,
      sort_keys=True,
    )
  )
  return {
    'model': _sha256(repr(model)),
    'batch': batch,
    'batch_layout': _sha256(repr(layout)),
    'settings': planned,
  }


def plan_key(config: Mapping[str, Any], where: Mapping[str, Any]) -> str:
  """The key of the plan of `config` (`describe_config`) planned where it
  runs (`where`, `environment()`): 64 hex digits."""
  return _sha256(
    json.dumps(
      {'config': config, 'environment': where}, sort_keys=True, default=repr
    )
  )


# `StepPlan`'s fields that hold layer indices (the rest are settings: one
# JSON value each, under the field's name, read back by `_setting`).
_LAYOUT = ('blocks', 'loss', 'backward')


def _setting(field: dataclasses.Field, value: Any) -> Any:
  """A setting field's JSON value as `StepPlan` holds it: a bool, or an
  int (None where it is a dimension whose value that changes nothing is
  None: `dimensions.PlanDimension.none`; `parallel_heads` by kind, a
  `plan.PairsByKind`).

  Raises:
    TypeError, ValueError: `value` is not one.
  """
  if (
    value is None
    and field.name in dimensions.names()
    and (dimensions.by_name(field.name).none is None)
  ):
    return None
  if field.name == 'parallel_heads' and isinstance(value, list):
    # A `plan.PairsByKind`: [[kind, n], ...].
    return tuple((str(kind), int(n)) for kind, n in value)
  return bool(value) if field.type is bool else int(value)


def plan_to_json(plan: plan_lib.StepPlan) -> dict:
  """`plan` as JSON-able data (`plan_from_json` reads it back): its layout,
  then every setting field (the plan's dimensions among them) under its
  name."""
  return {
    'blocks': [
      [std, [list(s) for s in segments]] for std, segments in plan.blocks
    ],
    'loss': plan.loss,
    'backward': [
      [list(s), [list(b) for b in splits]]
      for s, splits in plan.backward.items()
    ],
    **{
      f.name: getattr(plan, f.name)
      for f in dataclasses.fields(plan)
      if f.name not in _LAYOUT
    },
  }


def plan_from_json(data: Mapping[str, Any]) -> plan_lib.StepPlan:
  """The `StepPlan` of `plan_to_json`'s data.

  Raises:
    ValueError, KeyError, TypeError: the data is not a plan.
  """
  return plan_lib.StepPlan(
    blocks=tuple(
      (int(std), tuple(tuple(int(i) for i in s) for s in segments))
      for std, segments in data['blocks']
    ),
    loss=int(data['loss']),
    backward={
      tuple(int(i) for i in s): tuple(tuple(int(i) for i in b) for b in splits)
      for s, splits in data['backward']
    },
    **{
      f.name: _setting(f, data[f.name])
      for f in dataclasses.fields(plan_lib.StepPlan)
      if f.name not in _LAYOUT
    },
  )


def _digest(entry: Mapping[str, Any]) -> str:
  body = {k: v for k, v in entry.items() if k != 'sha256'}
  return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _devices(n: Any) -> str:
  return f'{n} device{"s" * (n != 1)}'


# What differs in where a plan was planned decides the batch's layout over
# the devices too, as another batch's shapes do: that difference is not
# named again.
_DECIDE_LAYOUT = ('platform', 'device_kind', 'n_devices')


def differences(
  stored: Mapping[str, Any],
  stored_where: Mapping[str, Any],
  config: Mapping[str, Any],
  where: Mapping[str, Any],
) -> list[str]:
  """What differs between a stored entry of the same model and this run,
  in words, e.g. ['2 devices (this run: 1)', 'jax 0.10.1 (this run:
  0.10.2)']; [] where nothing does.

  Args:
    stored: the entry's config (`describe_config`).
    stored_where: the entry's `environment()`.
    config: this run's config.
    where: this run's `environment()`.
  """
  words = []
  other_batch = stored.get('batch') != config['batch']
  if other_batch:
    words.append(f'batch {stored.get("batch")} (this run: {config["batch"]})')
  moved = [
    name for name in _DECIDE_LAYOUT if stored_where.get(name) != where[name]
  ]
  if (
    stored.get('batch_layout') != config['batch_layout']
    and not other_batch
    and not moved
  ):
    words.append('another layout of the batch over the devices')
  stored_settings = stored.get('settings')
  if not isinstance(stored_settings, Mapping):
    stored_settings = {}
  changed = [
    f'{name}={stored_settings.get(name)!r} (this run: {value!r})'
    for name, value in config['settings'].items()
    if stored_settings.get(name) != value
  ] + [
    f'{name}={value!r} (this run: none)'
    for name, value in stored_settings.items()
    if name not in config['settings']
  ]
  if changed:
    words.append('trainer settings ' + ', '.join(changed))
  for name, value in where.items():
    if stored_where.get(name) == value:
      continue
    if name == 'n_devices':
      words.append(f'{_devices(stored_where.get(name))} (this run: {value})')
    else:
      words.append(f'{name} {stored_where.get(name)} (this run: {value})')
  return words


@dataclasses.dataclass(frozen=True)
class Stored:
  """A stored plan that applies to a run.

  Attributes:
    plan: the `plan.StepPlan`.
    peak_device_bytes: its peak device bytes when it was planned: the
      least budget it answers.
    faster_plans_need_bytes: the least bytes that excluded a faster plan
      (the budgets it answers end below it), or None (any budget above).
    step_seconds: float seconds a step of it took where it was timed
      when planned (`options.TrainerOptions.time_plans`), else None.
  """

  plan: plan_lib.StepPlan
  peak_device_bytes: int
  faster_plans_need_bytes: int | None
  step_seconds: float | None = None


def _name(key: str, peak_device_bytes: int) -> str:
  """An entry's name in the file: its key and the least budget it answers
  (a config keeps one plan per range of budgets)."""
  return f'{key}/{peak_device_bytes}'


def _key_of(name: str) -> str:
  """The key of the entry named `name` (`_name`)."""
  return name.partition('/')[0]


def _stored(entry: Any) -> Stored:
  """The `Stored` of an entry read from the file.

  Raises:
    AttributeError, KeyError, TypeError, ValueError: it is damaged.
  """
  if entry.get('sha256') != _digest(entry):
    raise ValueError('its digest does not match its content')
  high = entry['faster_plans_need_bytes']
  seconds = entry.get('step_seconds')
  return Stored(
    plan_from_json(entry['plan']),
    int(entry['peak_device_bytes']),
    None if high is None else int(high),
    None if seconds is None else float(seconds),
  )


class PlanStore:
  """The plans kept in one directory (`FILENAME`).

  Attributes:
    path: str, the plans file.
  """

  def __init__(self, directory: str):
    """Args:
    directory: str, the run's output directory, or the compilation
      cache's (made where missing when a plan is kept).
    """
    self.path = os.path.join(directory, FILENAME)
    # Said once per store: a run that plans several batch shapes reads it
    # again for each.
    self._said = False
    # The file could not be read (a directory, no permission): a plan is
    # not written over it either, and its line said so.
    self._unusable = False

  def _tell(self, message: str, warning: bool) -> None:
    """One line, once: a warning (`notices.notify`) for a file that cannot
    be used, else a progress line (`notices.progress`: what the planner
    does, and why)."""
    if self._said:
      return
    self._said = True
    if warning:
      logging.info('%s', message)
      notices.notify(message, StoredPlanIgnoredWarning)
    else:
      notices.progress(f'planning: {message}')

  def _read(self, quiet: bool = False) -> dict | None:
    """The stored entries by key: {} where there is no file yet; None where
    it cannot be used (one warning line, unless `quiet`)."""
    try:
      if os.path.exists(self.path) and not (
        os.path.isfile(self.path) or os.path.isdir(self.path)
      ):
        # A FIFO or a device would block the read, or never end it.
        raise OSError('it is not a regular file')
      with open(self.path, 'rb') as f:
        text = f.read()
    except FileNotFoundError:
      return {}
    except OSError as e:
      if quiet:
        return {}
      self._unusable = True
      self._tell(
        f'stored plans {self.path} could not be read ({self._reason(e)}): '
        f'no plan is read from it or kept in it; planning afresh',
        warning=True,
      )
      return None
    try:
      data = json.loads(text)  # UTF-8 that does not decode: a ValueError
    except ValueError as e:
      if not quiet:
        self._ignored(f'not JSON: {e}')
      return None
    if not isinstance(data, dict) or data.get('format') != FORMAT:
      if not quiet:
        found = data.get('format') if isinstance(data, dict) else None
        self._ignored(
          'not a plans file of this version'
          + (f': {found!r}, this version reads {FORMAT!r}' if found else '')
        )
      return None
    plans = data.get('plans')
    if not isinstance(plans, dict) or not all(
      isinstance(entry, dict) for entry in plans.values()
    ):
      if not quiet:
        self._ignored('damaged: its plans are not a mapping of plan entries')
      return None
    return plans

  def _ignored(self, why: str) -> None:
    self._tell(
      f'stored plans {self.path} ignored ({why}); planning afresh (a plan '
      f'chosen now replaces the file)',
      warning=True,
    )

  def _reason(self, e: OSError) -> str:
    """`e` in a few words: 'it is a directory', 'Permission denied'."""
    if isinstance(e, IsADirectoryError) or os.path.isdir(self.path):
      return 'it is a directory'
    return e.strerror or str(e)

  def lookup(
    self,
    key: str,
    config: Mapping[str, Any],
    where: Mapping[str, Any],
    budget_bytes: int,
  ) -> Stored | None:
    """The plan stored for `key` that answers `budget_bytes`, or None.

    Where none does, one line says why (once per store): the file cannot
    be used, or this key's entry is damaged (a warning); this key's plans
    answer other budgets, the nearest stored plan of the same model
    differs from this run in what it names (the batch, a trainer setting,
    the versions, the devices' kind or count), or no stored plan is of
    this model (a progress line). No file yet is no line.

    Args:
      key: str, `plan_key(config, where)`.
      config: `describe_config()` of the step.
      where: `environment()` of this run.
      budget_bytes: int, the budget per device the step plans under.

    Returns:
      `Stored`, or None.
    """
    plans = self._read()
    if not plans:
      return None
    ranges: list[tuple[int, int | None]] = []
    damaged = None
    for name, entry in plans.items():
      if _key_of(name) != key:
        continue
      try:
        stored = _stored(entry)
        if entry['config'] != config or entry['environment'] != where:
          raise ValueError('its key does not match its config')
      except (AttributeError, KeyError, TypeError, ValueError) as e:
        damaged = e
        continue
      low, high = stored.peak_device_bytes, stored.faster_plans_need_bytes
      if low <= budget_bytes and (high is None or budget_bytes < high):
        return stored
      ranges.append((low, high))
    if damaged is not None:
      self._tell(
        f'the plan stored in {self.path} for this config is damaged '
        f'({damaged}); planning afresh',
        warning=True,
      )
    elif ranges:
      bounds = sorted({n for r in ranges for n in r if n is not None})
      size = dict(
        zip([budget_bytes, *bounds], format_apart(budget_bytes, *bounds))
      ).__getitem__
      answers = ', '.join(
        f'{size(low)} or more'
        if high is None
        else f'from {size(low)} up to {size(high)}'
        for low, high in sorted(ranges, key=lambda r: r[0])
      )
      n = len(ranges)
      self._tell(
        f'the plan{"s" * (n != 1)} stored in {self.path} for this config '
        f"answer{'s' * (n == 1)} budgets {answers}, not this run's "
        f'{size(budget_bytes)}; planning afresh',
        warning=False,
      )
    else:
      self._tell(self._nearest(plans, config, where), warning=False)
    return None

  def _nearest(
    self,
    plans: Mapping[str, Any],
    config: Mapping[str, Any],
    where: Mapping[str, Any],
  ) -> str:
    """Why no stored plan applies: what differs in the stored plan of the
    same model that differs least, or that none is of this model."""
    nearest: list[str] | None = None
    for entry in plans.values():
      try:
        stored = entry['config']
        stored_where = entry['environment']
        if stored['model'] != config['model']:
          continue
        words = differences(stored, stored_where, config, where)
      except (KeyError, TypeError, AttributeError):
        continue  # a damaged entry of another key: not this run's concern
      if nearest is None or len(words) < len(nearest):
        nearest = words
    if nearest is None:
      n = len(plans)
      return (
        f'no plan stored in {self.path} is for this model (its layers or '
        f"their weights' shapes differ from those of the {n} stored "
        f'plan{"s" * (n != 1)}); planning afresh'
      )
    return (
      f'the plan stored in {self.path} for this model was planned for '
      f'{", ".join(nearest) or "another config"}; planning afresh'
    )

  def save(
    self,
    key: str,
    plan: plan_lib.StepPlan,
    peak_device_bytes: int,
    faster_plans_need_bytes: int | None,
    where: Mapping[str, Any],
    config: Mapping[str, Any] | None = None,
    read_back: bool = True,
    step_seconds: float | None = None,
  ) -> None:
    """Keeps `plan` as the answer for `key` where it was planned (`where`,
    `environment()`) under budgets from `peak_device_bytes` up to
    `faster_plans_need_bytes` (None: any budget above), with `config`
    (`describe_config()`), by which a later run that `key` does not fit
    names what differs. A write that fails is one warning line; the run
    goes on. A file `lookup` found unusable is left as it is (its line
    said so).

    Args:
      read_back: bool, whether a later run reads the plan back from this
        store (it says, where the write fails, that one plans again); else
        the file is the record of a run's plans.
      step_seconds: float seconds a step of the plan took where it was
        timed, kept with it (`estimate` shows it when the plan is read
        back), or None.
    """
    if self._unusable:
      return
    plans = dict(self._read(quiet=True) or {})
    low = int(peak_device_bytes)
    high = (
      None if faster_plans_need_bytes is None else int(faster_plans_need_bytes)
    )
    entry = {
      'plan': plan_to_json(plan),
      REORDERINGS: dimensions.reorderings(plan),
      'peak_device_bytes': low,
      'faster_plans_need_bytes': high,
      'environment': dict(where),
      'config': None if config is None else dict(config),
      'step_seconds': step_seconds,
    }
    entry['sha256'] = _digest(entry)
    for name in [name for name in plans if _key_of(name) == key]:
      # This key's plans whose budgets overlap the new one's (planned by
      # another search), or damaged: the new plan answers for them.
      try:
        other = _stored(plans[name])
      except (AttributeError, KeyError, TypeError, ValueError):
        del plans[name]
        continue
      if (high is None or other.peak_device_bytes < high) and (
        other.faster_plans_need_bytes is None
        or low < other.faster_plans_need_bytes
      ):
        del plans[name]
    plans[_name(key, low)] = entry
    text = json.dumps(
      {'format': FORMAT, 'plans': plans}, sort_keys=True, indent=1
    ).encode()
    try:
      self._write(text)
    except OSError as e:
      message = (
        f'could not keep the plan in {self.path} ({self._reason(e)})'
        + ('; a later run of this config plans again' if read_back else '')
      )
      logging.info('%s', message)
      notices.notify(message, StoredPlanIgnoredWarning)

  def _write(self, text: bytes) -> None:
    """Writes the file whole: to a temporary file beside it, renamed over
    it, so that a run reading it meanwhile (another process of a `launch`,
    another user's command) reads the old plans or the new, never half.

    Raises:
      OSError: it cannot be written (nothing is left behind).
    """
    directory = os.path.dirname(self.path)
    os.makedirs(directory, exist_ok=True)
    if os.path.isdir(self.path):
      raise IsADirectoryError(self.path)
    # Created as any new file is (the umask decides its mode), under a name
    # no other process picks.
    tmp = os.path.join(
      directory, f'.{FILENAME}.{os.getpid()}.{secrets.token_hex(4)}.tmp'
    )
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
      with os.fdopen(fd, 'wb') as f:
        f.write(text)
      os.replace(tmp, self.path)
    except BaseException:
      with contextlib.suppress(OSError):
        os.unlink(tmp)
      raise
