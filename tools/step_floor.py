"""The model's own arithmetic on a benchmark config, compiled as one program:
what every trainer's step computes alike.

Every trainer of the benchmark (trax's default `Trainer`, stock's
`ReversibleSerialTrainer`, ours) computes the same forward and gradient of
the same model; what differs is the work around that arithmetic (calls,
copies, recomputation, host updates). For each config of tools/bench/ this
times, in one process, round-robin over the functions so that machine load
hits all alike, the median over `--repeats` calls of one compiled program:

  grad          forward and gradient in the weights of the model and its
                loss, as trax's default `Trainer` differentiates them
                (trax's reversible layers and efficient attention recompute
                their forward in the backward pass);
  grad_kept     the same with every custom gradient off (autodiff keeps the
                activations instead of recomputing them): grad - grad_kept
                is what dropping the recomputation would save;
  head_grad     forward and gradient in the weights and inputs of the loss
                layer alone (what follows the last reversible block, e.g.
                ReformerLM's `Concatenate`, `LayerNorm`, `Dropout`, output
                `Dense` and the cross-entropy with its log-softmax), on its
                inputs: the part no schedule of reversible layers changes.

A schedule that only removes work around the arithmetic stops at `grad`
(plus its optimizer updates); one that lays the same arithmetic out
differently (batch slices, one attention pair at a time) may go below it,
and where it does not, grad / stock's step is the least ours / stock can
be. docs/performance.md quotes the figures ("Where the time goes when the
arithmetic is the step").

Usage:
  python tools/step_floor.py --configs=char,ende --repeats=15
  python tools/step_floor.py --quick --configs=char --repeats=1  # smoke
"""

import os
import statistics
import sys
import time

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tools.bench import configs  # pylint: disable=g-import-not-at-top,wrong-import-position
from tools.bench import model as bench_model  # pylint: disable=g-import-not-at-top,wrong-import-position

_CONFIGS = flags.DEFINE_list(
  'configs', ['char', 'ende'], 'Benchmark configs (tools/bench/configs.py).'
)
_REPEATS = flags.DEFINE_integer(
  'repeats',
  15,
  'Timed calls of each function after 3 warm-up calls.',
  lower_bound=1,
)
_QUICK = flags.DEFINE_bool(
  'quick', False, 'Scale every config down (a smoke run).'
)


def _custom_gradient_classes(base):
  """Every subclass of `base` (itself included) that defines `has_backward`."""
  found, todo = [], [base]
  while todo:
    cls = todo.pop()
    todo.extend(cls.__subclasses__())
    if 'has_backward' in vars(cls):
      found.append(cls)
  return found


def _functions(cfg):
  """{name: (jitted function, arguments)} of the config's model."""
  # pylint: disable=g-import-not-at-top
  from trax_revplus import trax_import

  trax_import.import_trax()
  import jax
  from trax import fastmath
  from trax import layers as tl
  from trax import shapes
  from trax.optimizers import trainer as stock_trainer

  # pylint: enable=g-import-not-at-top
  model, _ = bench_model.model_and_optimizer(cfg)
  loss = tl.WeightedCategoryCrossEntropy()
  batch = configs.batch(cfg)
  rng = fastmath.random.get_prng(0)
  whole = tl.Serial(model, loss)
  whole.init(shapes.signature(batch), rng=rng)
  # The blocks and the loss layer hold `whole`'s layers, initialized above.
  blocks, head = stock_trainer.extract_reversible_blocks([model, loss])
  # The loss layer's inputs: the stack the blocks leave, computed once.
  body = tl.Serial([tl.Serial(std, *revs) for std, revs in blocks])
  head_inputs = body(batch, rng=rng)

  def grad_of(layer, argnums=0):
    state, key = layer.state, fastmath.random.get_prng(1)
    return jax.jit(
      jax.grad(
        lambda w, x: layer.pure_fn(x, w, state, key)[0],
        argnums=argnums,
        allow_int=True,
      )
    )

  functions = {
    'grad': (grad_of(whole), (whole.weights, batch)),
    # The loss layer's input cotangent is part of every step.
    'head_grad': (grad_of(head, argnums=(0, 1)), (head.weights, head_inputs)),
  }
  # A custom gradient is read when the function is traced: trace it with
  # every `has_backward` False, then restore the classes.
  saved = {
    c: vars(c)['has_backward'] for c in _custom_gradient_classes(tl.Layer)
  }
  try:
    for cls in saved:
      cls.has_backward = property(lambda self: False)
    kept = grad_of(whole)
    jax.block_until_ready(kept(whole.weights, batch))
  finally:
    for cls, prop in saved.items():
      cls.has_backward = prop
  functions['grad_kept'] = (kept, (whole.weights, batch))
  return functions


def _median_seconds(functions, repeats):
  """{name: median seconds per call}, the functions called in turns."""
  import jax  # pylint: disable=g-import-not-at-top

  times = {name: [] for name in functions}
  for i in range(3 + repeats):
    for name, (fn, args) in functions.items():
      t0 = time.perf_counter()
      jax.block_until_ready(fn(*args))
      if i >= 3:
        times[name].append(time.perf_counter() - t0)
  return {name: statistics.median(ts) for name, ts in times.items()}


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  try:
    configs.check_configs(_CONFIGS.value)
  except ValueError as e:
    raise app.UsageError(str(e)) from None
  print(
    '| config | grad s | grad_kept s | head_grad s | grad_kept / grad '
    '| head_grad / grad |'
  )
  print('|---|---|---|---|---|---|')
  for name in _CONFIGS.value:
    cfg = configs.config(name, _QUICK.value)
    seconds = _median_seconds(_functions(cfg), _REPEATS.value)
    g = seconds['grad']
    print(
      f'| {name} | {g:.4f} | {seconds["grad_kept"]:.4f} | '
      f'{seconds["head_grad"]:.4f} | {seconds["grad_kept"] / g:.2f} | '
      f'{seconds["head_grad"] / g:.2f} |',
      flush=True,
    )


if __name__ == '__main__':
  app.run(main)
