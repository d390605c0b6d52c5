"""A checkpoint loaded into the structure it was saved from.

trax's `Loop.load_checkpoint` puts the checkpoint's flat weights and state
(the model's, as `tl.flatten_weights_and_state` flattened them when
saving) back into the structure `weights_and_state_signature` gives, an
abstract initialization of the whole model. Where one layer object stands
at two places (trax's encoder-decoder `Reformer` embeds inputs and targets
with the same `Embedding`, `Dropout` and `PositionalEncoding`), that
signature marks the second place "from cache", while the Loop's model, as
its trainer initialized it, holds the layer's weights and state at both,
and saved both: the signature has one slot fewer, every array after it
lands one layer late, and the eval model's first call fails (`vmap got
inconsistent sizes`). The model's own weights and state before the load
have the structure the checkpoint was flattened from (the same model,
built the same way): `own_structure` makes the load use it.

trax's loader puts each checkpoint array where the model's array has its
shape (`_match_by_shape`), and where the model's state does not match it
drops the whole state ("loading weights only"). `fitted_shapes` loads an
array that differs from the model's only by axes of size 1 (the state
trax's `ConcatWithPadding` layers reshape at their first call,
`state_shapes`) reshaped to the model's shape, and says which array did
not fit, by the layer holding it, where one does not.

A checkpoint holds each layer's state as the host kept it: device 0's copy,
whatever the device count that wrote it (the trainer's rule, as stock
trax's `_unreplicate`), so it fits a model on any device count. Earlier
revisions wrote a per-device scalar state (a `Dropout`'s rate) on N > 1
devices as a numpy scalar rather than a 0-d array; `_Matcher` and
`fitted_shapes` load every numpy scalar as the 0-d array it stands for,
which is what the model initialized and what planning a step needs (its
argument types are known only for arrays, `placement.ahead_of_time`).

trax's memory-efficient `Loop` loads its checkpoint while its eval model is
the training model itself (it puts the eval model given in place later):
its load sets the training model's state from the checkpoint's and then
from the eval model's saved state, so the training model resumed with the
state of the last eval. `train_state_kept` has the load leave the training
model's state as the checkpoint holds it.
"""

import contextlib
import dataclasses
from typing import Any, Iterator

import jax
import numpy as np
from trax import fastmath
from trax import layers as tl
from trax import shapes
from trax.supervised import training

from trax_revplus import state_shapes
from trax_revplus.trax_door import loop as loop_door


def _signature(leaf: Any) -> Any:
  """An array's `ShapeDtype`; anything else (trax's markers) as it is."""
  if hasattr(leaf, 'shape') and hasattr(leaf, 'dtype'):
    return shapes.ShapeDtype(leaf.shape, leaf.dtype)
  return leaf


@contextlib.contextmanager
def own_structure(loop: training.Loop) -> Iterator[None]:
  """Meanwhile, the Loop's model gives its weights' and state's structure
  as it holds them as its `weights_and_state_signature` (what trax's
  `load_checkpoint` unflattens the checkpoint into)."""
  model = loop.model
  signature = fastmath.nested_map(_signature, (model.weights, model.state))

  def weights_and_state_signature(input_signature, unsafe=False):
    del input_signature, unsafe
    return signature

  # On this instance alone; a trax layer refuses public attributes through
  # its own __setattr__.
  object.__setattr__(
    model, 'weights_and_state_signature', weights_and_state_signature
  )
  try:
    yield
  finally:
    object.__delattr__(model, 'weights_and_state_signature')


def _shape(x: Any) -> tuple[int, ...] | None:
  return None if x is None else tuple(np.shape(x))


def _array(x: Any) -> Any:
  """A numpy scalar as the 0-d array it stands for; anything else as it is.

  Checkpoints written on N > 1 devices by earlier revisions hold a scalar
  state that way (device 0's copy indexed out of its per-device array). A
  0-d array is what the layer was initialized with, what the trainer's
  host state holds (`placement.host_copy`), and what a step's types are
  known ahead for: a numpy scalar left in the state stopped every plan
  under a device memory budget.
  """
  return np.asarray(x) if isinstance(x, np.generic) else x


def _arrays(tree: Any) -> Any:
  """`tree` with each numpy scalar leaf a 0-d array (`_array`)."""
  return jax.tree_util.tree_map(_array, tree)


@dataclasses.dataclass
class Fitting:
  """What `fitted_shapes` saw while a checkpoint loaded.

  Attributes:
    reshaped: list of (name, checkpoint signature, model signature) of the
      arrays loaded reshaped.
    not_fitting: (name, checkpoint signature, model signature) of the
      first array the loader could not place, or None.
  """

  reshaped: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)
  not_fitting: tuple[str, str, str] | None = None


class _Matcher:
  """trax's `_match_by_shape`, with arrays differing only by unit axes
  reshaped, and what did not fit named rather than printed."""

  def __init__(self, model: Any):
    flat_weights, flat_state = tl.flatten_weights_and_state(
      model.weights, model.state
    )
    self._state_names = [
      name for name, _ in state_shapes.named_leaves(model, model.state)
    ]
    self._state_shapes = [_shape(x) for x in flat_state]
    self._weights_shapes = [_shape(x) for x in flat_weights]
    self.fitting = Fitting()

  def _name(self, full: list, k: int) -> str:
    shapes_ = [_shape(x) for x in full]
    if shapes_ == self._state_shapes and k < len(self._state_names):
      return f'the state of {self._state_names[k]}'
    if shapes_ == self._weights_shapes:
      return f'weights array {k}'
    return f'optimizer slot array {k}'

  def __call__(self, full: list, partial: list) -> list:
    partial = [_array(p) for p in partial]
    if len(full) == len(partial) and all(
      _shape(f) == _shape(p)
      or (
        f is not None
        and p is not None
        and np.dtype(f.dtype) == np.dtype(p.dtype)
        and state_shapes.differs_by_unit_axes(np.shape(f), np.shape(p))
      )
      for f, p in zip(full, partial)
    ):
      out = []
      for k, (f, p) in enumerate(zip(full, partial)):
        if _shape(f) != _shape(p):
          self.fitting.reshaped.append(
            (
              self._name(full, k),
              state_shapes.signature(p),
              state_shapes.signature(f),
            )
          )
          p = np.reshape(p, np.shape(f))
        out.append(p)
      return out
    return self._stock_rule(full, partial)

  def _stock_rule(self, full: list, partial: list) -> list:
    # trax 1.4.1's `_match_by_shape`, less its printing: each checkpoint
    # array in turn fills the next model array of its shape.
    k = 0
    out = []
    for w in full:
      if k >= len(partial):
        out.append(w)
      elif w is None and partial[k] is None:
        out.append(None)
        k += 1
      elif w is None or partial[k] is None:
        out.append(w)
      elif w.shape == partial[k].shape:
        out.append(partial[k])
        k += 1
      else:
        out.append(w)
    if k < len(partial):
      model_array = full[k] if k < len(full) else None
      self.fitting.not_fitting = (
        self._name(full, k),
        state_shapes.signature(partial[k]),
        'nothing'
        if model_array is None
        else (state_shapes.signature(model_array)),
      )
      raise IndexError(
        f'{self.fitting.not_fitting[0]} is '
        f'{self.fitting.not_fitting[1]} in the checkpoint and '
        f'{self.fitting.not_fitting[2]} in the model'
      )
    return out


@contextlib.contextmanager
def fitted_shapes(loop: training.Loop) -> Iterator[Fitting]:
  """Meanwhile, the Loop's `load_checkpoint` loads a checkpoint array that
  differs from the model's only by axes of size 1 reshaped to the model's,
  and prints nothing of its own; the `Fitting` yielded says what was
  reshaped and what did not fit (trax then loads the weights only). The
  eval model's state keeps its shapes alike."""
  matcher = _Matcher(loop.model)
  eval_model = loop_door.eval_model(loop)
  eval_state = eval_model.state
  with loop_door.checkpoint_loading_through(matcher):
    yield matcher.fitting
  # trax sets the eval model's state from the checkpoint as it is, without
  # matching (and the eval model may be the model itself).
  eval_model.state = state_shapes.conformed(
    _arrays(eval_model.state), eval_state
  )


class _Discarded:
  """Takes what trax's load sets on an eval model, and keeps nothing."""

  weights: Any = None
  state: Any = None


@contextlib.contextmanager
def train_state_kept(loop: training.Loop) -> Iterator[None]:
  """Meanwhile, where the Loop's eval model is its training model (trax's
  memory-efficient Loop while it is built), the load sets the eval model's
  weights and state on nothing, so the training model keeps the
  checkpoint's training state."""
  model = loop.model
  if loop_door.eval_model(loop) is not model:
    yield
    return
  loop_door.set_eval_model(loop, _Discarded())
  try:
    yield
  finally:
    loop_door.set_eval_model(loop, model)
