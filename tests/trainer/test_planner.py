"""Planning under a device memory budget: the fastest plan that fits, the
least budget when none does, and the device's own size as the default.

References: every candidate plan accounted one by one (the planner skips
groups whose leanest plan does not fit; the exhaustive order must agree),
stock trax's accounted peak on the same model (`device_memory`), and trax's
default `Trainer` for the values trained under a budget.
"""

import functools

import jax
import numpy as np
import pytest
from trax import fastmath
from trax import layers as tl
from trax import optimizers

import trainer_cases as cases
from trax_revplus import device_memory
from trax_revplus import memory
from trax_revplus import notices
from trax_revplus import placement as placement_lib
from trax_revplus import validation
from trax_revplus.trainer._search import budget
from trax_revplus.trainer._search import families
from trax_revplus.trainer._search import planner
from trax_revplus.trainer._step import units as units_lib

pytestmark = pytest.mark.usefixtures('stock_trax')


_BATCH = cases.lm_batch()


def _trainer(**kwargs):
  """Ours on a dropout-free model, so that plans of every slicing train as
  trax's default Trainer."""
  return cases.lm_trainer(_BATCH, **kwargs)


@functools.lru_cache(maxsize=1)
def _every_candidate():
  """[(plan, peak bytes)] of every candidate in one pass, and of each group
  in micro-batches its fastest and leanest plans, in the speed model's
  order, each accounted by itself."""
  _, trainer = _trainer(device_memory_budget_bytes=None)
  p = trainer.planner
  types = p.step_types(_BATCH)
  candidates = p.candidates(types)
  out = []
  for group in candidates.groups():
    plans = group.plans
    if group.leanest.micro_batches > 1:
      plans = (plans[0], group.leanest)
    for plan in plans:
      units = units_lib.Units(plan, p._factory)  # pylint: disable=protected-access
      step = p.account(plan, units, types)
      out.append((plan, step.peak_device_bytes))
  return out


def test_candidates_cover_every_dimension():
  plans = [plan for plan, _ in _every_candidate()]
  assert {p.batch_slices for p in plans} == {1, 2, 4}
  assert {p.fused_from for p in plans} == {0, plans[0].loss}
  assert {p.n_async_layers for p in plans} == {8, 4, 2, 1, 0}
  assert {p.prefetch for p in plans} == {True, False}
  assert {p.saved_on_host for p in plans} == {True, False}
  assert {p.sequence_chunks for p in plans} == {1, 2}  # length 6
  assert {p.micro_batches for p in plans} == {1, 2, 4}  # 4 rows
  assert {p.settings()['segment_max_layers'] for p in plans} == {1, 2, 4}
  # Fused first. The model draws nothing (dropout-free), so on the CPU 2
  # slices rank before 1 (`speed_rank.SPEED_SLICES`), then the rest fewest
  # first, within each kind of plan.
  assert plans[0].fused_from == 0 and plans[0].batch_slices == 2
  fused = [p.batch_slices for p in plans if p.fused_from == 0]
  assert fused == [2, 1, 4]
  assert plans[-1].fused_from == plans[-1].loss
  # Within a slicing, saved entries on the host after every device plan
  # (fused programs keep none).
  for k in (1, 2, 4):
    kept = [
      p.saved_on_host
      for p in plans
      if p.batch_slices == k
      and p.fused_from == p.loss
      and p.sequence_chunks == 1
      and p.micro_batches == 1
    ]
    assert kept == sorted(kept) and kept[-1], k
  # Sequence chunks after every plan without, micro-batches after both.
  chunked = [p.sequence_chunks > 1 for p in plans if p.micro_batches == 1]
  assert chunked == sorted(chunked)
  parts = [p.micro_batches for p in plans]
  assert parts == sorted(parts)
  assert not any(p.saved_on_host for p in plans if p.fused_from == 0)


def test_the_planners_bounds_hold():
  """What the planner skips on: an unfused plan needs at least the leanest
  unfused plan of its slicing, and the least of all is the least of the
  groups' leanest plans, fused and unfused (`least_plan`)."""
  peaks = _every_candidate()
  _, trainer = _trainer(device_memory_budget_bytes=None)
  p = trainer.planner
  candidates = p.candidates(p.step_types(_BATCH))
  peak_of = dict(peaks)
  least = min(peak for _, peak in peaks)
  assert min(peak_of[group.leanest] for group in candidates.groups()) == least
  for plan, peak in peaks:
    if plan.fused_from == plan.loss:
      assert (
        peak
        >= peak_of[
          candidates.leanest(
            plan.batch_slices, plan.sequence_chunks, plan.micro_batches
          )
        ]
      ), plan
  least_plan, least_step = trainer.least_device_memory_of(_BATCH)
  assert least_step.peak_device_bytes == least == peak_of[least_plan]


def test_a_family_member_needs_at_least_its_share_of_one_with_fewer():
  """What `plan_search`'s rows bound rests on: the leanest plan of a group
  with m times the slices or parts of another of its family needs at
  least 1/m of that one's peak."""
  peaks = dict(_every_candidate())
  _, trainer = _trainer(device_memory_budget_bytes=None)
  p = trainer.planner
  members_of = {}
  for group in p.candidates(p.step_types(_BATCH)).groups():
    key, value = families.family(group)
    members_of.setdefault(key, []).append((value, peaks[group.leanest]))
  assert any(len(members) > 1 for members in members_of.values())
  for key, members in members_of.items():
    for v0, peak0 in members:
      for v, peak in members:
        if v > v0:
          assert peak >= peak0 * v0 // v, (key, v0, v)


def test_budget_chooses_the_fastest_plan_that_fits():
  peaks = _every_candidate()
  least = min(p for _, p in peaks)
  unfused = [p for plan, p in peaks if plan.fused_from == plan.loss]
  budgets = sorted({least, max(unfused), max(p for _, p in peaks)})
  ref_weights, ref_slots, _ = cases.lm_reference_3_steps()
  for budget_bytes in budgets:
    expected = next(plan for plan, p in peaks if p <= budget_bytes)
    model, trainer = _trainer(device_memory_budget_bytes=budget_bytes)
    cases.train(trainer, _BATCH, 3)
    planned = trainer.planned(_BATCH)
    assert planned.memory.peak_device_bytes <= budget_bytes
    if expected.micro_batches == 1:
      assert planned.plan == expected, budget_bytes
      # No plan keeping its saved inputs and states on the device fits the
      # least: waiting on the host is what fits it.
      assert planned.plan.saved_on_host == (budget_bytes == least)
    else:
      # Of a group in micro-batches only the fastest and the leanest plan
      # were accounted above: the chosen one is at most the leanest.
      group = next(
        g
        for g in trainer.planner.candidates(
          trainer.planner.step_types(_BATCH)
        ).groups()
        if expected in g.plans
      )
      assert planned.plan in group.plans[: group.plans.index(expected) + 1]
    cases.assert_all_close(ref_weights, model.weights)
    cases.assert_all_close(ref_slots, trainer.slots)


def test_nothing_fits_names_the_least_budget_and_changes_nothing():
  model, trainer = _trainer(device_memory_budget_bytes=1000)
  before = jax.tree_util.tree_map(np.array, model.weights)
  with pytest.raises(planner.DeviceMemoryBudgetError) as e:
    trainer.one_step(_BATCH, cases.RNGS[0])
  message = str(e.value)
  assert '\n' not in message
  assert 'device_memory_budget_bytes=1000 ' in message
  need = int(message.split('device_memory_budget_bytes >= ')[1].split(',')[0])
  assert need == min(p for _, p in _every_candidate())
  cases.assert_all_close(before, model.weights, tol=0)
  weighing = trainer.planner.weighing(_BATCH)
  assert weighing.chosen is None
  assert [w.fits for w in weighing.weighed] == [False] * len(weighing.weighed)
  assert need == min(w.memory.peak_device_bytes for w in weighing.weighed)
  _, trainer = _trainer(device_memory_budget_bytes=need)
  trainer.one_step(_BATCH, cases.RNGS[0])
  assert trainer.planned(_BATCH).memory.peak_device_bytes == need
  least_plan, least = trainer.least_device_memory_of(_BATCH)
  assert least.peak_device_bytes == need
  kind = (
    'every layer in the loss program'
    if least_plan.fused_from == 0
    else 'one layer per call, saved inputs and states and accumulated '
    'gradients on the host'
  )
  chunks = (
    f', sequence_chunks={least_plan.sequence_chunks}'
    if least_plan.sequence_chunks > 1
    else ''
  ) + (
    f', micro_batches={least_plan.micro_batches}'
    if least_plan.micro_batches > 1
    else ''
  )
  assert least_plan.micro_batches == 4  # one row per part
  assert least_plan.grads_on_host
  assert (
    f'batch_slices={least_plan.batch_slices}{chunks} and {kind};' in message
  )


def _calls_made(plan, layers):
  """Compiled calls a step of `plan` makes, from the model's layers: one
  per forward unit and per backward segment outside the loss program, and
  the loss program's, per micro-batch; a unit or backward segment made of
  trax's `ReversibleSwap` alone only reorders the stack and makes none."""
  swaps = {
    i for i, layer in enumerate(layers) if layer.name == 'ReversibleSwap'
  }
  n = 1
  for unit in plan.unit_spans():
    if unit[0] >= plan.fused_from:
      continue
    n += not set(unit) <= swaps
    n += sum(not set(b) <= swaps for b in plan.backward.get(unit, [unit]))
  return n * plan.micro_batches


def test_the_plans_weighed_are_accounted_once_the_chosen_marked(monkeypatch):
  """One search: the plan to run, the least plan and every plan weighed on
  the way take one accounting each, all listed; each listed peak is the
  plan's own accounting (by a trainer without a budget), and a plan fits
  where its peak is within the budget."""
  _, reference = _trainer(device_memory_budget_bytes=None)
  ref = reference.planner
  types = ref.step_types(_BATCH)

  def peak_bytes(plan):
    units = units_lib.Units(plan, ref._factory)  # pylint: disable=protected-access
    return ref.account(plan, units, types).peak_device_bytes

  # Below the fastest plan: the search goes on past it.
  fastest = next(ref.candidates(types).groups()).plans[0]
  budget_bytes = peak_bytes(fastest) - 1
  _, trainer = _trainer(device_memory_budget_bytes=budget_bytes)
  p = trainer.planner
  accounted = cases.count_accounted(monkeypatch)

  chosen = trainer.planned(_BATCH).plan
  least_plan, least = trainer.least_device_memory_of(_BATCH)
  weighing = p.weighing(_BATCH)
  plans = [w.plan for w in weighing.weighed]
  assert plans == accounted
  assert fastest in plans and len(plans) >= 3
  assert weighing.chosen == chosen
  assert [w.plan for w in weighing.weighed if w.plan == chosen] == [chosen]
  assert least_plan in plans
  for w in weighing.weighed:
    assert w.memory.peak_device_bytes == peak_bytes(w.plan), w.plan
    assert w.fits == (w.memory.peak_device_bytes <= budget_bytes), w.plan
    assert w.calls_per_step == _calls_made(w.plan, trainer.all_layers), w.plan
    assert w.step_seconds is None
  assert least.peak_device_bytes == min(
    w.memory.peak_device_bytes for w in weighing.weighed
  )
  [chosen_json] = [x for x in weighing.to_json() if x['chosen']]
  assert chosen_json['settings'] == chosen.settings()
  assert chosen_json['fits'] is True
  assert [line[0] for line in weighing.lines()[1:]].count('*') == 1


def test_a_budget_of_stocks_own_peak_finds_a_plan():
  from trax.optimizers import trainer as stock_lib  # pylint: disable=g-import-not-at-top
  from conftest import reversible_lm_blocks  # pylint: disable=g-import-not-at-top

  batch = _BATCH
  first, revs, loss = reversible_lm_blocks()
  model = tl.Serial([first] + revs + [loss])
  model.init(batch, rng=fastmath.random.get_prng(12))
  stock = stock_lib.ReversibleSerialTrainer(
    [(first.sublayers, revs)], loss, optimizers.Adam, n_devices=1
  )
  stock_peak = device_memory.stock_trainer_memory(
    stock, device_memory.abstract(batch), 'cpu'
  ).peak_device_bytes
  _, ours = _trainer(device_memory_budget_bytes=stock_peak)
  assert ours.device_memory_of(batch).peak_device_bytes <= stock_peak


class _Device:
  """A stand-in device whose memory statistics the test sets."""

  def __init__(self, stats):
    self._stats = stats
    self.platform = 'gpu'

  def memory_stats(self):
    if isinstance(self._stats, Exception):
      raise self._stats
    return self._stats


@pytest.mark.parametrize(
  'stats,limit',
  [
    ({'bytes_limit': 8 * 2**30, 'bytes_in_use': 5}, 8 * 2**30),
    ({'bytes_in_use': 5}, None),
    (None, None),
    (NotImplementedError('no stats'), None),
  ],
)
def test_the_memory_limit_is_the_devices_bytes_limit(stats, limit):
  placement = placement_lib.Placement(1)
  placement.devices = [_Device(stats)]
  assert placement.memory_limit_bytes() == limit


@pytest.mark.parametrize(
  'setting,limit,expected',
  [
    ('auto', 8 * 2**30, 8 * 2**30 - int(0.1 * 8 * 2**30)),
    # Where the size is not reported (CPU): what the host can give.
    ('auto', None, 4 * 2**30 - int(0.1 * 4 * 2**30)),
    ('device', 2**30, 2**30 - int(0.1 * 2**30)),
    (5 * 2**20, 8 * 2**30, 5 * 2**20),  # the user's value wins
    (None, 8 * 2**30, None),
  ],
)
def test_the_default_budget_is_the_devices_size_less_a_reserve(
  setting, limit, expected, monkeypatch
):
  monkeypatch.setattr(
    placement_lib.Placement, 'memory_limit_bytes', lambda self: limit
  )
  monkeypatch.setattr(memory, 'host_available_bytes', lambda: 4 * 2**30)
  _, trainer = _trainer(device_memory_budget_bytes=setting)
  assert trainer.planner.budget_bytes == expected


def test_a_device_budget_where_the_size_is_unknown_is_one_line():
  with pytest.raises(budget.DeviceMemoryUnknownError) as e:
    _trainer(device_memory_budget_bytes='device')
  # (gin adds a line naming the configurable.)
  assert str(e.value).splitlines()[0] == (
    'trax_revplus.ReversibleSerialTrainer.device_memory_budget_bytes = '
    "'device', but the cpu backend does not report its devices' memory "
    "size (memory_stats()['bytes_limit']); set the budget in bytes (e.g. "
    "17179869184 for 16 GiB), or 'auto' to plan under what the host can "
    'give.'
  )


@pytest.mark.parametrize(
  'name,value',
  [
    ('device_memory_budget_bytes', 0),
    ('device_memory_budget_bytes', 1.5),
    ('device_memory_budget_bytes', 'gpu'),
    ('batch_slices', 0),
    ('batch_slices', -2),
    ('batch_slices', 1.5),
    ('batch_slices', '2'),
  ],
)
def test_bad_budget_settings_are_rejected(name, value):
  with pytest.raises(validation.TrainerOptionError, match=name):
    _trainer(**{name: value})


def _default_trainer_peak():
  """trax's default Trainer's accounted step peak on `_trainer`'s model."""
  from conftest import reversible_lm_blocks  # pylint: disable=g-import-not-at-top

  first, revs, loss = reversible_lm_blocks()
  model = tl.Serial([first] + revs + [loss])
  model.init(_BATCH, rng=fastmath.random.get_prng(12))
  trainer, _ = cases.default_trainer(model, optimizers.Adam)
  return device_memory.default_trainer_memory(
    trainer, device_memory.abstract(_BATCH), 'cpu'
  ).peak_device_bytes


def test_fused_program_trains_as_the_default_trainer_in_its_memory():
  """The fused program (every layer in the loss's one program, reversible
  layers recomputing through their reverse) gives trax's default
  `Trainer`'s weights, sliced or not, and needs no more device memory
  than that Trainer's own step."""
  ref_weights, ref_slots, _ = cases.lm_reference_3_steps()
  peaks = {}
  for k in (1, 2):
    model, trainer = _trainer(device_memory_budget_bytes=None)
    peaks[k] = cases.set_plan(
      trainer, _BATCH, cases.fused_plan(trainer, _BATCH, k)
    ).peak_device_bytes
    cases.train(trainer, _BATCH, 3)
    cases.assert_all_close(ref_weights, model.weights)
    cases.assert_all_close(ref_slots, trainer.slots)
  assert peaks[2] <= peaks[1] <= _default_trainer_peak()


def test_the_removed_store_activations_is_one_line_naming_what_to_do():
  with pytest.raises(validation.TrainerOptionError) as e:
    _trainer(store_activations='always')
  message = str(e.value).splitlines()[0]  # gin adds a line naming the class
  assert message.endswith('Remove the binding.')
  assert message.startswith(
    'trax_revplus.ReversibleSerialTrainer.store_activations was removed: '
    'keeping every activation ran slower than recomputing it'
  )


def test_a_large_budget_compiles_the_fastest_plan_alone(monkeypatch):
  """Where the fastest candidate fits, planning accounts it and nothing
  else: the step's own programs, no extra compilation."""
  fastest = _every_candidate()[0][0]  # accounted before counting starts
  accounted = cases.count_accounted(monkeypatch)
  _, trainer = _trainer(device_memory_budget_bytes=2**40)
  trainer.one_step(_BATCH, cases.RNGS[0])
  assert accounted == [fastest]


@pytest.mark.parametrize(
  'pinned',
  [
    {'batch_slices': 2},
    {'segment_max_layers': 1},
    {
      'segment_max_layers': 2,
      'backward_segment_max_layers': 1,
      'batch_slices': 4,
    },
  ],
)
def test_settings_given_as_ints_pin_their_dimension(pinned):
  """Under a budget the planner keeps what the user pinned and chooses the
  rest: the first candidate of the exhaustive order with those values."""
  peaks = _every_candidate()
  budget_bytes = max(p for _, p in peaks)

  def keeps(plan):
    settings = plan.settings()
    if 'segment_max_layers' in pinned and plan.fused_from < plan.loss:
      return False
    return all(settings[k] == v for k, v in pinned.items())

  expected = next(
    plan for plan, p in peaks if keeps(plan) and p <= budget_bytes
  )
  model, trainer = _trainer(device_memory_budget_bytes=budget_bytes, **pinned)
  cases.train(trainer, _BATCH, 3)
  assert trainer.planned(_BATCH).plan == expected
  ref_weights, ref_slots, _ = cases.lm_reference_3_steps()
  cases.assert_all_close(ref_weights, model.weights)
  cases.assert_all_close(ref_slots, trainer.slots)


def test_auto_plan_settings_without_a_budget_are_the_unplanned_values():
  _, trainer = _trainer(device_memory_budget_bytes=None)
  settings = trainer.planned(_BATCH).plan.settings()
  assert settings['batch_slices'] == 1 and settings['fused_layers'] == 0
  assert settings['segment_max_layers'] == min(
    8, max(trainer.planner._store.block_sizes())
  )  # pylint: disable=protected-access


def test_a_pinned_plan_that_does_not_fit_names_the_setting_to_unpin():
  _, trainer = _trainer(device_memory_budget_bytes=1000, batch_slices=2)
  with pytest.raises(planner.DeviceMemoryBudgetError) as e:
    trainer.one_step(_BATCH, cases.RNGS[0])
  message = str(e.value)
  assert '\n' not in message
  assert "set batch_slices to 'auto'" in message
  assert (
    'with batch_slices=2, sequence_chunks=2, micro_batches=2 and one '
    'layer per call' in message
  )


def _notices_planning(**settings):
  """The notices (`trax_revplus.notices`) planning `_BATCH` sends, and the
  plan chosen."""
  sent = []
  _, trainer = _trainer(**settings)
  with notices.listening(sent.append):
    plan = trainer.planned(_BATCH).plan
  return sent, plan


def test_a_pinned_backward_length_the_fused_program_ignores_is_a_notice():
  budget_bytes = max(p for _, p in _every_candidate())
  sent, plan = _notices_planning(
    device_memory_budget_bytes=budget_bytes, backward_segment_max_layers=1
  )
  assert plan.fused_from < plan.loss
  assert len(sent) == 1 and sent[0].startswith(
    'trax_revplus.ReversibleSerialTrainer.backward_segment_max_layers = 1 '
    'was replaced by '
  ), sent


def test_settings_kept_as_given_send_no_notice():
  """Pinned slices are kept: no notice; n_async_layers left at its default
  (not given) may change without one."""
  least = min(
    peak for plan, peak in _every_candidate() if plan.micro_batches == 1
  )
  expected = next(plan for plan, p in _every_candidate() if p <= least)
  sent, plan = _notices_planning(
    device_memory_budget_bytes=least, batch_slices=expected.batch_slices
  )
  assert sent == [] and plan == expected


def test_without_a_listener_a_notice_is_a_python_warning():
  budget_bytes = max(p for _, p in _every_candidate())
  _, trainer = _trainer(
    device_memory_budget_bytes=budget_bytes, backward_segment_max_layers=1
  )
  with pytest.warns(
    notices.SettingReplacedWarning,
    match='backward_segment_max_layers = 1 was replaced',
  ):
    trainer.planned(_BATCH)
