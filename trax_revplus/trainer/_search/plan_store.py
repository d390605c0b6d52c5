"""Chosen plans, kept so that a config plans once per device.

Planning under a budget that the fastest plan does not fit compiles
candidate plans before the first step; a resumed run, or a second run of
the same config, would pay that again. `PlanStore` keeps each chosen plan
in a `plans.json`: the run's output directory's (a resume), and the
compilation cache's (`train` and `estimate` keep one, so that every run of
the same config on the same device reads it back). An entry is keyed by
the config (`plan_key`: the batch's shapes, the trainer's settings, the
model's layers and their weights' shapes) and records where it was planned
(`environment`: the versions of JAX, jaxlib, trax and trax_revplus, the
backend, the device's kind and the number of devices), with the range of
budgets it is the answer for: from its own peak device bytes up to (not
including) the least bytes that excluded a faster plan. A plan is read
back only for the same key, the same environment and a budget in that
range; the planner then accounts it as it would any plan (its compilation
is the step's own) and runs it only where it still fits.

A stored plan from another environment (another JAX, trax or device), and
an output directory's plans of another config only, are ignored with one
warning line (`notices`), as is a damaged, unreadable or foreign file; the
run plans afresh and writes a new entry: a stored plan saves time, never
decides a result (it is the plan the same key and budget would choose).
"""

import dataclasses
import hashlib
from importlib import metadata
import json
import os
from typing import Any, Mapping, Sequence

from absl import logging
import jax
from trax import layers as tl

from trax_revplus import notices
from trax_revplus import output_files
from trax_revplus.trainer._plan import dimensions
from trax_revplus.trainer._plan import plan as plan_lib

FILENAME = 'plans.json'
# 10: each entry says, in words, what in its plan can change stock trax's
# float32 summation order (`REORDERINGS`). 11: keyed by the config alone,
# each entry with its `environment`.
FORMAT = 'trax_revplus plans 11'
# The key of an entry's list of what in its plan can change stock trax's
# float32 summation order (`dimensions.reorderings`): read by
# `compare.exactness`, which imports neither JAX nor the trainer.
REORDERINGS = 'summation_order_changes'


def _version(distribution: str) -> str:
  try:
    return metadata.version(distribution)
  except metadata.PackageNotFoundError:
    return 'unknown'


class StoredPlanIgnoredWarning(UserWarning):
  """A stored plan (or plans file) was not used: the run plans afresh."""


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


def _differences(stored: Mapping[str, Any], current: Mapping[str, Any]) -> str:
  """'jax 0.10.1 (this run: 0.10.2), device_kind ...' of what differs."""
  return ', '.join(
    f'{name} {stored.get(name)!r} (this run: {value!r})'
    for name, value in current.items()
    if stored.get(name) != value
  )


def plan_key(
  batch_key: Any,
  settings: Mapping[str, Any],
  layers: Sequence[tl.Layer],
) -> str:
  """A hex digest of the config that decides a step's plan (where it runs
  is its entry's `environment`).

  Args:
    batch_key: hashable shapes, dtypes and shardings of the batch
      (`weighers.batch_key`).
    settings: the trainer's settings (`dataclasses.asdict` of its
      `options.TrainerOptions`) that shape a plan.
    layers: the trainer's layers by index (trax `Layer`s, host weights).

  Returns:
    str, 64 hex digits.
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
  described = repr((batch_key, sorted(settings.items()), model))
  return hashlib.sha256(described.encode()).hexdigest()


# `StepPlan`'s fields that hold layer indices (the rest are settings: one
# JSON value each, under the field's name, read back by `_setting`).
_LAYOUT = ('blocks', 'loss', 'backward')


def _setting(field: dataclasses.Field, value: Any) -> Any:
  """A setting field's JSON value as `StepPlan` holds it: a bool, or an
  int (None where it is a dimension whose value that changes nothing is
  None: `dimensions.PlanDimension.none`).

  Raises:
    TypeError, ValueError: `value` is not one.
  """
  if (
    value is None
    and field.name in dimensions.names()
    and (dimensions.by_name(field.name).none is None)
  ):
    return None
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


class PlanStore:
  """The plans kept in one directory (`FILENAME`)."""

  def __init__(self, directory: str, one_config: bool = True):
    """Args:
    directory: str, the run's output directory, or the compilation
      cache's (made where missing when a plan is saved).
    one_config: bool, the directory is one run's: plans there of other
      configs only are a warning line (a config changed under a resumed
      run); the compilation cache's holds every config's.
    """
    self.path = os.path.join(directory, FILENAME)
    self._one_config = one_config
    self._warned = False

  def _warn(self, why: str) -> None:
    if not self._warned:
      message = f'stored plans {self.path} ignored ({why}); planning afresh'
      logging.info('%s', message)
      notices.notify(message, StoredPlanIgnoredWarning)
      self._warned = True

  def _read(self) -> dict:
    """The stored entries by key; {} where there is no usable file."""
    try:
      with open(self.path) as f:
        data = json.load(f)
    except FileNotFoundError:
      return {}
    except (OSError, ValueError) as e:
      self._warn(f'unreadable: {e}')
      return {}
    if (
      not isinstance(data, dict)
      or data.get('format') != FORMAT
      or (not isinstance(data.get('plans'), dict))
    ):
      self._warn('not a plans file of this version')
      return {}
    return data['plans']

  def load(
    self, key: str, budget_bytes: int, where: Mapping[str, Any]
  ) -> plan_lib.StepPlan | None:
    """The plan stored for `key` that answers `budget_bytes` where it runs
    (`where`), or None.

    Args:
      key: str, `plan_key` of the step.
      budget_bytes: int, the budget per device the step plans under.
      where: `environment()` of this run.

    Returns:
      The stored `plan.StepPlan`, where one is stored for `key` in the same
      environment, intact (its digest verifies), and `budget_bytes` lies
      in its range; else None (a damaged entry, one from another
      environment, or in a run's directory plans of other configs only:
      one warning line).
    """
    plans = self._read()
    entry = plans.get(key)
    if entry is None:
      if plans and self._one_config:
        self._warn(
          'its plans are of another config: the model, batch or trainer '
          'settings differ'
        )
      return None
    try:
      if entry.get('sha256') != _digest(entry):
        raise ValueError('its digest does not match its content')
      plan = plan_from_json(entry['plan'])
      low = int(entry['peak_device_bytes'])
      high = entry['faster_plans_need_bytes']
      stored_where = dict(entry['environment'])
    except (AttributeError, KeyError, TypeError, ValueError) as e:
      self._warn(f'damaged entry: {e}')
      return None
    if stored_where != dict(where):
      self._warn(
        f'its plan for this config was planned elsewhere: '
        f'{_differences(stored_where, where)}'
      )
      return None
    if budget_bytes < low or (high is not None and budget_bytes >= high):
      return None
    return plan

  def faster_bytes(self, key: str) -> int | None:
    """The bytes that excluded a faster plan kept with `key`'s entry, or
    None (none stored, or no faster plan)."""
    entry = self._read().get(key)
    try:
      return None if entry is None else entry['faster_plans_need_bytes']
    except (KeyError, TypeError):
      return None

  def save(
    self,
    key: str,
    plan: plan_lib.StepPlan,
    peak_device_bytes: int,
    faster_plans_need_bytes: int | None,
    where: Mapping[str, Any],
  ) -> None:
    """Keeps `plan` as the answer for `key` where it was planned (`where`,
    `environment()`) under budgets from `peak_device_bytes` up to
    `faster_plans_need_bytes` (None: any budget above). A write that fails
    is one warning line; the run goes on."""
    plans = dict(self._read())
    entry = {
      'plan': plan_to_json(plan),
      REORDERINGS: dimensions.reorderings(plan),
      'peak_device_bytes': int(peak_device_bytes),
      'faster_plans_need_bytes': (
        None
        if faster_plans_need_bytes is None
        else int(faster_plans_need_bytes)
      ),
      'environment': dict(where),
    }
    entry['sha256'] = _digest(entry)
    plans[key] = entry
    text = json.dumps(
      {'format': FORMAT, 'plans': plans}, sort_keys=True, indent=1
    ).encode()
    try:
      os.makedirs(os.path.dirname(self.path), exist_ok=True)
      output_files.write(self.path, lambda f: f.write(text))
    except (OSError, output_files.OutputFileError) as e:
      message = (
        f'could not keep the plan in {self.path} ({e}); the next run '
        f'plans again'
      )
      logging.info('%s', message)
      notices.notify(message, StoredPlanIgnoredWarning)
