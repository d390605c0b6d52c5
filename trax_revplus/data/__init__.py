"""Byte-level language-model inputs read from local text files.

`local_text_inputs` builds a `trax.data.Inputs` from files on this machine, so
a training run needs neither a download nor a TFDS data directory. By default
it reads the `.py` sources of the running Python's standard library (about
700 files, 10-15 MB, found via `sysconfig`), which is real text on every
machine; any files, directories or globs can be named instead, e.g. a local
copy of enwik8. Use it in gin as::

    train.inputs = @trax_revplus.data.local_text_inputs
    local_text_inputs.sequence_length = 256
    local_text_inputs.batch_size = 8

Tokens are bytes: vocab size 256, token id = byte value. Id 0 doubles as the
padding id (trax's `ShiftRight` also feeds 0 as the start token), so every
position whose target is 0 gets loss weight 0: padding at the end of the eval
split and the NUL bytes that a text file practically never contains.

The corpus of each split is one contiguous `uint8` buffer in host memory (one
byte per token); batches are gathered from it, never re-read from disk.
The train and eval streams resume: batch n is a function of `seed` and n
only, and each stream keeps n in trax's data counters
(`trax.data.inputs.data_counters`, names `TRAIN_COUNTER` and
`EVAL_COUNTER`), which a checkpoint keeps and a load restores; a restarted
run continues with the batches an uninterrupted run would have read, not
the first. In a multi-process run
(`jax.distributed`) each process reads its own rows of the same global
batch. Nothing here touches the network. TFDS datasets remain usable
through trax's own `trax.data.batcher` / `data_streams` configs.
"""

from trax_revplus.data.errors import CorpusError
from trax_revplus.data.errors import CorpusSettingError
from trax_revplus.data.corpus_files import DEFAULT_EXCLUDED_DIRS
from trax_revplus.data.corpus_files import default_corpus_files
from trax_revplus.data.corpus_files import default_corpus_root
from trax_revplus.data.corpus_files import read_bytes
from trax_revplus.data.corpus_files import resolve_paths
from trax_revplus.data.corpus_files import split_files
from trax_revplus.data.local_text import load_corpus
from trax_revplus.data.local_text import local_text_inputs
from trax_revplus.data.streams import CountedStream
from trax_revplus.data.streams import EVAL_COUNTER
from trax_revplus.data.streams import LocalTextCorpus
from trax_revplus.data.streams import PAD_ID
from trax_revplus.data.streams import TRAIN_COUNTER
from trax_revplus.data.streams import VOCAB_SIZE

__all__ = [
  'CorpusError',
  'CorpusSettingError',
  'DEFAULT_EXCLUDED_DIRS',
  'CountedStream',
  'EVAL_COUNTER',
  'LocalTextCorpus',
  'PAD_ID',
  'TRAIN_COUNTER',
  'VOCAB_SIZE',
  'default_corpus_files',
  'default_corpus_root',
  'load_corpus',
  'local_text_inputs',
  'read_bytes',
  'resolve_paths',
  'split_files',
]
