"""Importing this module switches trax to trax_revplus: the gin one-liner.

Add this line to a gin config (or import it from Python)::

    import trax_revplus.activate

and `trax.layers.ReversibleHalfResidual`, `trax.layers.ReversibleSerial` and
`trax.optimizers.ReversibleSerialTrainer` resolve to trax_revplus's classes
for the rest of the process. `trax_revplus.deactivate()` switches back.
"""

from trax_revplus import activation

activation.activate()
