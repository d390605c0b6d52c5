"""Checks of a memory-efficient training setup, run before any work starts.

Each check raises an exception whose message names what is wrong (the block,
layer index and name, the value seen) and how to fix it, so that a mistake
surfaces at step 0 instead of deep inside JAX tracing or hours into a run:

  BlockStructureError    blocks are not (standard layers, reversible layers)
                         pairs, or a reversible list holds a non-reversible
                         layer.
  LossLayerError         the loss layer does not output one scalar.
  DeviceCountError       n_devices is not an int in [1, local device count].
  BatchSizeError         a batch's leading axis does not divide over devices.
  SequenceLengthError    the batch's sequence axis does not fit the model's
                         positional encodings (`max_len`).
  TrainerOptionError     a setting of `ReversibleSerialTrainer` beyond
                         trax's (gin `trax_revplus.ReversibleSerialTrainer.
                         <name>`) is out of its range.
  OptimizerFactoryError  an optimizer instance was given where a factory is
                         needed, or the factory does not return an
                         `Optimizer`.
  NonFiniteError         a loss or gradient norm turned NaN or Inf during a
                         step (raised by the trainer, see
                         `ReversibleSerialTrainer`).

All but `OptimizerFactoryError` (a `TypeError`) and `NonFiniteError` (an
`ArithmeticError`) are `ConfigurationError`s, a `ValueError`.
"""

import inspect
import math
import re

import numpy as np


class ConfigurationError(ValueError):
  """A training setting that cannot work; the message gives the fix."""


class BlockStructureError(ConfigurationError):
  """The blocks passed to the trainer are not shaped as trax's."""


class LossLayerError(ConfigurationError):
  """The loss layer does not end in a scalar."""


class DeviceCountError(ConfigurationError):
  """More devices requested than this process has, or a bad count."""


class BatchSizeError(ConfigurationError):
  """A batch does not split evenly over the devices."""


class SequenceLengthError(ConfigurationError):
  """Sequences longer than the model's positional encodings allow."""


class TrainerOptionError(ConfigurationError):
  """A trainer setting out of its range; the message names the gin binding.

  Attributes:
    name: str, the setting, e.g. 'on_non_finite'.
    value: the value given.
    allowed: str, what the setting accepts.
  """

  def __init__(self, name, value, allowed):
    super().__init__(
        f'trax_revplus.ReversibleSerialTrainer.{name}: {name} must be '
        f'{allowed}, got {value!r}.')
    self.name = name
    self.value = value
    self.allowed = allowed


class OptimizerFactoryError(TypeError):
  """An optimizer instance where a factory is needed, or a bad factory."""


class NonFiniteError(ArithmeticError):
  """A loss or gradient norm became NaN or Inf during a training step.

  Attributes:
    step: int, the training step.
    phase: str, 'loss' or 'backward'.
    layer: int, index of the layer (forward order) whose update showed it.
    what: str, the quantity, e.g. 'loss' or 'gradients_l2'.
  """

  def __init__(self, message, step, phase, layer, what):
    super().__init__(message)
    self.step = step
    self.phase = phase
    self.layer = layer
    self.what = what


def _layer_name(layer):
  return getattr(layer, 'name', type(layer).__name__)


def check_blocks(blocks):
  """Checks that `blocks` is a list of (standard, reversible) layer pairs.

  The shape `trax.optimizers.trainer.extract_reversible_blocks` returns and
  `ReversibleSerialTrainer` / `init_reversible_blocks` take; like trax's
  trainer, which runs a block's standard part as `tl.Serial(standard)`, the
  standard part may also be a single layer (e.g. a `tl.Serial`) or hold
  nested lists of layers.

  Args:
    blocks: Sequence of pairs `(standard_layers, reversible_layers)`:
      `standard_layers` a `tl.Layer` or a (nested) list or tuple of them;
      `reversible_layers` a list (or tuple) of `tl.ReversibleLayer`.

  Raises:
    BlockStructureError: naming the block (and layer) index that is not a
      pair, not a layer or list of layers, or not reversible in a
      reversible list.
  """
  # Imported here: trax takes ~20 s to import, and the CLI imports this
  # module for its error types before it needs trax.
  from trax.layers import base  # pylint: disable=g-import-not-at-top
  from trax.layers import reversible  # pylint: disable=g-import-not-at-top
  fix = ('build them with trax.optimizers.trainer.extract_reversible_blocks'
         '([model, loss_layer]), which returns [(standard_layers, '
         'reversible_layers), ...] and the loss layer')
  if isinstance(blocks, (str, bytes)) or not isinstance(blocks, (list, tuple)):
    raise BlockStructureError(
        f'blocks must be a list of (standard_layers, reversible_layers) '
        f'pairs, got {type(blocks).__name__}; {fix}.')

  def flat_standard(layers):
    if isinstance(layers, base.Layer):
      return [layers]
    if not isinstance(layers, (list, tuple)):
      return None
    flat = []
    for x in layers:
      if isinstance(x, (list, tuple)):
        flat.extend(flat_standard(x))
      else:
        flat.append(x)
    return flat

  for b, block in enumerate(blocks):
    if not isinstance(block, (list, tuple)) or len(block) != 2:
      what = (f'a {type(block).__name__} of length {len(block)}'
              if isinstance(block, (list, tuple)) else
              f'a {type(block).__name__}')
      raise BlockStructureError(
          f'block {b} is {what}, not a (standard_layers, reversible_layers) '
          f'pair; {fix}.')
    std_layers, rev_layers = block
    standard = flat_standard(std_layers)
    if standard is None:
      raise BlockStructureError(
          f'block {b}: the standard layers must be a layer or a list of '
          f'layers, got {type(std_layers).__name__}; {fix}.')
    if not isinstance(rev_layers, (list, tuple)):
      raise BlockStructureError(
          f'block {b}: the reversible layers must be a list of layers, got '
          f'{type(rev_layers).__name__}; wrap a single layer in a list, '
          f'e.g. ([], [layer]).')
    for part, layers in (('standard', standard), ('reversible', rev_layers)):
      for k, layer in enumerate(layers):
        if not isinstance(layer, base.Layer):
          raise BlockStructureError(
              f'block {b}: {part} layer {k} is a {type(layer).__name__}, not '
              f'a trax Layer; {fix}.')
    for k, layer in enumerate(rev_layers):
      if not isinstance(layer, reversible.ReversibleLayer):
        raise BlockStructureError(
            f'block {b}: reversible layer {k} ({_layer_name(layer)}, '
            f'{type(layer).__name__}) is not a tl.ReversibleLayer, so its '
            f'inputs cannot be recomputed on the way back; move it to the '
            f'standard layers of the next block, or make it reversible '
            f'(e.g. wrap a residual branch in tl.ReversibleHalfResidual).')


def check_n_devices(n_devices):
  """Checks `n_devices` against the devices this process can use.

  Args:
    n_devices: int >= 1, or None for all local devices.

  Returns:
    The number of devices to use (int).

  Raises:
    DeviceCountError: if n_devices is not a positive int or exceeds
      `jax.local_device_count()`.
  """
  import jax  # pylint: disable=g-import-not-at-top
  available = jax.local_device_count()
  if n_devices is None:
    return available
  if isinstance(n_devices, bool) or not isinstance(
      n_devices, (int, np.integer)):
    raise DeviceCountError(
        f'n_devices must be an int or None, got {n_devices!r}; pass None to '
        f'use all {available} local device(s).')
  platform = jax.local_devices()[0].platform
  if not 1 <= n_devices <= available:
    raise DeviceCountError(
        f'n_devices={n_devices} but this process has {available} local '
        f'{platform} device(s); pass n_devices between 1 and {available} '
        f'(or None for all), or run where more devices are visible (on CPU: '
        f'XLA_FLAGS=--xla_force_host_platform_device_count={n_devices} before '
        f'JAX is imported).')
  return int(n_devices)


def check_optimizer_factory(optimizer_fn):
  """Checks that `optimizer_fn` is a factory of optimizers, not an instance.

  `ReversibleSerialTrainer` makes one optimizer per layer, so it needs a
  factory (trax's memory-efficient `Loop` passes `TrainTask.optimizer`
  through, and `trainer_lib.train` passes `train.optimizer` uncalled in that
  mode). The reverse mistake, a factory that does not return an
  `Optimizer` (e.g. a function returning a learning rate), is caught when it
  is first called, by `make_optimizer`.

  Args:
    optimizer_fn: a `trax.optimizers.Optimizer` subclass or a callable with
      no required arguments returning an `Optimizer`.

  Raises:
    OptimizerFactoryError: if it is an `Optimizer` instance or not callable.
  """
  from trax.optimizers import base  # pylint: disable=g-import-not-at-top
  if isinstance(optimizer_fn, base.Optimizer):
    name = type(optimizer_fn).__name__
    raise OptimizerFactoryError(
        f'optimizer_fn is an optimizer instance ({name}(...)); the '
        f'memory-efficient trainer makes one optimizer per layer and needs '
        f'a factory: pass the class, e.g. trax.optimizers.{name}, not '
        f'trax.optimizers.{name}() (for settings use functools.partial or '
        f'gin bindings such as {name}.learning_rate).')
  if not callable(optimizer_fn):
    raise OptimizerFactoryError(
        f'optimizer_fn must be an optimizer class or a function returning '
        f'an optimizer, got {type(optimizer_fn).__name__} {optimizer_fn!r}; '
        f'pass e.g. trax.optimizers.Adam.')


def make_optimizer(optimizer_fn, layer_index=None):
  """Calls the factory and checks it returned an `Optimizer`.

  Args:
    optimizer_fn: as for `check_optimizer_factory`.
    layer_index: int or None, named in the error.

  Returns:
    The new `trax.optimizers.Optimizer`.

  Raises:
    OptimizerFactoryError: if the result is not an `Optimizer`, or calling
      with no arguments fails for lack of arguments.
  """
  from trax.optimizers import base  # pylint: disable=g-import-not-at-top
  where = '' if layer_index is None else f' (for layer {layer_index})'
  try:
    inspect.signature(optimizer_fn).bind()
  except TypeError as e:
    raise OptimizerFactoryError(
        f'optimizer_fn{where} must be callable with no arguments, but '
        f'{e}; bind its arguments with functools.partial or gin.') from None
  except ValueError:
    pass  # No signature to inspect (some builtins); just call it.
  optimizer = optimizer_fn()
  if not isinstance(optimizer, base.Optimizer):
    raise OptimizerFactoryError(
        f'optimizer_fn{where} returned a {type(optimizer).__name__}, not a '
        f'trax.optimizers.Optimizer; pass an optimizer class such as '
        f'trax.optimizers.Adam or a function returning an instance of one.')
  return optimizer


def check_batch(batch, n_devices):
  """Checks that every array of `batch` splits evenly over `n_devices`.

  Args:
    batch: array or tuple/list of arrays of shape (B, ...).
    n_devices: int >= 1.

  Raises:
    BatchSizeError: if some array has no leading axis or B % n_devices != 0.
  """
  arrays = batch if isinstance(batch, (list, tuple)) else (batch,)
  for k, x in enumerate(arrays):
    shape = np.shape(x)
    if not shape:
      raise BatchSizeError(
          f'batch element {k} is a scalar; every batch element needs a '
          f'leading batch axis of shape (B, ...).')
    if shape[0] % n_devices:
      raise BatchSizeError(
          f'batch element {k} has batch size {shape[0]} (shape {shape}), '
          f'not divisible by the {n_devices} devices; use a batch size that '
          f'is a multiple of {n_devices} (e.g. {n_devices * max(1, shape[0] // n_devices)}) '
          f'or set n_devices to a divisor of {shape[0]}.')


def _walk(layer):
  yield layer
  for sublayer in getattr(layer, 'sublayers', ()) or ():
    yield from _walk(sublayer)


def check_sequence_length(blocks, input_signature):
  """Checks the batch's sequence length against positional encodings.

  Looks for trax's `PositionalEncoding` (sequences up to `max_len`) and
  `AxialPositionalEncoding` (sequences of exactly the product of its
  `shape`) anywhere in the blocks, and compares them with the length of
  the first input, axis 1 (the token axis of (B, L) inputs, which LMs such as
  `trax.models.ReformerLM` and `TransformerLM` embed and then encode).
  Inputs of rank < 2 are not checked. Abstract: nothing is traced or run.

  Args:
    blocks: list of (standard layers, reversible layers) pairs.
    input_signature: `ShapeDtype` or tuple of them, the batch's.

  Raises:
    SequenceLengthError: naming the layer, its limit and the length seen.
  """
  from trax.layers import attention  # pylint: disable=g-import-not-at-top
  from trax.layers.research import position_encodings  # pylint: disable=g-import-not-at-top
  first = (input_signature[0] if isinstance(input_signature, (list, tuple))
           else input_signature)
  shape = tuple(getattr(first, 'shape', ()))
  if len(shape) < 2:
    return
  length = shape[1]
  for b, (std_layers, rev_layers) in enumerate(blocks):
    for top in list(std_layers) + list(rev_layers):
      for layer in _walk(top):
        if isinstance(layer, attention.PositionalEncoding):
          max_len = getattr(layer, '_max_len', None)
          if max_len is not None and length > max_len:
            raise SequenceLengthError(
                f'sequence length {length} (axis 1 of input shape {shape}) '
                f'exceeds max_len={max_len} of {_layer_name(layer)} in block '
                f'{b}; set the model\'s max_len >= {length} (e.g. gin '
                f'ReformerLM.max_len = {length}) or shorten the sequences.')
        elif isinstance(layer, position_encodings.AxialPositionalEncoding):
          axial = tuple(getattr(layer, '_shape', ()))
          if axial and length != math.prod(axial):
            raise SequenceLengthError(
                f'sequence length {length} (axis 1 of input shape {shape}) '
                f'differs from {math.prod(axial)}, the product of the axial '
                f'shape {axial} of {_layer_name(layer)} in block {b}; make '
                f'the axial shape multiply to {length} (e.g. '
                f'ReformerLM.axial_pos_shape) or pad sequences to '
                f'{math.prod(axial)}.')


def check_loss_output(loss_layer, input_signature):
  """Checks that `loss_layer` outputs one scalar for `input_signature`.

  Abstract (`Layer.output_signature`): no computation runs. The layer must
  be initialized or hold no weights.

  Args:
    loss_layer: the trainer's final layer.
    input_signature: `ShapeDtype` or tuple of them reaching the loss layer.

  Raises:
    LossLayerError: if it has more than one output or a non-scalar output.
  """
  if loss_layer.n_out != 1:
    raise LossLayerError(
        f'loss layer {_layer_name(loss_layer)} has {loss_layer.n_out} '
        f'outputs; it must output one scalar loss (e.g. end it with '
        f'tl.CrossEntropyLoss() or tl.WeightedCategoryCrossEntropy()).')
  out = loss_layer.output_signature(input_signature)
  shape = tuple(getattr(out, 'shape', ()))
  if shape:
    raise LossLayerError(
        f'loss layer {_layer_name(loss_layer)} outputs shape {shape}, not a '
        f'scalar; the trainer differentiates one number per step: average '
        f'over the batch (e.g. tl.CrossEntropyLoss() or '
        f'tl.WeightedCategoryCrossEntropy() rather than tl.CrossEntropy()).')


def first_non_finite(values):
  """Returns the name of the first non-finite value in `values`, or None.

  Args:
    values: dict name -> scalar or array (host or device); reading a device
      array waits for it.

  Returns:
    str or None.
  """
  for name, value in values.items():
    if not np.all(np.isfinite(np.asarray(value))):
      return name
  return None


_OUR_CONFIGURABLES = {
    'ReversibleSerialTrainer': ('trax_revplus.trainer',
                                'ReversibleSerialTrainer'),
    'local_text_inputs': ('trax_revplus.data', 'local_text_inputs'),
    'ProgressPrinter': ('trax_revplus.progress', 'ProgressPrinter'),
}

_UNKNOWN_PARAMETER = re.compile(
    r"Configurable '([\w.]+)' doesn't have a parameter named '(\w+)'")


def parameters_of(configurable):
  """Names a trax_revplus gin configurable accepts (list of str)."""
  import importlib  # pylint: disable=g-import-not-at-top
  module, name = _OUR_CONFIGURABLES[configurable]
  target = getattr(importlib.import_module(module), name)
  if inspect.isclass(target):
    target = target.__init__
  names = [p.name for p in inspect.signature(target).parameters.values()
           if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
  return [n for n in names if n not in ('self', 'loop')]


def unknown_knob_hint(message):
  """For gin's "doesn't have a parameter" error on one of ours, the fix.

  Args:
    message: str, gin's error message.

  Returns:
    str such as "trax_revplus.ReversibleSerialTrainer has no knob
    'no_such_knob'; its knobs: blocks, ..." or None if the message is not
    about a trax_revplus configurable.
  """
  match = _UNKNOWN_PARAMETER.search(message)
  if not match:
    return None
  configurable, knob = match.groups()
  short = configurable.rsplit('.', 1)[-1]
  if short not in _OUR_CONFIGURABLES or not (
      configurable == short or configurable.startswith('trax_revplus')):
    return None
  return (f'{configurable} has no knob {knob!r}; its knobs: '
          f'{", ".join(parameters_of(short))}')
