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

SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'one_chip')
LOCK_ENV = 'TRAX_REVPLUS_ONE_CHIP_LOCK'
MESSAGE_ENV = 'TRAX_REVPLUS_ONE_CHIP_MESSAGE'
# What a process that finds the chip held fails with, in part (as a TPU),
# by default and with `env(..., message='pid')`.
BUSY_TEXT = 'Internal error when accessing libtpu multi-process lockfile'
BUSY_PID_TEXT = 'The TPU is already in use by process with pid'


def env(lock_path, base=None, message='lockfile'):
  """`base` (default os.environ) with the simulation on, its lock at
  `lock_path` (a new dict); `message`: what a process that finds the chip
  held fails with, 'lockfile' (libtpu's, with JAX 0.10.2 on a v5e host) or
  'pid' (other libtpu versions')."""
  env_ = dict(os.environ if base is None else base)
  env_['PYTHONPATH'] = os.pathsep.join(
    [SITE_DIR] + [p for p in env_.get('PYTHONPATH', '').split(os.pathsep) if p]
  )
  env_[LOCK_ENV] = str(lock_path)
  env_[MESSAGE_ENV] = message
  return env_


@contextlib.contextmanager
def holding_the_chip(env_):
  """A process that opens JAX's backend under `env_` and keeps it open for
  the block; yields its pid.

  Raises:
    AssertionError: the process could not open the backend.
  """
  proc = subprocess.Popen(
    [
      sys.executable,
      '-c',
      'import sys, jax; jax.devices(); '
      'print("held", flush=True); sys.stdin.read()',
    ],
    stdin=subprocess.PIPE,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    env=env_,
  )
  try:
    line = proc.stdout.readline()
    assert line.strip() == 'held', proc.stderr.read()[-3000:]
    yield proc.pid
  finally:
    proc.stdin.close()
    proc.wait()
    proc.stdout.close()
    proc.stderr.close()
