"""How a step runs: its units, the compiled step functions, the run and its
update sink.

Private: the supported names are `trax_revplus.trainer`'s.
"""
