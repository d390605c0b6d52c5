"""Host and device memory: probes, the trainer's memory log, its figure.

Modules, one job each:

  probes        bytes in use now: `host_rss_bytes()`, `device_bytes_in_use()`,
                `array_bytes(tree)`; what the host can give:
                `host_available_bytes()`.
  host_peak     the true peak RSS between two moments (the kernel's
                high-water mark, reset around each step on Linux).
  host_release  gives memory the C allocator holds free back to the system
                (glibc's `malloc_trim`; a fixed mmap threshold).
  transfers     `TransferCounter`: bytes copied host-to-device (H2D) and
                device-to-host (D2H), counted by the code that copies.
  records       the fields of a `memory.jsonl` record, its one-line form,
                a run's peaks.
  reading       reading a log back: its valid records, and what is not.
  log           `MemoryLog`: what each step records, and when
                (`RecordSchedule`: which steps get phase records).
  writers       where records go: absl lines, `memory.jsonl`, TensorBoard.
  step_axis     where a record sits on a figure's training-step axis.
  plot          a memory log as a PNG (`trax-revplus plot-memory`).

The names below are importable from `trax_revplus.memory` itself;
`host_release`, `step_axis` and `plot` are imported as modules (`plot`
imports matplotlib, which training does not need).
"""

from absl import logging  # pylint: disable=unused-import

from trax_revplus.byte_sizes import BYTES_PER_MIB
from trax_revplus.memory import host_peak
from trax_revplus.memory.log import MemoryLog
from trax_revplus.memory.probes import array_bytes
from trax_revplus.memory.probes import device_bytes_in_use
from trax_revplus.memory.probes import host_available_bytes
from trax_revplus.memory.probes import host_rss_bytes
from trax_revplus.memory.reading import read_memory_log
from trax_revplus.memory.records import format_record
from trax_revplus.memory.records import MEMORY_LOG_FILENAME
from trax_revplus.memory.records import peaks
from trax_revplus.memory.records import TENSORBOARD_SUBDIR
from trax_revplus.memory.log import FIRST_STEPS_RECORDED
from trax_revplus.memory.transfers import TransferCounter

__all__ = [
  'array_bytes',
  'BYTES_PER_MIB',
  'device_bytes_in_use',
  'FIRST_STEPS_RECORDED',
  'format_record',
  'host_available_bytes',
  'host_peak',
  'host_rss_bytes',
  'MEMORY_LOG_FILENAME',
  'MemoryLog',
  'peaks',
  'read_memory_log',
  'TENSORBOARD_SUBDIR',
  'TransferCounter',
]
