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
  BatchSlicesError       the batch slices set do not divide each
                         device's rows.
  MicroBatchesError      the micro-batches set do not divide each
                         device's rows (or their slices), or the step
                         cannot add its parts' gradients exactly.
  SequenceLengthError    the batch's sequence axis does not fit the model's
                         positional encodings (`max_len`).
  SequenceChunksError    the sequence chunks set cannot split the loss
                         layer's tail (it has none, or the count does not divide
                         its sequence length).
  TrainerOptionError     a setting of `ReversibleSerialTrainer` beyond
                         trax's (gin `trax_revplus.ReversibleSerialTrainer.
                         <name>`) is out of its range.
  OptimizerFactoryError  an optimizer instance was given where a factory is
                         needed, or the factory does not return an
                         `Optimizer`.
  NonFiniteError         a loss or gradient norm turned NaN or Inf during a
                         step (raised by the trainer, see
                         `ReversibleSerialTrainer`).

Modules: `errors` (the exceptions), `blocks` (blocks, loss layer,
positional encodings), `splits` (the device count; how a batch splits over
devices; the plan's dimensions check theirs: `trainer._plan.dimensions`),
`optimizers`
(optimizer factories), `non_finite` (NaN/Inf among a step's values),
`gin_hints` (the fix for an unknown gin parameter of ours). None imports
trax at module level: the CLI imports the error types at once.

All but `OptimizerFactoryError` (a `TypeError`) and `NonFiniteError` (an
`ArithmeticError`) are `ConfigurationError`s, a `ValueError`.
"""

from trax_revplus.validation.blocks import check_blocks
from trax_revplus.validation.blocks import check_loss_output
from trax_revplus.validation.blocks import check_sequence_length
from trax_revplus.validation.blocks import standard_layer_list
from trax_revplus.validation.errors import BatchSizeError
from trax_revplus.validation.errors import BatchSlicesError
from trax_revplus.validation.errors import BlockStructureError
from trax_revplus.validation.errors import ConfigurationError
from trax_revplus.validation.errors import DeviceCountError
from trax_revplus.validation.errors import LossLayerError
from trax_revplus.validation.errors import MicroBatchesError
from trax_revplus.validation.errors import NonFiniteError
from trax_revplus.validation.errors import OptimizerFactoryError
from trax_revplus.validation.errors import SequenceChunksError
from trax_revplus.validation.errors import SequenceLengthError
from trax_revplus.validation.errors import TrainerOptionError
from trax_revplus.validation.gin_hints import REMOVED_SETTINGS
from trax_revplus.validation.gin_hints import removed_knob_message
from trax_revplus.validation.gin_hints import removed_setting_message
from trax_revplus.validation.gin_hints import settings_of
from trax_revplus.validation.gin_hints import unknown_knob_hint
from trax_revplus.validation.non_finite import first_non_finite
from trax_revplus.validation.optimizers import check_optimizer_factory
from trax_revplus.validation.optimizers import make_optimizer
from trax_revplus.validation.splits import check_batch
from trax_revplus.validation.splits import check_n_devices

# The errors' public home, as tracebacks and `repr` name them.
for _error in (
  BatchSizeError,
  BatchSlicesError,
  BlockStructureError,
  ConfigurationError,
  DeviceCountError,
  LossLayerError,
  NonFiniteError,
  OptimizerFactoryError,
  SequenceChunksError,
  SequenceLengthError,
  TrainerOptionError,
):
  _error.__module__ = __name__
del _error

__all__ = [
  'BatchSizeError',
  'BatchSlicesError',
  'BlockStructureError',
  'ConfigurationError',
  'DeviceCountError',
  'LossLayerError',
  'NonFiniteError',
  'OptimizerFactoryError',
  'SequenceChunksError',
  'SequenceLengthError',
  'TrainerOptionError',
  'check_batch',
  'check_blocks',
  'check_loss_output',
  'check_n_devices',
  'check_optimizer_factory',
  'check_sequence_length',
  'first_non_finite',
  'make_optimizer',
  'standard_layer_list',
  'REMOVED_SETTINGS',
  'removed_knob_message',
  'removed_setting_message',
  'settings_of',
  'unknown_knob_hint',
]
