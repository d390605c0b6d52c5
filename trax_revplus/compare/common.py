"""What the parts of `compare` share: the two runs, their labels, files."""

from typing import Any

# A run's entry of compare.json (see `runs.collect_run`) and the whole
# report (`figures.build_report`).
Run = dict[str, Any]
Report = dict[str, Any]

COMPARE_JSON = 'compare.json'
COMPARE_PNG = 'compare.png'
RUN_STATS_FILENAME = 'run_stats.json'  # As trax_revplus.progress writes it.
IMPLEMENTATIONS = ('stock', 'revplus')
LABELS = {'stock': 'stock trax', 'revplus': 'trax_revplus'}
