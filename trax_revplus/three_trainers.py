"""One config's model with each of three trainers, one step of each accounted.

`account_three` builds the model three times: with trax's default
`Trainer`, stock trax's `ReversibleSerialTrainer` and trax_revplus's, and
accounts what one training step of each would need on a device
(`device_memory`), without running a step. trax_revplus's trainer plans for
a device memory (its `device_memory_budget_bytes`), and the plan it would
run, the least plan and the plans it weighed come from one search. A
trainer that cannot be built or compiled on this JAX gets a one-line error
instead of figures (`device_memory.account`).

It stands beside `trax_revplus.device_memory` rather than in it: it builds
trax_revplus's trainer, which imports that package.
"""

import dataclasses
import functools
import time
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol, Sequence

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
from trax_revplus.trainer._search import budget as budget_lib

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
  layer)."""
  blocks, loss_layer = module.extract_reversible_blocks(
    [cfg.model(), cfg.loss()]
  )
  module.init_reversible_blocks(
    blocks, loss_layer, init_signature(cfg.batch), fastmath.random.get_prng(0)
  )
  return blocks, loss_layer


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
  """trax's two trainers of a config, built now with stock trax's classes
  and accounted on the compile threads (`device_memory.compile_threads`):
  on the CPU backend beside each other (XLA compiles outside the GIL), on
  an accelerator one after the other (its compiler uses the device's
  memory while it compiles: a program compiling beside another could be
  refused for the other's bytes)."""

  def __init__(self, cfg: TrainConfig, backend: str):
    self._results: dict[str, device_memory.TrainerMemory] = {}
    built: dict[str, Any] = {}
    for name, build in (('default', _default), ('stock', _stock)):
      try:
        built[name] = build(cfg)
      except Exception as e:  # pylint: disable=broad-except
        # As `device_memory.account` words a trainer it cannot build.
        self._results[name] = device_memory.account(
          name, backend, 1, functools.partial(_raise, e)
        )

    def account(name: str, trainer: Any) -> None:
      start = time.monotonic()
      self._results[name] = device_memory.account(
        name,
        backend,
        1,
        functools.partial(
          device_memory.trainer_memory, name, trainer, cfg.batch, backend
        ),
      )
      notices.progress(
        f'accounting: {_NAMES[name]} in {time.monotonic() - start:.1f} s'
      )

    if built:
      notices.progress(
        'accounting: '
        + ' and '.join(_NAMES[name] for name in built)
        + ' (compiling their step)'
      )

    if backend == 'cpu':
      self._done = [
        compile_threads.compile_pool().submit(account, name, trainer)
        for name, trainer in built.items()
      ]
    else:

      def account_all() -> None:
        for name, trainer in built.items():
          account(name, trainer)

      self._done = [compile_threads.compile_pool().submit(account_all)]

  def results(self) -> dict[str, device_memory.TrainerMemory]:
    """{'default': ..., 'stock': ...}, once both are accounted."""
    for done in self._done:
      compile_threads.wait_for(done)
      done.result()
    return self._results


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
    blocks, loss_layer = reversible_blocks(rev_lib, cfg)
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
  """Builds and accounts the three trainers of a config: 'revplus' first,
  then 'default' and 'stock' (returned in the order default, stock,
  revplus).

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
  try:
    swap.activate()
    built = _built_revplus(cfg, n_devices, device_memory_bytes)

    def account_revplus() -> device_memory.TrainerMemory:
      nonlocal revplus
      # First: a setting the batch's shapes refute (a plan dimension's:
      # `dimensions.PlanDimension.check`) stops before the other trainers
      # compile; and trax_revplus plans alone, so that its planning's
      # figures are its own.
      memory, *figures = _revplus(built(), cfg, backend, least)
      revplus = tuple(figures)
      return memory

    ours = device_memory.account(
      'revplus',
      backend,
      n_devices,
      account_revplus,
      passes=(validation.SequenceChunksError, validation.MicroBatchesError),
    )
    swap.deactivate()
    results = {**_Others(cfg, backend).results(), 'revplus': ours}
  finally:
    if activated:
      swap.activate()
    else:
      swap.deactivate()
  return ThreeTrainers(
    {name: results[name] for name in ('default', 'stock', 'revplus')},
    *revplus,
  )
