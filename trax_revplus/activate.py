"""Importing this module switches trax to trax_revplus: the gin one-liner.

Add this line to a gin config (or import it from Python)::

    import trax_revplus.activate

and `trax.layers.ReversibleHalfResidual`, `trax.layers.ReversibleSerial` and
`trax.optimizers.ReversibleSerialTrainer` resolve to trax_revplus's classes
until `trax_revplus.deactivate()` switches back (after which importing
this module again activates again). This module is only the hook; the swap
itself is `trax_revplus.swap`, whose `activate` the package's own code calls.
"""

import sys
import types

from trax_revplus import swap

swap.activate()


class _CallableModule(types.ModuleType):
  """This module, callable as `trax_revplus.activate()`.

  Importing a submodule binds it as an attribute of its package, so after
  `import trax_revplus.activate` the name `trax_revplus.activate` is this
  module, not `swap.activate`; calling it still activates.
  """

  def __call__(self):
    swap.activate()


sys.modules[__name__].__class__ = _CallableModule
