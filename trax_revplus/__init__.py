"""trax_revplus: drop-in memory-efficient reversible training for Trax.

Replacements for trax 1.4.1's `ReversibleHalfResidual`, `ReversibleSerial`
and `ReversibleSerialTrainer` that run on current JAX. Switch a gin config to
them with one line, `import trax_revplus.activate`, or from Python with
`trax_revplus.activate()`.
"""

from trax_revplus.activation import activate
from trax_revplus.activation import deactivate
from trax_revplus.activation import is_active
from trax_revplus.layers import ReversibleHalfResidual
from trax_revplus.layers import ReversibleSerial
from trax_revplus.layers import reconstruction_error
from trax_revplus.trainer import init_reversible_blocks
from trax_revplus.trainer import ReversibleSerialTrainer

__version__ = '0.1.0'
