"""One config's model with each of three trainers, one step of each accounted.

`account_three` builds the model three times: with trax's default
`Trainer`, stock trax's `ReversibleSerialTrainer` and trax_revplus's, and
accounts what one training step of each would need on a device
(`device_memory`), without running a step. trax_revplus's trainer plans for
a device memory (its `device_memory_budget_bytes`), and the plan it would
run, the least plan and the plans it weighed come from one search. A
trainer that cannot be built or compiled on this JAX gets a one-line error
instead of figures (`device_memory.account`).

On the CPU backend the three accountings overlap: trax_revplus's trainer
is built first (from the blocks `parsed_config.check_model` built) and its
settings checked against the batch; then trax's two trainers are built
and their step programs traced on this thread (tracing trax layers stays
on one thread) and compiled on the compile threads while trax_revplus
plans; their figures are composed after (`_Others`). The programs are
those each one's accounting compiles on its own, and so are the figures.

It stands beside `trax_revplus.device_memory` rather than in it: it builds
trax_revplus's trainer, which imports that package.
"""

import dataclasses
import functools
import time
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

from trax import fastmath
from trax import layers as tl
from trax import optimizers
from trax import shapes
from trax.optimizers import trainer as stock_lib

from trax_revplus import device_memory
from trax_revplus import notices
from trax_revplus import swap
from trax_revplus import trainer as rev_lib
from trax_revplus import validation
from trax_revplus.device_memory import compile_threads
from trax_revplus.device_memory import default_trainer
from trax_revplus.device_memory import stock_trainer
from trax_revplus.trainer._search import budget as budget_lib
from trax_revplus.trainer._search import plan_timing

if TYPE_CHECKING:
  import jax

  from trax_revplus.trainer import StepPlan


class TrainConfig(Protocol):
  """What the trainers are built from, as `train` would build them
  (`trax_revplus.cli.parsed_config.Config`).

  Attributes:
    optimizer: the optimizer's class (a `trax.optimizers.Optimizer`).
    batch: tuple of the batch's `jax.ShapeDtypeStruct`s (typed as the
      trainer's methods take a batch: `trax_revplus.typing.Batch`).
  """

  optimizer: type
  batch: tuple

  def model(self) -> 'tl.Layer':
    """A new model in train mode."""

  def loss(self) -> 'tl.Layer':
    """A new loss layer."""


@dataclasses.dataclass(frozen=True)
class RevplusPlan:
  """The plan trax_revplus's trainer would run under its budget.

  Attributes:
    description: the plan's `describe()`.
    fits: whether a plan fits the budget (True when there is none); when
      False, the plan is the least one.
    least_peak_device_bytes: the peak device bytes of the least plan, or
      None where it was not weighed (a plan fits and the least was not
      asked for).
    reason: why no plan fits where it is not the device budget (the host
      budget's one line), else None.
  """

  description: str
  fits: bool
  least_peak_device_bytes: int | None
  reason: str | None = None


@dataclasses.dataclass(frozen=True)
class ThreeTrainers:
  """The figures of the three trainers of one config.

  Attributes:
    trainers: {'default' | 'stock' | 'revplus':
      `device_memory.TrainerMemory`}.
    plan: trax_revplus's plan, or None when its trainer has an error.
    budget_bytes: the budget trax_revplus's trainer planned for (None: no
      budget), or the device memory asked for when it has an error.
    weighing: the plans it weighed
      (`trainer._search.weighed_plans.Weighing`), or None when it has an
      error.
    host_budget_bytes: the host budget it planned for, or None.
  """

  trainers: dict[str, device_memory.TrainerMemory]
  plan: RevplusPlan | None
  budget_bytes: int | None
  weighing: Any
  host_budget_bytes: int | None = None


def init_signature(
  batch: 'Sequence[jax.ShapeDtypeStruct]',
) -> 'tuple[shapes.ShapeDtype, ...]':
  """The batch's `trax.shapes.ShapeDtype`s, as models are initialized."""
  return tuple(shapes.ShapeDtype(x.shape, x.dtype) for x in batch)


def reversible_blocks(
  module: ModuleType, cfg: TrainConfig
) -> 'tuple[list, tl.Layer]':
  """The config's model and loss as `module`'s reversible blocks (stock
  trax's or trax_revplus's trainer module), initialized: (blocks, loss
  layer).

  The blocks made last are kept for `_taken_blocks` (`check_model` builds
  and initializes the model as `train` would before any trainer is built:
  trax_revplus's trainer then takes those blocks rather than build and
  initialize the same ones again).
  """
  blocks, loss_layer = module.extract_reversible_blocks(
    [cfg.model(), cfg.loss()]
  )
  module.init_reversible_blocks(
    blocks, loss_layer, init_signature(cfg.batch), fastmath.random.get_prng(0)
  )
  _kept.clear()
  _kept.append((cfg, module, swap.is_active(), (blocks, loss_layer)))
  return blocks, loss_layer


# The blocks `reversible_blocks` made last: (config, module, whether
# trax_revplus was active, (blocks, loss layer)); taken once.
_kept: list[tuple[Any, ModuleType, bool, Any]] = []


def _taken_blocks(
  module: ModuleType, cfg: TrainConfig
) -> 'tuple[list, tl.Layer]':
  """`reversible_blocks(module, cfg)`: the ones it made last where they are
  of this config and module, built with trax_revplus as active as now (the
  same layers, initialized from the same RNG), else new ones."""
  if _kept:
    kept_cfg, kept_module, active, blocks = _kept.pop()
    if kept_cfg is cfg and kept_module is module and active == swap.is_active():
      return blocks
  return reversible_blocks(module, cfg)


def _default(cfg: TrainConfig) -> Any:
  """trax's default `Trainer` of the config, built."""
  model = tl.Serial(cfg.model(), cfg.loss())
  model.init(init_signature(cfg.batch), rng=fastmath.random.get_prng(0))
  opt = cfg.optimizer()
  opt.tree_init(model.weights)
  return optimizers.Trainer(model, opt, n_devices=1)


def _stock(cfg: TrainConfig) -> Any:
  """stock trax's `ReversibleSerialTrainer` of the config, built."""
  blocks, loss_layer = reversible_blocks(stock_lib, cfg)
  return stock_lib.ReversibleSerialTrainer(
    blocks, loss_layer, cfg.optimizer, n_devices=1
  )


class _Others:
  """trax's two trainers of a config, built with stock trax's classes and
  accounted (`device_memory.trainer_memory`).

  Started (`__init__`): each is built and, where `ahead`, its step
  programs traced on this thread, default's first (trax layers hold their
  weights while traced: one thread at a time), and compiled on
  the compile threads (`device_memory.compile_threads`: XLA compiles
  outside the GIL) while this thread goes on (trax_revplus's planning);
  `results` composes their figures from those programs, the same programs
  the accounting compiling them on demand compiles. Without `ahead` (an
  accelerator, whose compiler uses the device's memory while it compiles:
  a program compiling beside another could be refused for the other's
  bytes), nothing is traced at start and `results` accounts them one after
  the other on a compile thread, as before this overlap.

  Attributes:
    events: (event, trainer name) in the order they happened: 'built',
      'traced' (its programs traced and their compilations started),
      'accounted' (its figures composed); for tests of the order.
  """

  def __init__(self, cfg: TrainConfig, backend: str, ahead: bool):
    self._cfg = cfg
    self._backend = backend
    self._ahead = ahead
    self._results: dict[str, device_memory.TrainerMemory] = {}
    self._built: dict[str, Any] = {}
    self._started: dict[str, float] = {}
    # The programs each one's step compiles, where traced ahead.
    self._programs: dict[str, device_memory.Programs] = {}
    self.events: list[tuple[str, str]] = []
    steps: dict[str, Callable[[Any, Any], device_memory.Programs]] = {
      'default': default_trainer.start_default_trainer_step,
      'stock': stock_trainer.start_stock_trainer_step,
    }
    # Each built and, where `ahead`, traced before the next is built: the
    # default Trainer's one program, the longest to compile, starts first.
    for name, build in (('default', _default), ('stock', _stock)):
      self._started[name] = time.monotonic()
      try:
        self._built[name] = build(cfg)
      except Exception as e:  # pylint: disable=broad-except
        # As `device_memory.account` words a trainer it cannot build.
        self._results[name] = device_memory.account(
          name, backend, 1, functools.partial(_raise, e)
        )
      _event(self.events, 'built', name)
      if not ahead or name not in self._built:
        continue
      try:
        self._programs[name] = steps[name](self._built[name], cfg.batch)
      except Exception as e:  # pylint: disable=broad-except
        # A trace that failed (or an earlier program that did not
        # compile): worded as its accounting words what it raises.
        self._results[name] = device_memory.account(
          name, backend, 1, functools.partial(_raise, e)
        )
      _event(self.events, 'traced', name)
    if self._built:
      notices.progress(
        'accounting: '
        + ' and '.join(_NAMES[name] for name in self._built)
        + ' (compiling their step)'
      )

  def results(self) -> dict[str, device_memory.TrainerMemory]:
    """{'default': ..., 'stock': ...}, each accounted (its programs'
    compilations waited for), one line each, in that order. Without
    `ahead`, accounted on a compile thread, this one waiting for it (a
    signal reaches it meanwhile)."""
    if self._ahead:
      self._account_all()
    else:
      done = compile_threads.compile_pool().submit(self._account_all)
      compile_threads.wait_for(done)
      done.result()
    return {name: self._results[name] for name in ('default', 'stock')}

  def _account_all(self) -> None:
    for name, trainer in self._built.items():
      if name not in self._results:
        self._results[name] = device_memory.account(
          name,
          self._backend,
          1,
          functools.partial(
            device_memory.trainer_memory,
            name,
            trainer,
            self._cfg.batch,
            self._backend,
          ),
        )
      _event(self.events, 'accounted', name)
      # From its build to its last program compiled (where compiled
      # ahead, before its figures were asked for).
      programs = self._programs.get(name)
      ends = (
        []
        if programs is None
        else [
          end for _, end in programs.compile_spans.values() if end is not None
        ]
      )
      end = max(ends) if ends else time.monotonic()
      notices.progress(
        f'accounting: {_NAMES[name]} in {end - self._started[name]:.1f} s'
      )


# The hook `account_three` reports each step of its accounting to, in
# order: (event, trainer name) -> None; events are 'built', 'checked'
# ('revplus' only: its plan's settings checked against the batch),
# 'traced', 'planned' ('revplus' only) and 'accounted'. For tests of the
# order in which the trainers are accounted.
on_event: Callable[[str, str], None] | None = None


def _event(events: list[tuple[str, str]] | None, event: str, name: str) -> None:
  if events is not None:
    events.append((event, name))
  if on_event is not None:
    on_event(event, name)


_NAMES = {
  'default': "trax's default Trainer",
  'stock': "stock trax's ReversibleSerialTrainer",
}


def _raise(error: Exception) -> Any:
  raise error


def _built_revplus(
  cfg: TrainConfig, n_devices: int, device_memory_bytes: int | None
) -> Any:
  """A function building trax_revplus's trainer of the config.

  With `device_memory_bytes` the trainer plans for it; without, for the
  budget its settings give (the config's `device_memory_budget_bytes`, by
  default the device's own size where the backend reports it).
  """

  def build() -> Any:
    blocks, loss_layer = _taken_blocks(rev_lib, cfg)
    budget: dict[str, Any] = (
      {}
      if device_memory_bytes is None
      else {'device_memory_budget_bytes': device_memory_bytes}
    )
    return rev_lib.ReversibleSerialTrainer(
      blocks,
      loss_layer,
      cfg.optimizer,
      n_devices=n_devices,
      memory_log_tensorboard=False,
      output_dir=None,
      **budget,
    )

  return build


def _revplus(
  trainer: Any, cfg: TrainConfig, backend: str, least: bool
) -> tuple[
  device_memory.TrainerMemory, RevplusPlan, int | None, Any, int | None
]:
  """(TrainerMemory, `RevplusPlan`, the budget it planned for, the plans it
  weighed: `weighed_plans.Weighing`, its host budget) of trax_revplus's
  trainer `trainer`. The plan, the least plan and the plans weighed come
  from one search: a plan is accounted once. The least plan is weighed
  where no plan fits, or with `least`.
  """
  budget_bytes = trainer.planner.budget_bytes
  reason = None
  plan: 'StepPlan | None'
  step: device_memory.StepMemory | None
  try:
    plan = trainer.planned(cfg.batch).plan
    step = trainer.device_memory_of(cfg.batch)
    fits = True
  except budget_lib.MemoryBudgetError as e:
    plan = step = None
    if isinstance(e, budget_lib.HostMemoryBudgetError):
      reason = str(e)
  least_plan = least_step = None
  if least or plan is None or step is None:
    least_plan, least_step = trainer.least_device_memory_of(cfg.batch)
  if plan is None or step is None:  # both, or neither
    plan, step = least_plan, least_step
    fits = False
  assert plan is not None and step is not None
  # Calls per step as the accounting counted them (`plan.StepPlan.n_calls`
  # counts units that only reorder the stack, which make none).
  settings = dict(plan.settings(), n_calls=len(step.calls))
  result = device_memory.trainer_memory(
    'revplus',
    trainer,
    cfg.batch,
    backend,
    step=step,
    plan=settings,
    least=None
    if least_plan is None or least_step is None
    else (
      dict(least_plan.settings(), n_calls=len(least_step.calls)),
      least_step,
    ),
    weigh_least=False,
  )
  revplus_plan = RevplusPlan(
    plan.describe(len(step.calls)),
    fits,
    None if least_step is None else least_step.peak_device_bytes,
    reason,
  )
  return (
    result,
    revplus_plan,
    budget_bytes,
    trainer.planner.weighing(cfg.batch),
    trainer.planner.host_budget_bytes,
  )


def account_three(
  cfg: TrainConfig,
  backend: str,
  n_devices: int,
  device_memory_bytes: int | None,
  least: bool = True,
) -> ThreeTrainers:
  """Builds and accounts the three trainers of a config (returned in the
  order default, stock, revplus).

  trax_revplus's trainer is built and its settings checked against the
  batch first (a setting the batch refutes raises before anything
  compiles). On the CPU backend, where the planner times no plans, trax's
  trainers are then built and their programs traced here and compiled on
  the compile threads while trax_revplus's trainer plans; else they are
  built and accounted after it, one after the other (an accelerator's
  compiler uses the device's memory). The hook `on_event` hears each step.

  trax's trainers are built with stock trax's classes, trax_revplus's with
  its own (activated for it); the activation is as it was afterwards.

  Args:
    cfg: what to build, as `train` would (e.g.
      `trax_revplus.cli.parsed_config.Config`): `model()` a new model in
      train mode, `loss()` a new loss layer, `optimizer` the optimizer's
      class, `batch` the batch's `jax.ShapeDtypeStruct`s.
    backend: the platform the programs compile for, e.g.
      `jax.default_backend()`.
    n_devices: devices trax_revplus's trainer runs on; trax's trainers are
      accounted on one.
    device_memory_bytes: the memory trax_revplus's trainer plans for, or
      None: the budget its settings give.
    least: whether to weigh trax_revplus's leanest plan also where a plan
      fits (where none does, it always is).

  Returns:
    `ThreeTrainers`.

  Raises:
    validation.SequenceChunksError: trax_revplus's sequence chunks set
      cannot split the config's loss layer's tail (the config's mistake).
    validation.MicroBatchesError: its micro-batches set cannot split the
      config's batch, or its step cannot add their gradients exactly.
  """
  activated = swap.is_active()
  # plan, budget, weighing, host budget
  revplus: tuple[RevplusPlan | None, int | None, Any, int | None] = (
    None,
    device_memory_bytes,
    None,
    None,
  )
  passes = (validation.SequenceChunksError, validation.MicroBatchesError)
  try:
    swap.activate()
    build = _built_revplus(cfg, n_devices, device_memory_bytes)
    trainer: Any = None

    def build_and_check() -> device_memory.TrainerMemory:
      nonlocal trainer
      trainer = build()
      _event(None, 'built', 'revplus')
      # First: a setting the batch's shapes refute (a plan dimension's:
      # `dimensions.PlanDimension.check`, as planning checks it first)
      # stops before anything compiles.
      trainer.planner.check(cfg.batch)
      _event(None, 'checked', 'revplus')
      return _NOT_ACCOUNTED

    def plan() -> device_memory.TrainerMemory:
      nonlocal revplus
      memory, *figures = _revplus(trainer, cfg, backend, least)
      revplus = tuple(figures)
      _event(None, 'planned', 'revplus')
      return memory

    ours = device_memory.account(
      'revplus', backend, n_devices, build_and_check, passes=passes
    )
    # trax's trainers are traced ahead and compile while trax_revplus
    # plans, on the CPU backend; not where the device's memory is the
    # compiler's (an accelerator), nor where the planner times plans on
    # the device (the other compilations would share its cores).
    ahead = backend == 'cpu' and (
      trainer is None
      or plan_timing.plans_to_time(trainer.options.time_plans, backend) < 2
    )
    others = None
    if ahead:
      swap.deactivate()
      others = _Others(cfg, backend, ahead=True)
      swap.activate()
    if ours is _NOT_ACCOUNTED:
      ours = device_memory.account(
        'revplus', backend, n_devices, plan, passes=passes
      )
    swap.deactivate()
    if others is None:
      others = _Others(cfg, backend, ahead=False)
    results = {**others.results(), 'revplus': ours}
  finally:
    _kept.clear()
    if activated:
      swap.activate()
    else:
      swap.deactivate()
  return ThreeTrainers(
    {name: results[name] for name in ('default', 'stock', 'revplus')},
    *revplus,
  )


# What `account_three` holds for trax_revplus's row between building its
# trainer and planning it.
_NOT_ACCOUNTED = device_memory.TrainerMemory('revplus', '', 0)
