"""The compile threads at the end of a process (`compile_threads`)."""

import subprocess
import sys
import textwrap

# A process that ends while a program compiles on a compile thread: the
# compile is held back a second first, so that it runs as the process
# finalizes; "compiled" is printed once it has.
_SCRIPT = textwrap.dedent(
  """
  import time
  import jax
  import jax.numpy as jnp
  from trax_revplus.device_memory import compile_threads

  def compile_late():
    time.sleep(1.0)
    jax.jit(lambda x: jnp.sin(x) @ x).lower(jnp.ones((64, 64))).compile()
    print('compiled', flush=True)

  compile_threads.compile_pool().submit(compile_late)
  print('in flight', compile_threads.compiles_in_flight(), flush=True)
  """
)


def test_a_process_that_ends_mid_compile_waits_for_it():
  done = subprocess.run(
    [sys.executable, '-c', _SCRIPT],
    capture_output=True,
    text=True,
    timeout=120,
    check=False,
  )
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.split() == ['in', 'flight', '1', 'compiled'], done.stdout
