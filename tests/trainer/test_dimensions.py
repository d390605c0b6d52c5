"""A plan dimension is declared once (`trainer._plan.dimensions`).

A toy dimension is added the way docs/architecture.md's "Adding a plan
dimension" says (a `StepPlan` field, a trainer setting, one `PlanDimension`
entry), and the planning modules are seen to read it without naming it:
the setting's range, its unplanned value, the shapes check, the plan's
settings, plans.json, the least plan's line and the search's families.
Then it is removed, and the registry is the package's own again.
"""

import dataclasses
import pathlib
import re
import types

import pytest

from trax_revplus import validation
from trax_revplus.trainer import AUTO
from trax_revplus.trainer import TrainerOptions
from trax_revplus.trainer._plan import budget
from trax_revplus.trainer._plan import candidates as candidates_lib
from trax_revplus.trainer._plan import dimensions
from trax_revplus.trainer._plan import plan as plan_lib
from trax_revplus.trainer._plan import plan_search
from trax_revplus.trainer._plan import plan_store
from trax_revplus.trainer._plan import shape_facts

pytestmark = pytest.mark.usefixtures('stock_trax')

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / 'trax_revplus'
# Modules of the package that name each dimension (as a word, docstrings and
# comments included): the registry (`dimensions`), the plan's field (`plan`),
# the gin setting (`options`), the enumeration of its values (`candidates`),
# the walk's units that hand it to the compiled functions (`units`, which
# hands the runs of a step their number of micro-batches too), the code that
# reads the plan's value where it runs it (for attention heads:
# `attention_heads`), and `compare.exactness`, which reads plans.json without
# importing the trainer. The modules that run a dimension are named for what
# they run (`batch_parts`, `loss_tail`), not for the dimension. A change that
# names one in another module must raise its figure here, on purpose.
MOST_MODULES = {
    'batch_slices': 6,
    'sequence_chunks': 6,
    'micro_batches': 6,
    'parallel_heads': 7,
}


@dataclasses.dataclass(frozen=True)
class ToyPlan(plan_lib.StepPlan):
  toy_parts: int = 1
  __hash__ = plan_lib.StepPlan.__hash__  # a dataclass would replace it


@dataclasses.dataclass(frozen=True)
class ToyOptions(TrainerOptions):
  toy_parts: int | str = AUTO


class ToyError(validation.ConfigurationError):
  pass


def _check_toy(value, facts, types_):
  if facts.rows(types_) % value:
    raise ToyError(f'toy_parts = {value} does not divide '
                   f'{facts.rows(types_)} rows.')


TOY = dimensions.PlanDimension(
    'toy_parts', 'an int >= 1 that divides the rows', unplanned=1, none=1,
    role='toy', check=_check_toy)


@pytest.fixture(name='toy')
def _toy(monkeypatch):
  """The toy dimension registered, `StepPlan` with its field; removed
  after the test."""
  monkeypatch.setattr(plan_lib, 'StepPlan', ToyPlan)
  before = list(dimensions.DIMENSIONS)
  with dimensions.registered(TOY):
    yield TOY
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
  return plan_lib.make_plan([2], {i: 10 for i in range(4)}, [2**10],
                            segment_max_layers=2, segment_max_bytes=10**9,
                            backward_segment_max_layers=2, **settings)


def test_registry_is_the_plans_settings():
  assert dimensions.names() == (
      'batch_slices', 'sequence_chunks', 'micro_batches', 'parallel_heads')
  fields = {f.name: f.default for f in dataclasses.fields(plan_lib.StepPlan)}
  settings = TrainerOptions.field_names()
  for dimension in dimensions.DIMENSIONS:
    assert fields[dimension.name] == dimension.none
    assert dimension.name in settings
    assert (TrainerOptions().unplanned(dimension.name) ==
            dimension.unplanned)


def test_toy_setting_is_checked_and_resolved(toy):
  with pytest.raises(validation.TrainerOptionError,
                     match="toy_parts must be an int >= 1 that divides the "
                           "rows or 'auto', got 0"):
    ToyOptions(toy_parts=0)
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
      [2], {i: 10 for i in range(4)}, [2**10], ToyOptions(toy_parts=2))
  assert configured.toy_parts == 2


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
    plan = _plan(toy_parts=toy_parts, batch_slices=2, n_async_layers=0,
                 prefetch=False, saved_on_host=True)
    return candidates_lib.Group((plan,), plan, 0)

  groups = [group(4), group(1)]
  candidates = types.SimpleNamespace(
      groups=lambda: iter(groups), lower_bound_bytes=lambda g, n: 0)
  weighed = {}

  def weigh(plan):
    return weighed.setdefault(plan, types.SimpleNamespace(
        peak_device_bytes=1000 // plan.toy_parts, calls=()))

  search = plan_search.PlanSearch(candidates, 1, weigh, weighed.get)
  assert search.least()[0].toy_parts == 4
  assert search.fastest_fitting(500).toy_parts == 4


def _modules_naming(name):
  word = re.compile(rf'\b{name}\b')
  return sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob('*.py')
                if word.search(p.read_text()))


@pytest.mark.parametrize('name', sorted(MOST_MODULES))
def test_few_modules_name_a_dimension(name):
  modules = _modules_naming(name)
  assert 'trainer/_plan/dimensions.py' in modules
  assert len(modules) <= MOST_MODULES[name], modules


def test_store_reads_none_for_a_dimension_alone():
  """None is read back for a dimension whose unused value is None; any
  other setting field must hold its value (else the entry is damaged)."""
  data = plan_store.plan_to_json(_plan())
  assert data['parallel_heads'] is None
  assert plan_store.plan_from_json(data) == _plan()
  with pytest.raises(TypeError):
    plan_store.plan_from_json({**data, 'fused_from': None})
