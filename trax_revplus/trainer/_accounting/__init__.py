"""What a step holds on the device, accounted ahead: its walk on argument
types, compiling each program ahead.

Of `trainer/`'s layers it imports `_plan` and `_step` (docs/architecture.md,
"The trainer's layers").

Private: the supported names are `trax_revplus.trainer`'s.
"""
