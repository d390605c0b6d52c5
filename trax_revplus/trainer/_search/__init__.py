"""The plan a budget chooses: the candidates, their bounds, the search of
each batch's shapes, the planner.

Of `trainer/`'s layers it imports `_plan`, `_step` and `_accounting`; only
the trainer's own modules import it (docs/architecture.md, "The trainer's
layers").

Private: the supported names are `trax_revplus.trainer`'s.
"""
