"""Plans timed on the device: a plan's whole step run on copies, its median.

Under a device memory budget the planner may time the few plans that fit
which the speed model ranks first and which run on programs the search
compiled already (`options.TrainerOptions.time_plans`,
`planner.Planner._fastest_timed`), and run the fastest measured; where the
first run shows that timing them would outlast compiling their programs,
none is timed (`TooLongToTime`). `PlanTimer.seconds` runs one plan's whole step
(`units.Units.walk`) on the device as a real step runs it: a
`step_context.StepContext` over a `CopyingStore` (copies of the trainer's
weights, slots and states, which the step's calls may donate; updates set
on it are dropped) whose sink is a `commit.CommitQueue` on that store (each
update copied off the device as the step's are, then dropped), on the first
batch the planner was given (zeros of its shapes where it gave types), with
a fixed RNG key and step 0. One warm-up run (its programs' first calls),
then `REPETITIONS` timed ones, each waited for; their median is the plan's
seconds a step. So a timing run changes nothing a run trains: the layers'
weights, slots and states, the optimizers' hyperparameters, the Loop's RNG
and its data stream are as before; the memory log records none of its
phases, and the H2D/D2H bytes it moved are not counted
(`placement.Placement.transfers`). Its device buffers are released before
the next plan is timed (`placement.Placement.free_device_buffers`, keeping
the store's).

A run the device fails (`jax.errors.JaxRuntimeError`: out of memory at run
time, RESOURCE_EXHAUSTED, or any other error of the device) raises
`PlanRunFailed`, one line: the planner counts the plan as not fitting. In a
run of several processes every process times the same plans in the same
order (the search is the same on each); a plan's seconds are the slowest
process's, and it failed where it failed on any, so all choose one plan.
"""

import contextlib
import statistics
import time
from typing import Callable, Iterator

import jax
from jax.experimental import multihost_utils
from trax.fastmath import numpy as jnp
import numpy as np

from trax_revplus import errors
from trax_revplus import memory as memory_lib
from trax_revplus import placement as placement_lib
from trax_revplus.trainer._plan import options as options_lib
from trax_revplus.trainer._plan import plan as plan_lib
from trax_revplus.trainer._step import commit as commit_lib
from trax_revplus.trainer._step import host_store
from trax_revplus.trainer._step import step_context
from trax_revplus.trainer._step import units as units_lib
from trax_revplus.typing import Batch
from trax_revplus.typing import PyTree

# Plans timed where `time_plans` is 'auto' on an accelerator backend.
AUTO_ON_ACCELERATORS = 3
# Runs of a plan before the timed ones (its programs' first calls), and the
# timed runs whose median is its seconds a step.
WARM_UPS = 1
REPETITIONS = 2
# The least seconds timing may take (`planner.Planner._fastest_timed`: the
# limit is the seconds the first plan's programs took to compile, at least
# this): timing costs no more than compiling the plan would.
MIN_LIMIT_SECONDS = 10.0


def plans_to_time(setting: int | str, platform: str) -> int:
  """How many fitting plans are timed: `setting`
  (`options.TrainerOptions.time_plans`) as given, or for 'auto',
  `AUTO_ON_ACCELERATORS` on an accelerator backend and 0 on `platform`
  'cpu'."""
  if setting == options_lib.AUTO:
    return 0 if platform == 'cpu' else AUTO_ON_ACCELERATORS
  assert isinstance(setting, int)  # checked by `TrainerOptions`
  return setting


def slower_twin(
  first: plan_lib.StepPlan, plan: plan_lib.StepPlan, same_programs: bool
) -> bool:
  """Whether `plan` cannot step faster than `first`, so that timing it
  would tell nothing: it runs `first`'s programs (`same_programs`) with
  every layer's weights and slots on the host where `first` keeps them on
  the device, copying them both ways besides."""
  return same_programs and first.params_on_device and not plan.params_on_device


class PlanRunFailed(Exception):
  """A plan's timing run failed on the device; the message is one line."""


class TooLongToTime(Exception):
  """A plan's first run took so long that its timed runs would pass the
  limit given (`PlanTimer.seconds`).

  Attributes:
    run_seconds: float, the first run's seconds.
  """

  def __init__(self, run_seconds: float):
    super().__init__(f'a run takes {run_seconds:.1f} s')
    self.run_seconds = run_seconds


def _copied(tree: PyTree) -> PyTree:
  """`tree` with every array copied: a device array on its devices (a new
  buffer a call may donate), a host array on the host."""

  def leaf(x):
    if isinstance(x, jax.Array):
      return jnp.copy(x)
    if isinstance(x, np.ndarray):
      return np.array(x, copy=True)
    return x

  return jax.tree_util.tree_map(leaf, tree)


class CopyingStore(host_store.LayerStore):
  """The trainer's `host_store.LayerStore` as a timing run reads it: the
  same layers, optimizers, placed hyperparameters and ties, copies of
  their weights, slots and states (`params`, `states`, `get`), and every
  update set on it dropped (`set`, `set_state`).

  Attributes (besides the store's):
    copy_seconds: float, seconds spent copying so far (a real step does
      not copy: `PlanTimer` takes them off its runs).
  """

  def __init__(self, store: host_store.LayerStore):  # pylint: disable=super-init-not-called
    """A view of `store`; nothing is made, placed or copied yet (the
    store's constructor would make optimizers and place hyperparameters)."""
    self._store = store
    self.blocks = store.blocks
    self.layers = store.layers
    self.optimizers = store.optimizers
    self.opt_params = store.opt_params
    self.ties = store.ties
    self.init_records = []
    self.copy_seconds = 0.0
    # Layer index -> placed copies of its (weights, slots) (`place_all`).
    self._placed: dict[int, tuple[PyTree, PyTree]] = {}

  def place_all(self, placement: placement_lib.Placement) -> None:
    """Places copies of every layer's weights and slots now, which
    `params` then gives: a plan that keeps them on the device
    (`plan.StepPlan.params_on_device`) finds them there at every step but
    its first, so its timed runs place none."""
    indices = list(range(len(self.layers)))
    weights, slots = self._store.params(indices, with_slots=True)
    assert slots is not None
    placed = placement.place_params(_copied(list(zip(weights, slots))))
    self._placed = dict(zip(indices, placed))

  def _copy(self, tree: PyTree) -> PyTree:
    start = time.perf_counter()
    try:
      return _copied(tree)
    finally:
      self.copy_seconds += time.perf_counter() - start

  def params(
    self, indices: list[int], with_slots: bool
  ) -> tuple[list[PyTree], list[PyTree] | None]:
    if self._placed:
      weights = [self._placed[i][0] for i in indices]
      slots = [self._placed[i][1] for i in indices]
      return weights, slots if with_slots else None
    return self._copy(self._store.params(indices, with_slots))

  def states(self, indices: list[int]) -> list[PyTree]:
    return self._copy(self._store.states(indices))

  def get(self, i: int) -> tuple[PyTree, PyTree, PyTree]:
    return self._copy(self._store.get(i))

  def set(self, i: int, weights: PyTree, slots: PyTree, state: PyTree) -> None:
    """Drops the update."""
    del i, weights, slots, state

  def set_state(self, i: int, state: PyTree) -> None:
    """Drops the update."""
    del i, state

  def keep(self) -> list[PyTree]:
    return self._store.keep()


class _Unrecorded(memory_lib.MemoryLog):
  """A memory log that records no step: a timing run's phases."""

  def __init__(self):
    super().__init__(tensorboard=False)

  def should_record(self, step: int) -> bool:
    del step
    return False


@contextlib.contextmanager
def _uncounted(transfers: memory_lib.TransferCounter) -> Iterator[None]:
  """The H2D/D2H bytes moved inside are not counted: the next step's record
  counts its own alone."""
  before = transfers.snapshot()
  try:
    yield
  finally:
    with transfers._lock:  # pylint: disable=protected-access
      transfers.h2d_bytes, transfers.d2h_bytes = before


def _concrete(batch: Batch) -> Batch:
  """`batch` with each `jax.ShapeDtypeStruct` leaf as zeros of its shape
  (a batch given as types is timed on zeros)."""
  return jax.tree_util.tree_map(
    lambda x: (
      np.zeros(x.shape, x.dtype) if isinstance(x, jax.ShapeDtypeStruct) else x
    ),
    batch,
  )


class PlanTimer:
  """Times plans' steps on the device, on copies (`CopyingStore`)."""

  def __init__(
    self,
    placement: placement_lib.Placement,
    store: host_store.LayerStore,
    repetitions: int = REPETITIONS,
    clock: Callable[[], float] = time.perf_counter,
  ):
    """Args:
    placement: the trainer's `placement.Placement`.
    store: its `host_store.LayerStore` (read, never written).
    repetitions: int >= 1, timed runs after the warm-up.
    clock: seconds now (float), as `time.perf_counter`.
    """
    self._placement = placement
    self._store = store
    self.repetitions = repetitions
    self._clock = clock

  def seconds(
    self,
    planned: units_lib.PlannedStep,
    batch: Batch,
    limit_seconds: float | None = None,
  ) -> float:
    """The median wall seconds of `planned`'s step on `batch` over
    `repetitions` runs after `WARM_UPS` (each waited for); device buffers
    released after.

    Args:
      planned: the plan's `units.PlannedStep`.
      batch: the batch (or its types: zeros of them) it runs on.
      limit_seconds: float or None; where the first run shows that all of
        them would take longer (its seconds times the runs), none more
        runs (`TooLongToTime`).

    Raises:
      PlanRunFailed: a run failed on the device (any process's, in a run
        of several).
      TooLongToTime: the runs would pass `limit_seconds` (every process
        agrees: the slowest first run decides).
    """
    batch = _concrete(batch)
    failed = None
    runs: list[float] = []
    total = WARM_UPS + self.repetitions
    too_long = None
    with _uncounted(self._placement.transfers):
      try:
        for i in range(total):
          seconds = self._run(planned, batch)
          if i == 0 and limit_seconds is not None:
            first = self._slowest_process(seconds)
            if first >= 0 and first * total > limit_seconds:
              too_long = first
              break
          if i >= WARM_UPS:
            runs.append(seconds)
      except jax.errors.JaxRuntimeError as e:
        failed = errors.one_line(e, context=False, max_chars=300)
      # The runs' arrays are unreachable now (the error's traceback too).
      self._placement.free_device_buffers(self._store.keep())
    if too_long is not None:
      raise TooLongToTime(too_long)
    median = statistics.median(runs) if failed is None else -1.0
    median = self._slowest_process(median)
    if median < 0:
      raise PlanRunFailed(
        failed or 'the run failed on the device of another process'
      )
    return median

  def _run(self, planned: units_lib.PlannedStep, batch: Batch) -> float:
    """Seconds of one run of `planned`'s step on `batch`, waited for, less
    the time its store spent copying."""
    store = CopyingStore(self._store)
    if planned.plan.params_on_device:
      store.place_all(self._placement)  # Before the clock: see `place_all`.
    sink = commit_lib.CommitQueue(self._placement, store, 'ignore', str)
    sink.begin_step(0, planned.plan.params_on_device)
    parts = step_context.TrainerParts(
      self._placement, store, sink, _Unrecorded(), None, False
    )
    # A fixed RNG key, never the run's own.
    key = jnp.zeros((2,), np.uint32)
    start = self._clock()
    run = step_context.StepContext.for_step(planned, 0, key, batch, parts)
    planned.units.walk(run)
    self._placement.block(run.loss_and_stats())
    return self._clock() - start - store.copy_seconds

  def _slowest_process(self, seconds: float) -> float:
    """`seconds` (-1: failed) agreed by every process: the most, or -1
    where any failed. A collective in a run of several processes."""
    if self._placement.processes is None:
      return seconds
    gathered = np.asarray(
      multihost_utils.process_allgather(np.asarray([seconds], np.float32))
    )
    return -1.0 if (gathered < 0).any() else float(gathered.max())
