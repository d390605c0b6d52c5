"""tools/step_floor.py: the programs it times compute the model's gradient."""

import jax
import numpy as np
from trax import layers as tl
from trax.layers import reversible

from tools import step_floor
from tools.bench import configs


def test_the_timed_programs_agree_and_the_layers_are_restored():
  """`grad` (trax's custom gradients, recomputing) and `grad_kept` (plain
  autodiff keeping activations) give the same weight gradients; the layer
  classes' `has_backward` is as found afterwards; the loss layer's gradient
  runs on the stack the blocks leave."""
  before = {c: vars(c)['has_backward']
            for c in step_floor._custom_gradient_classes(tl.Layer)}  # pylint: disable=protected-access
  assert reversible.ReversibleLayer in before
  functions = step_floor._functions(configs.config('char', quick=True))  # pylint: disable=protected-access
  assert sorted(functions) == ['grad', 'grad_kept', 'head_grad']
  after = {c: vars(c)['has_backward']
           for c in step_floor._custom_gradient_classes(tl.Layer)}  # pylint: disable=protected-access
  assert after == before
  results = {name: fn(*args) for name, (fn, args) in functions.items()}
  recomputed = jax.tree_util.tree_leaves(results['grad'][0])
  kept = jax.tree_util.tree_leaves(results['grad_kept'][0])
  assert len(recomputed) == len(kept) > 10
  assert max(float(np.max(np.abs(a - b)))
             for a, b in zip(recomputed, kept)) < 1e-5
  assert any(float(np.max(np.abs(a))) > 1e-3 for a in recomputed)
  head_weights_grads = jax.tree_util.tree_leaves(results['head_grad'][0])
  assert head_weights_grads and all(
      np.all(np.isfinite(g)) for g in head_weights_grads)
