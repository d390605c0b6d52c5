"""Private functions and classes of trax's modules.

trax_revplus mirrors trax's own computations exactly where trax keeps them
in private helpers (how `tl.Serial` splits its RNG, how weighted metrics
count their weights, how Adasum merges gradients), and builds the
evaluator trax's `Loop` builds; these are the only references to them.
"""

from typing import Any, Callable

from trax.layers import acceleration
from trax.layers import combinators
from trax.layers import metrics
from trax.optimizers import trainer as optimizers_trainer
from trax.supervised import training

from trax_revplus.trax_door.registry import CLASS
from trax_revplus.trax_door.registry import FUNCTION
from trax_revplus.trax_door.registry import uses


@uses(
  'trax.layers.combinators',
  '_split_rngs',
  FUNCTION,
  'splits a PRNG key into `n_copies` keys as `tl.Serial` and '
  '`tl.Parallel` split theirs among their sublayers',
  parameters=('rng', 'n_copies'),
)
def split_rngs(rng: Any, n_copies: int) -> Any:
  """`n_copies` keys from `rng`, as trax's combinators split theirs among
  their sublayers (`trax.layers.combinators._split_rngs`)."""
  return combinators._split_rngs(rng, n_copies)  # pylint: disable=protected-access


@uses(
  'trax.layers.metrics',
  '_n_weights_per_core',
  FUNCTION,
  "the denominator of trax's weighted means for a weights array",
  parameters=('weights',),
)
def n_weights_per_core(weights: Any) -> Any:
  """The denominator trax's weighted means divide by for `weights`
  (`trax.layers.metrics._n_weights_per_core`)."""
  return metrics._n_weights_per_core(weights)  # pylint: disable=protected-access


@uses(
  'trax.optimizers.trainer',
  '_adasum_merge',
  FUNCTION,
  'merges two gradient leaves as Adasum does',
  parameters=('g1', 'g2'),
)
def adasum_merge(g1: Any, g2: Any) -> Any:
  """Adasum's merge of gradient leaves `g1` and `g2`
  (`trax.optimizers.trainer._adasum_merge`)."""
  return optimizers_trainer._adasum_merge(g1, g2)  # pylint: disable=protected-access


@uses(
  'trax.layers.acceleration',
  '_accelerate',
  FUNCTION,
  'compiles `f` for `n_devices` behind `tl.jit_forward`; replaced while '
  'activated (`compat.accelerate`)',
  parameters=('f', 'n_devices'),
)
def bound_accelerate() -> Callable[..., Any]:
  """What `trax.layers.acceleration._accelerate` is bound to now."""
  return acceleration._accelerate  # pylint: disable=protected-access


@uses(
  'trax.supervised.training',
  '_init_random_number_generators',
  FUNCTION,
  "the Loop's PRNG key from a seed (None: a random one)",
  parameters=('seed',),
)
def init_random_number_generators(seed: Any = None) -> Any:
  """The Loop's first PRNG key for `seed`, as trax makes it
  (`trax.supervised.training._init_random_number_generators`)."""
  return training._init_random_number_generators(seed)  # pylint: disable=protected-access


@uses(
  'trax.supervised.training',
  '_model_with_metrics',
  FUNCTION,
  "the eval model joined with the eval task's metrics, as the Loop "
  'evaluates it',
  parameters=('model', 'eval_task'),
)
def model_with_metrics(model: Any, eval_task: Any) -> Any:
  """`model` with `eval_task`'s metrics, as trax's Loop evaluates it
  (`trax.supervised.training._model_with_metrics`)."""
  return training._model_with_metrics(model, eval_task)  # pylint: disable=protected-access


@uses(
  'trax.supervised.training',
  '_Evaluator',
  CLASS,
  'what `Loop._init_evaluator` returns: (weights, state, metrics_fn)',
  parameters=('weights', 'state', 'metrics_fn'),
)
def evaluator(weights: Any, state: Any, metrics_fn: Any) -> Any:
  """The evaluator `Loop._init_evaluator` returns
  (`trax.supervised.training._Evaluator`)."""
  return training._Evaluator(  # pylint: disable=protected-access
    weights=weights, state=state, metrics_fn=metrics_fn
  )
