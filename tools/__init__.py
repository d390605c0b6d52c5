"""Scripts behind the documented figures (run from a checkout, not installed).

A package so that `tools.bench` imports as one name from the tests and from
`tools/bench.py`, whatever else on the path is called `tools`.
"""
