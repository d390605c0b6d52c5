"""An eval's device memory per number of row parts, and its plan, from XLA.

Builds a config's eval model (`train.model(mode='eval')`, as
`trainer_lib.train` does) with trax's default eval metrics, compiles the
eval's program (`evaluation.functions.metrics_function`) for an eval batch
of `--rows` x `--length` tokens over each number of parts of the rows, and
prints XLA's figures (nothing is placed or run); with `--budget_bytes`,
the plan `evaluation.DeviceEvaluator` chooses under it. The figures are
the backend's this runs on. docs/device-memory.md ("Evals") quotes them.

Usage:
  python tools/eval_memory.py \
      --config_file=gin_configs/reformer_enwik8_full.gin --rows=8 \
      --length=65536 --budget_bytes=15220290356
"""

import os
import sys

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_CONFIG_FILE = flags.DEFINE_string(
  'config_file', None, 'A gin config.', required=True
)
_ROWS = flags.DEFINE_integer(
  'rows', 8, 'Rows of the eval batch.', lower_bound=1
)
_LENGTH = flags.DEFINE_integer(
  'length', None, 'Tokens per row.', required=True, lower_bound=1
)
_PARTS = flags.DEFINE_list(
  'parts',
  None,
  'Parts of the rows to compile (default: every divisor of --rows).',
)
_BUDGET = flags.DEFINE_integer(
  'budget_bytes', None, 'Plan the eval under this device budget.'
)


def _mib(n):
  return f'{n / 2**20:.1f} MiB'


def main(argv):
  del argv
  # pylint: disable=g-import-not-at-top
  from trax_revplus import trax_import

  trax_import.import_trax()
  import gin
  import jax
  import numpy as np
  from trax import fastmath
  from trax import shapes
  from trax.supervised import trainer_lib
  from trax.supervised import training
  from trax_revplus import device_memory
  from trax_revplus import evaluation
  from trax_revplus import placement
  from trax_revplus.evaluation import functions
  from trax_revplus.evaluation import planning
  from trax_revplus.layers import preserved

  # pylint: enable=g-import-not-at-top
  # The config's includes name files beside it.
  gin.add_config_file_search_path(os.path.dirname(_CONFIG_FILE.value))
  gin.parse_config_file(_CONFIG_FILE.value, skip_unknown=True)
  model = gin.query_parameter('train.model').scoped_configurable_fn(mode='eval')
  tokens = np.zeros((_ROWS.value, _LENGTH.value), np.int32)
  batch = (tokens, tokens, np.ones(tokens.shape, np.float32))
  model.init(shapes.signature(tokens))
  metrics = list(trainer_lib._DEFAULT_METRICS.values())  # pylint: disable=protected-access
  model_with_metrics = training._model_with_metrics(  # pylint: disable=protected-access
    model, training.EvalTask(iter([batch]), metrics)
  )
  args = (
    batch,
    (model.weights, model_with_metrics.weights[1]),
    (model.state, model_with_metrics.state[1]),
    fastmath.random.get_prng(0),
  )
  where = placement.Placement(1)
  types = placement.OneDevice(where.devices[0]).types(args)
  parts_list = (
    [int(p) for p in _PARTS.value]
    if _PARTS.value
    else planning.divisors(_ROWS.value)
  )
  print(
    f'{_ROWS.value} x {_LENGTH.value} on {where.platform}: '
    f'parts | arguments | temporaries | peak'
  )
  for parts in parts_list:
    with preserved(model_with_metrics):
      compiled = (
        jax.jit(functions.metrics_function(model_with_metrics, parts))
        .trace(*types)
        .lower()
        .compile()
      )
    m = device_memory.ProgramMemory.from_compiled(compiled)
    print(
      f'{parts} | {_mib(m.argument_bytes)} | {_mib(m.temp_bytes)} | '
      f'{_mib(m.call_bytes)}',
      flush=True,
    )
  if _BUDGET.value is not None:
    evaluator = evaluation.DeviceEvaluator(
      model_with_metrics, where, _BUDGET.value
    )
    plan = evaluator.planned(*args).plan
    print(f'plan: {plan.describe(_BUDGET.value)}')


if __name__ == '__main__':
  app.run(main)
