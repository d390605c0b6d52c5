"""Planning a step: its plan, compiled units and device memory, per shapes.

Before the first step on a batch's shapes, `Planner.step_for` fixes how the
step runs (`plan.StepPlan`), compiles its units (`units.Units`), compiles
them ahead and accounts the step's device memory (`on_types.AheadOfTime`).
A step never changes what it was given; where the fused program compiles
while the first steps run a plan ready sooner (`step_for`'s
`ready_first`), the steps after it compiled run the plan chosen then.

Without a device budget the plan is the one the trainer's settings name;
where its accounted host bytes exceed the host budget, or the backend does
not compile one of its programs, that is one line before any step. With
one (`device_memory_budget_bytes`, by default the device's own size where
the backend reports it, `budget`) the planner runs the fastest plan whose
composed XLA peak fits, and whose host bytes fit the host budget
(`host_memory_budget_bytes`): `candidates.Candidates` lists plans in the
speed model's order, and one search per batch's shapes
(`plan_search.PlanSearch`) weighs them and gives the least plan too
(`least_plan`). Where `time_plans` asks for it (by default on an
accelerator), the first few plans that fit are timed on the device on the
first batch given (`plan_timing`) and the fastest measured runs. A plan
whose program the backend refuses for memory does not fit; any other
failure to compile is one line naming the program.
Every plan accounted is kept with its figures (`weighed_plans.Weighing`: what
`estimate` shows); the accounting is `weighers.StepWeigher`'s, which
`Planner` extends; chosen plans are kept (`plan_store`).
"""

import dataclasses
import os
from typing import Callable, Hashable, Iterable, Iterator, NamedTuple

from absl import logging

from trax_revplus import compilation_cache
from trax_revplus import device_memory
from trax_revplus import interrupt
from trax_revplus import notices
from trax_revplus import placement as placement_lib
from trax_revplus.byte_sizes import format_apart
from trax_revplus.trainer._accounting import on_types
from trax_revplus.trainer._plan import options as options_lib
from trax_revplus.trainer._plan import plan as plan_lib
from trax_revplus.trainer._search import budget as budget_lib
from trax_revplus.trainer._search import overrides
from trax_revplus.trainer._search import plan_search as plan_search_lib
from trax_revplus.trainer._search import plan_store as plan_store_lib
from trax_revplus.trainer._search import plan_timing
from trax_revplus.trainer._search import speed_rank
from trax_revplus.trainer._search import weighers
from trax_revplus.trainer._search.weighers import batch_key
from trax_revplus.trainer._step import host_store
from trax_revplus.trainer._step import unit_factory
from trax_revplus.trainer._step import units as units_lib
from trax_revplus.typing import Batch


DeviceMemoryBudgetError = budget_lib.DeviceMemoryBudgetError


class _Compiling(NamedTuple):
  """A batch's shapes' fastest plan while its programs compile.

  Attributes:
    plan: the speed model's first plan (`plan_search.PlanSearch.fastest`).
    programs: the call keys of its programs (`programs.Programs`).
    types: the `on_types.StepTypes` of the shapes.
  """

  plan: plan_lib.StepPlan
  programs: tuple[Hashable, ...]
  types: on_types.StepTypes


class Planner(weighers.StepWeigher):
  """Plans the trainer's steps, once per batch shapes.

  Attributes (besides `weighers.StepWeigher`'s):
    least: (`plan.StepPlan`, `device_memory.StepMemory`) of the leanest
      plan, set when no plan fits the budget; else None.
    timer: the `plan_timing.PlanTimer` that times the plans that fit
      (`options.TrainerOptions.time_plans`).
    plan_store: `plan_store.PlanStore` of the run's output directory,
      where the plans chosen under a budget are kept (`keep_plans_in`),
      or None.
  """

  def __init__(
    self,
    placement: placement_lib.Placement,
    store: host_store.LayerStore,
    factory: unit_factory.UnitFactory,
    options: options_lib.TrainerOptions,
    budget_bytes: int | None,
    explicit: Iterable[str] = (),
    fingerprint_of: Callable[[int], Hashable] | None = None,
    host_budget_bytes: int | None = None,
  ):
    """Args:
    placement: the trainer's `placement.Placement`.
    store: its `host_store.LayerStore`.
    factory: its `unit_factory.UnitFactory`.
    options: its `options.TrainerOptions`.
    budget_bytes: int or None, see `budget.budget_bytes`.
    explicit: names of the settings given explicitly; one the budget's
      plan replaces is a notice (`overrides`).
    fingerprint_of: layer index -> hashable, equal for layers sharing a
      compilation (`compilation.Compiler.fingerprint_of`); None: every
      layer compiles on its own.
    host_budget_bytes: int or None, see `budget.host_budget_bytes`.
    """
    super().__init__(
      placement,
      store,
      factory,
      options,
      budget_bytes,
      fingerprint_of,
      host_budget_bytes,
    )
    self._explicit = frozenset(explicit)
    self._notified: set[str] = set()
    self._planned: dict[Hashable, units_lib.PlannedStep] = {}  # by `batch_key`
    self._searches: dict[Hashable, plan_search_lib.PlanSearch] = {}
    # By `batch_key`: the fused plan whose programs compile while the
    # steps run on a plan ready sooner (`step_for`'s `ready_first`).
    self._compiling: dict[Hashable, _Compiling] = {}
    self.least: tuple[plan_lib.StepPlan, device_memory.StepMemory] | None = None
    self.plan_store: plan_store_lib.PlanStore | None = None
    self.timer = plan_timing.PlanTimer(placement, store)

  def keep_plans_in(self, directory: str | None) -> None:
    """Keeps the plans chosen under a budget in `directory` (the run's
    output directory; None: not kept there): the record of the plans the
    run used, and, where the compilation cache is off, the store a resumed
    run reads back (`plan_stores`)."""
    self.plan_store = (
      None if directory is None else plan_store_lib.PlanStore(directory)
    )

  def step_for(
    self, batch: Batch, ready_first: bool = False
  ) -> units_lib.PlannedStep:
    """The `PlannedStep` of `batch`'s shapes, planned on first sight.

    With `ready_first` (a training step asks), where the speed model's
    first plan is fused and its programs would compile for long
    (`speed_rank.starts_on_ready`; one process), the first steps run on
    its `candidates.Candidates.ready_plan` where that fits the budgets,
    while the fused program compiles on the compile threads; the first
    call after it compiled plans as usual (the programs compiled, the
    search settles at once) and the steps run that plan from then on. A
    call without `ready_first` waits for it. Either plan gives stock
    trax's updates (up to float32 summation order, as every plan).

    Args:
      batch: tuple of host arrays or `jax.ShapeDtypeStruct`s of shape
        (B, ...), this process's rows (their values are not read).
      ready_first: bool, a step may run on a plan ready sooner (above).

    Raises:
      validation.BatchSlicesError, SequenceChunksError, MicroBatchesError,
        TrainerOptionError: a plan dimension set to an int these shapes
        refute (`dimensions.PlanDimension.check`): batch slices that do
        not divide each device's rows; sequence chunks > 1 where the loss
        layer has no tail to chunk, or that do not divide its sequence
        length; micro-batches > 1 that do not divide each device's rows
        (or their slices), or where the step cannot add its parts'
        gradients exactly; attention heads at once that neither divide nor
        are a multiple of an attention layer's heads.
      DeviceMemoryBudgetError: under a budget, no plan fits it (or this
        device: the backend refused even the least plan's program), or the
        step cannot be accounted here.
      budget.HostMemoryBudgetError: no plan that fits the device fits the
        host budget; or without a device budget, the plan the settings
        name exceeds it.
      budget.StepCompileError: a program of a plan weighed did not compile
        for a reason other than memory.
    """
    key = batch_key(self._placement.abstract_batch(batch))
    compiling = self._compiling.get(key)
    if compiling is not None and (
      not ready_first or all(self._programs.done(k) for k in compiling.programs)
    ):
      del self._compiling[key]
      self.log.compiled(compiling.plan, len(compiling.programs))
      with interrupt.stops_at_once():
        self._planned[key] = self._plan(key, compiling.types, batch)
    if key not in self._planned:
      # Planning changes nothing a signal would lose: it may stop at once.
      with interrupt.stops_at_once():
        self._planned[key] = self._plan(
          key, self.step_types(batch), batch, ready_first
        )
    return self._planned[key]

  def check(self, batch: Batch) -> None:
    """Checks the plan's dimensions set as ints against `batch`'s shapes,
    as `step_for` does before planning.

    Raises:
      As `step_for`: validation.BatchSlicesError, SequenceChunksError,
      MicroBatchesError, TrainerOptionError.
    """
    self._facts.check(self.step_types(batch))

  def is_planned(self, batch: Batch) -> bool:
    """Whether a step on `batch`'s shapes is planned already, and not to
    change plans (`step_for`'s `ready_first`)."""
    key = batch_key(self._placement.abstract_batch(batch))
    return key in self._planned and key not in self._compiling

  # How a plan is made.

  def _plan(
    self,
    key: Hashable,
    types: on_types.StepTypes,
    batch: Batch,
    ready_first: bool = False,
  ) -> units_lib.PlannedStep:
    self._facts.check(types)
    self.log.begin()
    try:
      if self.budget_bytes is not None:
        planned = self._plan_under_budget(
          key, types, self.budget_bytes, batch, ready_first
        )
      else:
        planned = self._configured(types)
    finally:
      self.log.end()
    return planned

  def _configured(self, types: on_types.StepTypes) -> units_lib.PlannedStep:
    """The plan the settings name, accounted where it can be."""
    options = self._options
    plan = plan_lib.configured_plan(
      self._store.block_sizes(),
      self._store.params_bytes(),
      self._facts.trace(types)[0].block_bytes,
      options,
    )
    units = units_lib.Units(plan, self._factory)
    memory_ = None
    if options.compile_ahead:
      try:
        memory_ = self._account_or_none(plan, types)
      except device_memory.ProgramOutOfMemoryError as e:
        raise budget_lib.nothing_fits(
          plan, e.least_bytes or 0, None, options, refused=e.program
        ) from None
      except device_memory.ProgramCompileError as e:
        raise budget_lib.not_compiled(e, configured=True) from None
    weighing = self.weighing_of(types)
    if memory_ is not None:
      weighing.add(plan, memory_)
      if (
        self.host_budget_bytes is not None
        and memory_.peak_host_bytes > self.host_budget_bytes
      ):
        raise budget_lib.host_exceeded(
          plan.describe(len(memory_.calls)),
          memory_,
          self.host_budget_bytes,
          options,
        )
    weighing.chosen = plan
    if memory_ is not None:
      weighing.cost = self.log.chosen(
        plan, self.walk(plan, types).calls.keys(), memory_
      )
    return units_lib.PlannedStep(plan, units, memory_)

  def _plan_under_budget(
    self,
    key: Hashable,
    types: on_types.StepTypes,
    budget_bytes: int,
    batch: Batch,
    ready_first: bool = False,
  ) -> units_lib.PlannedStep:
    """The fastest plan that fits: the one stored for this step where the
    store read (`plan_stores`) has one that applies and it still fits
    (not timed again), else the shapes' search's first
    (`plan_search.PlanSearch.fitting`), or where plans are timed
    (`_fastest_timed`, on `batch`) the fastest measured, then kept. Where
    nothing fits, `least` is the search's least. With `ready_first`, the
    plan ready sooner while that search waits (`_ready_first`), where
    there is one.

    Raises:
      DeviceMemoryBudgetError: no plan fits, or (with a budget set by the
        user) the step cannot be accounted here.
    """
    read, kept_in = self.plan_stores()
    store_key = config = where = None
    if kept_in:
      config = plan_store_lib.describe_config(
        key,
        dataclasses.asdict(self._options),
        self._store.layers,
        types.host_batch,
      )
      where = plan_store_lib.environment(
        self._placement.platform,
        self._placement.devices[0].device_kind,
        self._placement.n_devices,
      )
      store_key = plan_store_lib.plan_key(config, where)
    if read is not None:
      assert store_key is not None and config is not None and where is not None
      stored = read.lookup(store_key, config, where, budget_bytes)
      if stored is not None:
        planned = self._stored(stored, read.path, types, budget_bytes)
        if planned is not None:
          for store in kept_in:
            if store is not read:  # the run's record of its plans
              store.save(
                store_key,
                planned.plan,
                stored.peak_device_bytes,
                stored.faster_plans_need_bytes,
                where,
                config,
                read_back=False,
                step_seconds=stored.step_seconds,
              )
          return planned
    search = self._search(key, types)
    if ready_first:
      ready = self._ready_first(key, search, types, budget_bytes)
      if ready is not None:
        return ready
    try:
      fitting = search.fitting(budget_bytes, self.host_budget_bytes)
      plan = next(fitting, None)
      if plan is None:
        self.least = search.least()
      else:
        plan = self._fastest_timed(plan, search, types, batch)
    except plan_search_lib.LeastRefused as e:
      raise budget_lib.nothing_fits(
        e.plan,
        e.least_bytes or 0,
        budget_bytes,
        self._options,
        refused=e.program,
      ) from None
    except device_memory.ProgramCompileError as e:
      raise budget_lib.not_compiled(e, configured=False) from None
    except (
      device_memory.UnsupportedTrainerError,
      device_memory.AccountingError,
    ) as e:
      if self._options.device_memory_budget_bytes != options_lib.AUTO:
        raise DeviceMemoryBudgetError(
          f'device_memory_budget_bytes cannot be honoured here: {e} Set '
          f'{options_lib.GIN_CONFIGURABLE}.device_memory_budget_bytes = '
          f'None and choose the segments and slices yourself.'
        ) from None
      # The default budget plans where it can: a step that cannot be
      # accounted here runs the settings as given, as without a budget.
      logging.warning(
        'device memory: the step cannot be accounted here, so '
        'it runs the settings as given, unplanned: %s',
        e,
      )
      return self._configured(types)
    if plan is None:  # `search.least` keeps its answer: this weighs nothing
      raise budget_lib.nothing_fits_error(
        search.least(), self.weighing_of(types), self._options
      )
    planned = self._chosen(plan, types, budget_bytes)
    assert planned.memory is not None  # `_chosen` weighs its plan
    for store in kept_in:
      assert store_key is not None and where is not None
      store.save(
        store_key,
        planned.plan,
        planned.memory.peak_device_bytes,
        search.faster_plans_need_bytes,
        where,
        config,
        read_back=store is read,
        step_seconds=self.weighing_of(types).step_seconds(planned.plan),
      )
    return planned

  def _ready_first(
    self,
    key: Hashable,
    search: plan_search_lib.PlanSearch,
    types: on_types.StepTypes,
    budget_bytes: int,
  ) -> units_lib.PlannedStep | None:
    """The `PlannedStep` of the plan ready sooner than the speed model's
    first (`step_for`'s `ready_first`), its first plan's programs started
    compiling; None where there is none to step on: in a run of several
    processes (each would change plans at another step), the first plan
    fuses nothing, or compiles too few layers more than the ready plan
    to pay on this backend (`speed_rank.starts_on_ready`), a bound rules
    it out, its programs are compiled already, or the ready plan does not
    fit.

    Raises:
      As `weighers.StepWeigher.settle`.
    """
    if self._placement.processes is not None:
      return None
    candidates = self.candidates(types)
    fastest = search.fastest()
    ready = candidates.ready_plan(fastest)
    if ready is None or not speed_rank.starts_on_ready(
      self._placement.platform,
      candidates.compiled_layers(fastest),
      candidates.compiled_layers(ready),
    ):
      return None
    if self.bounds(types).lower(fastest).device > budget_bytes:
      return None
    programs = tuple(self.walk(fastest, types).calls.keys())
    if all(self._programs.done(k) for k in programs):
      return None
    self._programs.compile(programs, beside_steps=True)
    settled = self.settle(ready, types, budget_bytes)
    if isinstance(settled, int) or not self.weighing_of(types).fits(settled):
      return None
    self._compiling[key] = _Compiling(fastest, programs, types)
    self.log.ready_first(fastest, len(programs))
    return self._chosen(ready, types, budget_bytes)._replace(
      while_compiling=True
    )

  def _fastest_timed(
    self,
    first: plan_lib.StepPlan,
    search: plan_search_lib.PlanSearch,
    types: on_types.StepTypes,
    batch: Batch,
  ) -> plan_lib.StepPlan:
    """The plan to run of those that fit, `first` the search's first: where
    plans are timed (`plan_timing.plans_to_time`), the fastest measured of
    `first` and the next plans of its group that fit and run on programs
    already compiled (`_timed_with`: timing compiles nothing), within a
    time limit (the seconds its programs took to compile, at least
    `plan_timing.MIN_LIMIT_SECONDS`); ties: the first in the speed model's
    order. `first` where none is timed: nothing else to time, or timing
    them would take longer than the limit (`plan_timing.PlanTimer.seconds`
    says so after the first run). A plan whose run fails on the device
    counts as not fitting, and the next is timed; a line for each plan
    timed, and for the one chosen.

    Raises:
      DeviceMemoryBudgetError: every plan timed failed on the device.
    """
    n = plan_timing.plans_to_time(
      self._options.time_plans, self._placement.platform
    )
    if n < 2:
      return first
    others = self._timed_with(first, search, types)
    second = next(others, None)
    if second is None:  # nothing to choose from
      return first
    keys = self.walk(first, types).calls.keys()
    limit = max(
      plan_timing.MIN_LIMIT_SECONDS, self._programs.compile_seconds(keys)
    )
    weighing = self.weighing_of(types)
    timed: list[tuple[float, plan_lib.StepPlan]] = []
    failures = []
    queued = [first, second]
    while len(timed) < n:
      plan = queued.pop(0) if queued else next(others, None)
      if plan is None:
        break
      planned = units_lib.PlannedStep(
        plan, units_lib.Units(plan, self._factory), self.weigh(plan, types)
      )
      try:
        # The first run decides whether n plans can be timed in the limit.
        seconds = self.timer.seconds(
          planned, batch, limit / n if not timed else None
        )
      except plan_timing.PlanRunFailed as e:
        weighing.run_failed(plan, str(e))
        self.log.run_failed(plan, str(e))
        failures.append(str(e))
        continue
      except plan_timing.TooLongToTime as e:
        self.log.not_timed(n, e.run_seconds, limit)
        return first
      weighing.timed(plan, seconds)
      self.log.timed(plan, seconds, self.timer.repetitions)
      timed.append((seconds, plan))
    if not timed:
      raise DeviceMemoryBudgetError(
        f'every plan that fits the device memory budget failed on the '
        f'device when timed ({len(failures)} plans), the first: '
        f'{failures[0]}. Lower {options_lib.GIN_CONFIGURABLE}.'
        f'device_memory_budget_bytes.'
      )
    # The least seconds; ties: the first timed (the speed model's order).
    seconds, chosen = min(timed, key=lambda t: t[0])
    self.log.timed_choice(chosen, seconds, len(timed))
    return chosen

  def _timed_with(
    self,
    first: plan_lib.StepPlan,
    search: plan_search_lib.PlanSearch,
    types: on_types.StepTypes,
  ) -> Iterator[plan_lib.StepPlan]:
    """The plans after `first` in its candidate group, in the speed model's
    order, that fit both budgets and whose programs are all compiled
    already (e.g. another copy-back depth, no prefetch), each found as the
    next is asked for: weighing them compiles nothing; less its twin with
    weights and slots on the host where it keeps them on the device
    (`plan_timing.slower_twin`)."""
    plans = search.group_of(first).plans
    first_programs = set(self.walk(first, types).calls.keys())
    for plan in plans[plans.index(first) + 1 :]:
      walk = self.walk(plan, types)
      if not walk.complete or not all(
        self._programs.done(k) for k in walk.calls.keys()
      ):
        continue
      if plan_timing.slower_twin(
        first, plan, set(walk.calls.keys()) == first_programs
      ):
        continue
      if self.weighing_of(types).fits(self.weigh(plan, types)):
        yield plan

  def plan_stores(
    self,
  ) -> tuple[plan_store_lib.PlanStore | None, list[plan_store_lib.PlanStore]]:
    """(the store a plan is read back from, or None; the stores a chosen
    plan is kept in).

    One store is read, so that what a run says of stored plans is what it
    did: the compilation cache's where the cache is on (every config's,
    shared by `train`, `estimate` and every output directory of the user),
    else the run's output directory's (`keep_plans_in`). A chosen plan is
    kept in both: the output directory's is the record of the run's plans
    (`compare` reads it).
    """
    cache_dir = compilation_cache.enabled_directory()
    shared = None if cache_dir is None else plan_store_lib.PlanStore(cache_dir)
    run = self.plan_store
    if shared is not None and run is not None:
      if os.path.realpath(shared.path) == os.path.realpath(run.path):
        run = None  # one file: kept once
    kept_in = [store for store in (shared, run) if store is not None]
    return (kept_in[0] if kept_in else None), kept_in

  def _stored(
    self,
    stored: plan_store_lib.Stored,
    path: str,
    types: on_types.StepTypes,
    budget_bytes: int,
  ) -> units_lib.PlannedStep | None:
    """The `PlannedStep` of a stored plan (read back from `path`) where
    this trainer may run it and it fits this run's budgets; else None, one
    line saying why, and the run plans afresh."""
    plan = stored.plan
    why = None
    if not self.candidates(types).may_run(plan):
      why = "this trainer's settings or layers rule it out"
    else:
      try:
        step = self.weigh(plan, types)
      except device_memory.ProgramOutOfMemoryError:
        why = 'the compiler refused one of its programs for memory'
      except (
        device_memory.UnsupportedTrainerError,
        device_memory.AccountingError,
        device_memory.ProgramCompileError,
      ) as e:
        why = f'it could not be accounted here: {e}'
      else:
        host_budget = self.host_budget_bytes
        if step.peak_device_bytes > budget_bytes:
          need, limit = format_apart(step.peak_device_bytes, budget_bytes)
          why = f'it needs {need} per device, over the budget of {limit}'
        elif host_budget is not None and step.peak_host_bytes > host_budget:
          need, limit = format_apart(step.peak_host_bytes, host_budget)
          why = (
            f'it needs {need} of host memory, over the host budget of {limit}'
          )
    if why is not None:
      notices.progress(
        f'planning: the plan stored in {path} for this config does not fit '
        f'this run ({why}); planning afresh'
      )
      return None
    if stored.step_seconds is not None:  # timed when it was planned
      self.weighing_of(types).timed(plan, stored.step_seconds)
    return self._chosen(plan, types, budget_bytes, path)

  def _chosen(
    self,
    plan: plan_lib.StepPlan,
    types: on_types.StepTypes,
    budget_bytes: int,
    kept_in: str | None = None,
  ) -> units_lib.PlannedStep:
    """The `PlannedStep` of `plan`, weighed already: marked chosen in the
    shapes' `weighed_plans.Weighing` and logged (`kept_in`: the plans file it
    was read back from, where it was)."""
    step = self.weigh(plan, types)
    weighing = self.weighing_of(types)
    weighing.chosen = plan
    weighing.cost = self.log.chosen(
      plan, self.walk(plan, types).calls.keys(), step, kept_in
    )
    logging.info(
      'device memory plan%s: %s; %s; %s',
      '' if kept_in is None else f' (kept in {kept_in})',
      plan.describe(len(step.calls)),
      step.describe(),
      step.describe_host(),
    )
    overrides.notify_replaced(
      plan, self._options, self._explicit, budget_bytes, self._notified
    )
    return units_lib.PlannedStep(
      plan, units_lib.Units(plan, self._factory), step
    )

  def least_plan(
    self, batch: Batch
  ) -> tuple[plan_lib.StepPlan, device_memory.StepMemory]:
    """(plan, StepMemory) of the leanest plan on `batch`'s shapes: the
    least peak among every group's leanest plan, fused (every layer in the
    loss program) and unfused (one layer per call, no copy-back depth, no
    prefetch, saved inputs and states on the host), over every slicing; the
    least device memory this trainer can step in. Plans the search for the
    step's plan accounted are not accounted again.

    Raises:
      device_memory.UnsupportedTrainerError: the step cannot be compiled
        ahead here.
      device_memory.AccountingError: its figures contradict each other.
      plan_search.LeastRefused: the backend refused to compile every
        leanest plan for memory (a `device_memory.ProgramOutOfMemoryError`).
      device_memory.ProgramCompileError: one did not compile otherwise.
    """
    search = self._search(
      batch_key(self._placement.abstract_batch(batch)), self.step_types(batch)
    )
    self.log.begin('least plan', 'more than the least plan found,')
    try:
      return search.least()
    finally:
      self.log.end()

  def _search(self, key, types):
    """The `plan_search.PlanSearch` of the shapes of `key` (one per
    shapes: the plan chosen under the budget and the least come from one
    search)."""
    if key not in self._searches:
      self._searches[key] = plan_search_lib.PlanSearch(
        self.candidates(types), self.weigher(types)
      )
    return self._searches[key]
