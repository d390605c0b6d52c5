"""Runs the tests marked slow, which the README's test command leaves out.

The README's command keeps to about 12 minutes on 2 cores; the tests marked
`@pytest.mark.slow` (end-to-end runs of a minute or so each: estimate's
table, signals and resumes, trax's Loop restarts, a fused Terraformer
program in slices, ...) run here, in CI after the suite.

Prints one PASS or FAIL line; exit status 0 when every slow test passes,
1 otherwise.

Usage:
  python tools/slow_tests_smoke.py [-- PYTEST_ARGS...]
"""

import os
import subprocess
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv):
  extra = argv[argv.index('--') + 1 :] if '--' in argv else []
  cmd = [
    sys.executable,
    '-m',
    'pytest',
    '-q',
    '-n',
    '2',
    '--dist',
    'loadfile',
    '-m',
    'slow',
    'tests',
  ] + extra
  rc = subprocess.call(cmd, cwd=_REPO)
  print(
    f'{"PASS" if rc == 0 else "FAIL"} the tests marked slow '
    f'(pytest exit status {rc})',
    flush=True,
  )
  return 0 if rc == 0 else 1


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
