"""What a step holds on the device: its run on types (compiled ahead),
its out-of-memory report.

Private: the supported names are `trax_revplus.trainer`'s.
"""
