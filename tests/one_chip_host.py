"""A simulated one-chip host (`one_chip/sitecustomize.py`) for tests.

A process started with `env(lock_path)`, and every process it starts, can
open JAX's backend only while no other of them holds it, as on a TPU host
with one chip; `holding_the_chip` keeps it held. Used by the
`one_chip_host` fixture (conftest.py) and by the smoke scripts in tools/.
"""

import contextlib
import os
import subprocess
import sys

SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                        'one_chip')
LOCK_ENV = 'TRAX_REVPLUS_ONE_CHIP_LOCK'
# What a process that finds the chip held fails with, in part (as a TPU).
BUSY_TEXT = 'The TPU is already in use by process with pid'
# The one line our commands print then, in part.
BUSY_LINE = 'the TPU is in use by another process (pid '


def env(lock_path, base=None):
  """`base` (default os.environ) with the simulation on, its lock at
  `lock_path` (a new dict)."""
  env_ = dict(os.environ if base is None else base)
  env_['PYTHONPATH'] = os.pathsep.join(
      [SITE_DIR] + [p for p in env_.get('PYTHONPATH', '').split(os.pathsep)
                    if p])
  env_[LOCK_ENV] = str(lock_path)
  return env_


@contextlib.contextmanager
def holding_the_chip(env_):
  """A process that opens JAX's backend under `env_` and keeps it open for
  the block; yields its pid.

  Raises:
    AssertionError: the process could not open the backend.
  """
  proc = subprocess.Popen(
      [sys.executable, '-c', 'import sys, jax; jax.devices(); '
       'print("held", flush=True); sys.stdin.read()'],
      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      text=True, env=env_)
  try:
    line = proc.stdout.readline()
    assert line.strip() == 'held', proc.stderr.read()[-3000:]
    yield proc.pid
  finally:
    proc.stdin.close()
    proc.wait()
    proc.stdout.close()
    proc.stderr.close()
