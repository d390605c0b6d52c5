"""Where the reversible trainer's arrays live: host, one device, or N devices.

This package places every array of the trainer's step and its evals;
other modules call JAX's device APIs only for one fact each (the backend,
memory figures, device and process counts: docs/architecture.md lists
them). It mirrors what trax 1.4.1's `ReversibleSerialTrainer` does with
`tl.on_cpu`, `tl.on_accelerator`, `tl.for_n_devices`, `tl.reshape_by_device`,
`_lazy_unreplicate`, `_collect_weights`, `_free_accelerators` and `jax.pmap`,
using only current public APIs (`jax.device_put` with `NamedSharding`,
`jax.shard_map`, `Array.copy_to_host_async`, `jax.live_arrays`).

Layouts on N > 1 devices (mesh axis 'batch', `Layout`):

  * replicated: weights, optimizer slots, optimizer hyperparameters and the
    step number; each device holds the whole array
    (`NamedSharding(mesh, P())`); the global shape is the array's own.
  * per-device: everything that differs between devices (activations,
    cotangents, layer state, RNG keys, statistics); the global shape has a
    leading axis of size N, device d holds slice d
    (`NamedSharding(mesh, P('batch'))`). This is the layout `jax.pmap` uses,
    so per-device values match trax's pmap-based trainers exactly.

On one device both layouts are plain single-device arrays without the
leading axis.

Modules: `devices` (`Placement`: the devices of this process, H2D and D2H
copies), `rules` (one function per placement rule: the shape and sharding
a placed array gets), `ahead_of_time` (the types placed values will have,
from the same rules, for compiling ahead of time), `layouts` (`Layout`;
functions compiled to run per device), `host_copy` (D2H copies collected when
needed; arrays waiting on the host between a forward and a backward),
`freeing` (releasing device buffers nothing can read), `processes` (the
devices of every process of a run; `least_over_processes`), `one_device`
(`OneDevice`: values placed whole on one device, e.g. an eval's, and their
copies deleted after it).
"""

from trax_revplus.placement.devices import Placement
from trax_revplus.placement.host_copy import HostCopy
from trax_revplus.placement.host_copy import WaitingOnHost
from trax_revplus.placement.host_copy import to_numpy
from trax_revplus.placement.layouts import AXIS_NAME
from trax_revplus.placement.layouts import Layout
from trax_revplus.placement.one_device import OneDevice
from trax_revplus.placement.processes import least_over_processes

__all__ = [
  'AXIS_NAME',
  'HostCopy',
  'Layout',
  'least_over_processes',
  'OneDevice',
  'Placement',
  'to_numpy',
  'WaitingOnHost',
]
