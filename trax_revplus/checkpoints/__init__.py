"""Checkpoint sets written and committed as a unit, verified, resumed exactly.

trax's `Loop.save_checkpoint(basename)` writes a checkpoint as separate
files, `<basename>.weights.npy.gz`, `<basename>.opt_slots<i>.npy.gz` and
`<basename>.pkl.gz` (step, state, history), each atomically but not as a
set, and `data_counters<host>.pkl` (the data position) in place, not
atomically; `Loop.load_checkpoint` loads a mix of sets, or a damaged file
(`tl.np_from_file` silently keeps the arrays before a cut or a CRC error),
without a word. Two more things a restarted trax run does not resume: the
Loop's RNG (split once per step, from the seed again after a restart, so
dropout masks differ) and, unless the data counters file survived, the
position in the training data.

`activate()` binds `save_checkpoint` and `load_checkpoint` here in place of
the Loop's methods (`deactivate()` restores them). A save stages the set,
describes every file in a manifest (size and CRC-32 of its bytes, the
Loop's RNG at its next step, the data counters) and commits the set as a
unit, keeping the set it replaces as `<basename>.prev`; a load verifies the
set against its manifest and falls back to `.prev` with a warning naming
the damaged file. Stock trax loads our sets unchanged.

Modules, one job each:

  manifest        the set's manifest: format, file names, its own CRC-32
  integrity       sizes and CRC-32s: `verify` a set, `describe_last_good`
  files           durable writes: fsync, atomic JSON replace
  atomicity       committing a staged set as a unit; cleaning up after kills
  pending_evals   the evals trax runs after a step's save, taken as done
  loop_rng        the Loop's RNG kept and restored (dropout resumes exactly)
  data_counters   trax's data position kept with the set (eval streams too),
                  and its file
  model_state     a set loaded into the structure it was saved from
                  (trax's load misplaces arrays after a shared layer)
  saving          `save_checkpoint`: stage, describe, commit
  loading         `load_checkpoint`: verify, fall back to `.prev`, restore
  errors          `CheckpointError` and friends; telling a full disk
"""

from trax_revplus.checkpoints.data_counters import load_data_counters
from trax_revplus.checkpoints.data_counters import (
  set_aside_unreadable_data_counters,
)
from trax_revplus.checkpoints.data_counters import stock_load_data_counters
from trax_revplus.checkpoints.errors import CheckpointError
from trax_revplus.checkpoints.errors import CheckpointMismatchError
from trax_revplus.checkpoints.errors import CheckpointWriteError
from trax_revplus.checkpoints.errors import free_bytes
from trax_revplus.checkpoints.errors import is_disk_full
from trax_revplus.checkpoints.integrity import describe_last_good
from trax_revplus.checkpoints.integrity import file_crc32
from trax_revplus.checkpoints.integrity import verify
from trax_revplus.checkpoints.loading import load_checkpoint
from trax_revplus.checkpoints.loading import stock_load_checkpoint
from trax_revplus.checkpoints.manifest import FORMAT
from trax_revplus.checkpoints.manifest import FORMAT_1
from trax_revplus.checkpoints.manifest import MANIFEST_SUFFIX
from trax_revplus.checkpoints.manifest import manifest_path
from trax_revplus.checkpoints.manifest import PREVIOUS
from trax_revplus.checkpoints.manifest import STAGING_SUFFIX
from trax_revplus.checkpoints.manifest import staging_path
from trax_revplus.checkpoints.saving import save_checkpoint
from trax_revplus.checkpoints.saving import stock_save_checkpoint

__all__ = [
  'CheckpointError',
  'CheckpointMismatchError',
  'CheckpointWriteError',
  'FORMAT',
  'FORMAT_1',
  'MANIFEST_SUFFIX',
  'PREVIOUS',
  'STAGING_SUFFIX',
  'describe_last_good',
  'file_crc32',
  'free_bytes',
  'is_disk_full',
  'load_checkpoint',
  'load_data_counters',
  'manifest_path',
  'save_checkpoint',
  'set_aside_unreadable_data_counters',
  'staging_path',
  'stock_load_checkpoint',
  'stock_load_data_counters',
  'stock_save_checkpoint',
  'verify',
]
