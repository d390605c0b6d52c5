"""A plan dimension is declared once: its `StepPlan` field's entry.

A toy dimension is added the way docs/architecture.md's "Adding a plan
dimension" says (a `StepPlan` field with its entry, a trainer setting), and
the planning modules are seen to read it without naming it: the setting's
range, its unplanned value, the shapes check, the plan's settings,
plans.json, the least plan's line, the candidates and the search's
families. Then it is removed, and the registry is the package's own again.
The package's own dimensions are named by their field wherever planning
acts on one of them, so that grepping a name finds its search logic.
"""

import dataclasses
import pathlib
import re
import types

import pytest

from trax_revplus import validation
from trax_revplus.trainer import AUTO
from trax_revplus.trainer import TrainerOptions
from trax_revplus.trainer._plan import dimensions
from trax_revplus.trainer._plan import options as options_lib
from trax_revplus.trainer._plan import plan as plan_lib
from trax_revplus.trainer._search import budget
from trax_revplus.trainer._search import candidates as candidates_lib
from trax_revplus.trainer._search import plan_search
from trax_revplus.trainer._search import plan_store
from trax_revplus.trainer._search import shape_facts
from trax_revplus.trainer._search import weighers

pytestmark = pytest.mark.usefixtures('stock_trax')

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / 'trax_revplus'
# The planning modules that act on each of the package's dimensions in
# particular (their values, families, order or bounds): each names it.
SEARCH_MODULES = {
  'batch_slices': ('candidates', 'families', 'plan_search', 'bounds'),
  'sequence_chunks': ('candidates', 'families', 'plan_search', 'group_bounds'),
  'micro_batches': ('candidates', 'families', 'plan_search'),
  'parallel_heads': ('candidates', 'plan_search'),
}
NAMES = ('batch_slices', 'sequence_chunks', 'micro_batches', 'parallel_heads')


class ToyError(validation.ConfigurationError):
  pass


def _check_toy(value, facts, types_):
  if facts.rows(types_) % value:
    raise ToyError(
      f'toy_parts = {value} does not divide {facts.rows(types_)} rows.'
    )


# Step 1: the plan's field, with its entry.
@dataclasses.dataclass(frozen=True)
class ToyPlan(plan_lib.StepPlan):
  toy_parts: int = dimensions.field(
    1, check=_check_toy, reordering=lambda n: f'{n} toy parts'
  )
  __hash__ = plan_lib.StepPlan.__hash__  # a dataclass would replace it


# Step 2: the trainer setting.
@dataclasses.dataclass(frozen=True)
class ToyOptions(TrainerOptions):
  toy_parts: int | str = options_lib.dimension_setting(
    'an int >= 1 that divides the rows', unplanned=1
  )


@pytest.fixture(name='toy')
def _toy(monkeypatch):
  """The toy dimension registered, `StepPlan` with its field; removed
  after the test."""
  monkeypatch.setattr(plan_lib, 'StepPlan', ToyPlan)
  before = list(dimensions.DIMENSIONS)
  with dimensions.registered(ToyPlan):
    yield dimensions.by_name('toy_parts')
  assert dimensions.DIMENSIONS == before


class _Facts(shape_facts.ShapeFacts):
  """Shape facts of a batch of `rows` rows per device, without a tail to
  chunk or a reason against micro-batches."""

  def __init__(self, options, rows):  # pylint: disable=super-init-not-called
    self._options = options
    self._rows = rows

  def rows(self, types):
    return self._rows

  def trace(self, types):
    return None, None

  def parts_refusal(self, types):
    return None

  @property
  def loss_name(self):
    return 'CrossEntropyLoss'


def _plan(**settings):
  return plan_lib.make_plan(
    [2],
    {i: 10 for i in range(4)},
    [2**10],
    segment_max_layers=2,
    segment_max_bytes=10**9,
    backward_segment_max_layers=2,
    **settings,
  )


def test_registry_is_the_plans_settings():
  assert dimensions.names() == NAMES
  fields = {f.name: f.default for f in dataclasses.fields(plan_lib.StepPlan)}
  settings = TrainerOptions.dimension_settings()
  assert tuple(settings) == NAMES
  for dimension in dimensions.DIMENSIONS:
    assert fields[dimension.name] == dimension.none
    assert (
      TrainerOptions().unplanned(dimension.name)
      == settings[dimension.name].unplanned
    )
  assert TrainerOptions(batch_slices=4).unplanned('batch_slices') == 4


def test_toy_setting_is_checked_and_resolved(toy):
  with pytest.raises(
    validation.TrainerOptionError,
    match='toy_parts must be an int >= 1 that divides the '
    "rows or 'auto', got 0",
  ):
    ToyOptions(toy_parts=0)
  assert ToyOptions().toy_parts == AUTO
  assert ToyOptions().unplanned(toy.name) == 1
  assert ToyOptions(toy_parts=4).unplanned(toy.name) == 4


def test_toy_setting_is_checked_against_shapes(toy):
  del toy
  _Facts(ToyOptions(toy_parts=4), rows=8).check(None)
  with pytest.raises(ToyError, match='toy_parts = 3 does not divide 8 rows'):
    _Facts(ToyOptions(toy_parts=3), rows=8).check(None)


def test_toy_dimension_is_in_the_plan_and_the_store(toy):
  del toy
  plan = _plan(toy_parts=4, micro_batches=2)
  assert isinstance(plan, ToyPlan) and plan.toy_parts == 4
  assert plan.settings()['toy_parts'] == 4
  assert 'toy_parts=4' in plan.describe()
  data = plan_store.plan_to_json(plan)
  assert data['toy_parts'] == 4
  assert plan_store.plan_from_json(data) == plan
  configured = plan_lib.configured_plan(
    [2], {i: 10 for i in range(4)}, [2**10], ToyOptions(toy_parts=2)
  )
  assert configured.toy_parts == 2
  assert dimensions.reorderings(plan) == ['2 micro-batches', '4 toy parts']
  assert dimensions.reorderings(_plan()) == []


def test_candidates_run_the_toy_setting(toy):
  """A dimension the candidates do not name runs its setting's
  value under a budget, and a kept plan with another value is not one
  this trainer may run."""
  del toy

  def candidates(options):
    return candidates_lib.Candidates(
      [2], {i: 10 for i in range(4)}, [2**10], rows=4, options=options
    )

  pinned = candidates(ToyOptions(toy_parts=2))
  plans = [p for g in pinned.groups() for p in g.plans]
  assert plans and {p.toy_parts for p in plans} == {2}
  assert pinned.may_run(plans[0])
  unplanned = candidates(ToyOptions())
  assert {p.toy_parts for g in unplanned.groups() for p in g.plans} == {1}
  assert not unplanned.may_run(plans[0])


def test_least_plan_line_names_the_toy_dimension(toy):
  del toy
  # pylint: disable=protected-access
  text = budget._plan_text(_plan(toy_parts=4))
  assert text.startswith('batch_slices=1, toy_parts=4 and ')
  assert 'toy_parts' not in budget._plan_text(_plan())


def test_search_keeps_toy_values_apart(toy):
  """Groups that differ in the toy dimension alone are separate families
  (`families.family`): the least plan weighs each family's leanest, so
  it finds the leaner toy value, though in one family it would weigh the
  last member alone."""
  del toy

  def group(toy_parts):
    plan = _plan(
      toy_parts=toy_parts,
      batch_slices=2,
      n_async_layers=0,
      prefetch=False,
      saved_on_host=True,
    )
    return candidates_lib.Group((plan,), plan, 0)

  groups = [group(4), group(1)]
  candidates = types.SimpleNamespace(
    groups=lambda: iter(groups), configured_heads=None
  )
  weighed = {}

  def weigh(plan):
    return weighed.setdefault(
      plan,
      types.SimpleNamespace(peak_device_bytes=1000 // plan.toy_parts, calls=()),
    )

  search = plan_search.PlanSearch(
    candidates, weighers.FixedWeigher(weigh, weighed.get)
  )
  assert search.least()[0].toy_parts == 4
  assert search.fastest_fitting(500).toy_parts == 4


def _modules_naming(name):
  word = re.compile(rf'\b{name}\b')
  return sorted(
    str(p.relative_to(PACKAGE))
    for p in PACKAGE.rglob('*.py')
    if word.search(p.read_text())
  )


@pytest.mark.parametrize('name', NAMES)
def test_grepping_a_dimension_finds_its_search(name):
  modules = _modules_naming(name)
  assert 'trainer/_plan/plan.py' in modules
  for module in SEARCH_MODULES[name]:
    assert f'trainer/_search/{module}.py' in modules, (name, module)


def test_dimensions_have_no_other_names():
  """A dimension has one name, its field's: no role names it."""
  assert 'role' not in {
    f.name for f in dataclasses.fields(dimensions.PlanDimension)
  }
  assert not _modules_naming('of_role') and not _modules_naming('by_role')


def test_store_reads_none_for_a_dimension_alone():
  """None is read back for a dimension whose unused value is None; any
  other setting field must hold its value (else the entry is damaged)."""
  data = plan_store.plan_to_json(_plan())
  assert data['parallel_heads'] is None
  assert plan_store.plan_from_json(data) == _plan()
  with pytest.raises(TypeError):
    plan_store.plan_from_json({**data, 'fused_from': None})
