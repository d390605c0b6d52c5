"""How a step is planned: its plan, the plans a budget chooses from, the
search, the planner.

Private: the supported names are `trax_revplus.trainer`'s.
"""
