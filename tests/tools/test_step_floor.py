"""tools/step_floor.py: the programs it times compute the model's gradient,
and the script prints a row of times per config."""

from absl import flags
from absl.testing import flagsaver
import jax
import numpy as np
from trax import layers as tl
from trax.layers import reversible

from tools import step_floor
from tools.bench import configs


def _classes_and_their_has_backward():
  return {
    c: vars(c)['has_backward']
    for c in step_floor._custom_gradient_classes(tl.Layer)
  }  # pylint: disable=protected-access


def test_the_timed_programs_agree_and_only_grad_recomputes(monkeypatch):
  """`grad` (trax's custom gradients, recomputing) and `grad_kept` (plain
  autodiff keeping activations) give the same weight gradients, only `grad`
  runs the reversible layers' custom backward, the layer classes'
  `has_backward` is as found afterwards, and the loss layer's gradient runs
  on the stack the blocks leave."""
  backward_calls = []
  custom_backward = reversible.ReversibleLayer.backward

  def counted_backward(self, *args, **kwargs):
    backward_calls.append(type(self).__name__)
    return custom_backward(self, *args, **kwargs)

  monkeypatch.setattr(reversible.ReversibleLayer, 'backward', counted_backward)
  before = _classes_and_their_has_backward()
  assert reversible.ReversibleLayer in before
  # Traces (and runs once) grad_kept; grad and head_grad are traced when
  # first called below.
  functions = step_floor._functions(configs.config('char', quick=True))  # pylint: disable=protected-access
  assert sorted(functions) == ['grad', 'grad_kept', 'head_grad']
  assert not backward_calls
  assert _classes_and_their_has_backward() == before
  results = {name: fn(*args) for name, (fn, args) in functions.items()}
  assert backward_calls
  recomputed = jax.tree_util.tree_leaves(results['grad'])
  kept = jax.tree_util.tree_leaves(results['grad_kept'])
  assert len(recomputed) == len(kept) > 10
  assert (
    max(float(np.max(np.abs(a - b))) for a, b in zip(recomputed, kept)) < 1e-5
  )
  assert any(float(np.max(np.abs(a))) > 1e-3 for a in recomputed)
  head_weights_grads = jax.tree_util.tree_leaves(results['head_grad'][0])
  assert head_weights_grads and all(
    np.all(np.isfinite(g)) for g in head_weights_grads
  )


def test_the_classes_are_restored_when_tracing_fails(monkeypatch):
  """A failure while `grad_kept` is traced leaves every `has_backward` as
  it was found."""
  before = _classes_and_their_has_backward()

  def fail(*args, **kwargs):
    raise RuntimeError('tracing failed')

  monkeypatch.setattr(jax, 'block_until_ready', fail)
  try:
    step_floor._functions(configs.config('char', quick=True))  # pylint: disable=protected-access
  except RuntimeError as e:
    assert str(e) == 'tracing failed'
  else:
    raise AssertionError('the failure did not propagate')
  assert _classes_and_their_has_backward() == before


def test_the_script_prints_a_row_of_times_per_config(capsys):
  """`python tools/step_floor.py --quick --configs=char --repeats=1`, its
  flags parsed as the script parses them: one row for char, its times not
  negative (printed to 0.1 ms: the loss layer's may round to 0 at quick
  sizes)."""
  argv = ['step_floor.py', '--quick', '--configs=char', '--repeats=1']
  with flagsaver.flagsaver():
    step_floor.main(flags.FLAGS(argv))
  rows = [
    line.split('|')[1:-1]
    for line in capsys.readouterr().out.splitlines()
    if line.startswith('| char |')
  ]
  assert len(rows) == 1, rows
  assert all(float(cell) >= 0 for cell in rows[0][1:]), rows
