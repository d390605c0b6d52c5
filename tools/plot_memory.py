"""Plots a trax_revplus memory log: `python tools/plot_memory.py RUN_DIR`.

The same as `trax-revplus plot-memory RUN_DIR [--output=PNG]`: writes
`<RUN_DIR>/memory.png` (or PNG) from `<RUN_DIR>/memory.jsonl` and prints its
path; see `trax_revplus.memory.plot`.
"""

import sys

from trax_revplus import cli

if __name__ == '__main__':
  sys.exit(cli.main([cli.PROG, 'plot-memory', *sys.argv[1:]]))
