"""How a step runs: its units, the compiled step functions, the walk, what
lives on the host and the commit of updates to it.

Of `trainer/`'s layers it imports `_plan` alone (docs/architecture.md,
"The trainer's layers").

Private: the supported names are `trax_revplus.trainer`'s.
"""
