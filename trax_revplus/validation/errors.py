"""The errors a check of a training setup raises.

Each message names what is wrong and how to fix it. All but
`OptimizerFactoryError` (a `TypeError`) and `NonFiniteError` (an
`ArithmeticError`) are `ConfigurationError`s, a `ValueError`.
"""


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


class BatchSlicesError(BatchSizeError):
  """The batch slices set do not divide each device's rows of the batch."""


class SequenceChunksError(ConfigurationError):
  """The sequence chunks set cannot split the loss layer's tail: it has
  none, or the count does not divide its sequence length."""


class MicroBatchesError(ConfigurationError):
  """The micro-batches set do not divide each device's rows of the batch (or
  their batch slices), or the step cannot accumulate its parts' gradients
  exactly."""


class SequenceLengthError(ConfigurationError):
  """Sequences longer than the model's positional encodings allow."""


class TrainerOptionError(ConfigurationError):
  """A trainer setting out of its range; the message names the gin binding.

  Attributes:
    name: str, the setting, e.g. 'on_non_finite'.
    value: the value given.
    allowed: str, what the setting accepts; None where `message` (then
      given) says it.
  """

  def __init__(
    self,
    name: str,
    value: object,
    allowed: str | None,
    message: str | None = None,
  ):
    super().__init__(
      message
      or (
        f'trax_revplus.ReversibleSerialTrainer.{name}: {name} must be '
        f'{allowed}, got {value!r}.'
      )
    )
    self.name = name
    self.value = value
    self.allowed = allowed


class OptimizerFactoryError(TypeError):
  """An optimizer instance where a factory is needed, or a bad factory."""


class NonFiniteError(ArithmeticError):
  """A loss or gradient norm became NaN or Inf during a training step.

  Attributes:
    step: int, the training step (None if raised before the first).
    phase: str, 'loss' or 'backward'.
    layer: int, index of the layer (forward order) whose update showed it.
    what: str, the quantity, e.g. 'loss' or 'gradients_l2'.
  """

  def __init__(
    self, message: str, step: int | None, phase: str, layer: int, what: str
  ):
    super().__init__(message)
    self.step = step
    self.phase = phase
    self.layer = layer
    self.what = what
