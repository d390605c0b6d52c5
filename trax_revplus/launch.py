"""The old path of the local launcher, kept so that it still runs.

`python -m trax_revplus.launch ...` runs `python -m
trax_revplus.multiprocess.launcher ...` (see CHANGELOG.md); `trax-revplus
launch` is the command to use.
"""

import sys

from trax_revplus.multiprocess.launcher import main

if __name__ == '__main__':
  sys.exit(main())
