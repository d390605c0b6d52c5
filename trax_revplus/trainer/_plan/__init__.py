"""What a step is to do: its plan (`StepPlan`), the plan's dimensions and
the trainer's options.

The lowest of `trainer/`'s layers: it imports none of the others
(docs/architecture.md, "The trainer's layers").

Private: the supported names are `trax_revplus.trainer`'s.
"""
