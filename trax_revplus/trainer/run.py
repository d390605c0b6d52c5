"""`Run`: what a walk over the compiled units runs on.

`units.Units` walks its units on a `Run`, which gives the units their
arguments and makes their calls: `step.StepContext` on placed arrays (the
step itself), or `compilation.AheadOfTime` on their types (compiling the
first step ahead), so both follow one traversal.
"""

import abc


class Run(abc.ABC):
  """What a walk over the units runs on; one per walk.

  A run sees each compiled call with its arguments (`call`) and what the
  step holds across it (`stack`, `grad_stack`, `saved`, `prefetched`), so
  per-call accounting of device memory belongs in a run.

  Attributes:
    stack: the data stack between units (trax's layout: one array or a
      tuple); the walks replace it as they go.
    grad_stack: the cotangents of `stack`, from the loss on.
    saved: dict, layer index -> (inputs, new state) of a standard layer,
      (old state, new state) of a reversible one: what the forward pass
      keeps for the backward pass.
    kept: dict, forward segment (tuple of layer indices) -> (its inputs,
      `jax.vjp`'s function of its forward) for segments that keep their
      activations (`plan.SegmentPlan.keep`).
    rngs: list of each layer's placed RNG, by layer index.
    opt_params: list of each layer's placed optimizer hyperparameters.
    step_placed: the step number, placed (int32).
  """

  def __init__(self, rngs, opt_params, step_placed):
    self.stack = None
    self.grad_stack = None
    self.saved = {}
    self.rngs = rngs
    self.opt_params = opt_params
    self.step_placed = step_placed
    # forward segment (tuple of layers) -> (its inputs, its vjp function),
    # for segments that keep their activations.
    self.kept = {}
    self._next = None  # (unit, its params) placed ahead of its call

  @abc.abstractmethod
  def place(self, layers, with_slots):
    """Weights (and slots) of `layers` as their call takes them.

    Returns:
      (weights, slots): lists over `layers`; slots None without
      `with_slots`.
    """

  @abc.abstractmethod
  def state(self, layers):
    """List of the state of each of `layers` as its call takes it."""

  @abc.abstractmethod
  def call(self, fn, args):
    """Calls compiled function `fn` on `args`; returns its results."""

  def prefetch(self, unit, with_slots):
    """Places `unit`'s parameters ahead of its call (H2D overlaps work)."""
    self._next = (unit, self.place(unit.layers, with_slots))

  def advance(self, unit, following, with_slots):
    """`unit`'s prefetched parameters; prefetches `following`'s (or None)."""
    prefetched_unit, params = self._next
    assert prefetched_unit is unit, (prefetched_unit, unit)
    self._next = None
    if following is not None:
      self.prefetch(following, with_slots)
    return params

  @property
  def prefetched(self):
    """Parameters placed for the next call, or None."""
    return None if self._next is None else self._next[1]

  def forward_done(self, unit, outputs):
    """After `unit`'s forward; `outputs` are its outputs."""

  def updated(self, layers, weights, slots, states, stats):
    """A call's updates, lists over `layers` in commit (backward) order."""

  def backward_done(self, unit):
    """After `unit`'s backward."""
