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


def test_a_compile_beside_the_steps_is_no_steps_compile():
  # What a plan compiles beside the training steps is not counted where
  # a step's compiles are; what compiles on a thread otherwise is.
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  from trax_revplus.device_memory import compile_threads
  from trax_revplus.progress import CompileCounter

  def compile_on_a_thread(n, beside):
    def run():
      with compile_threads.beside_steps(beside):
        jax.jit(lambda x: jnp.cos(x) * n).lower(
          jax.ShapeDtypeStruct((n,), jnp.float32)
        ).compile()

    compile_threads.wait_for(compile_threads.compile_pool().submit(run))

  before, _ = CompileCounter.snapshot()
  compile_on_a_thread(3, beside=True)
  assert CompileCounter.snapshot()[0] == before
  compile_on_a_thread(5, beside=False)
  assert CompileCounter.snapshot()[0] == before + 1
  assert not compile_threads.compiling_beside_steps()
