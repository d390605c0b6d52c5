"""How the benchmark talks to the processes it starts.

Every measurement runs in a process of its own: ours clears JAX's
compilation caches and changes process-wide allocator settings, and a peak
RSS is only clean in a fresh process. Each child is this benchmark again,
started through its entry script with an internal flag (`--timing_child`,
`--memory_child`, `--device_memory_child`); it writes its results as
marked JSON lines on stdout, between whatever trax and JAX print there.
"""

import json
import os
import sys

# The entry script, by absolute path: a child must find it from any working
# directory and however the parent was started.
ENTRY = os.path.join(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'bench.py'
)
# Marks the lines a child writes for the parent on its stdout.
RESULT = 'BENCH_RESULT '


def command(*args):
  """The command line of a child process: this Python, the entry, `args`."""
  return [sys.executable, ENTRY, *args]


def send(obj):
  """Writes `obj` (JSON-serializable) to the parent, flushed at once."""
  print(RESULT + json.dumps(obj), flush=True)


def receive(proc, what):
  """The next result line of child `proc` (a `subprocess.Popen` whose
  stdout is a text pipe), parsed; `what` names the child in the error.

  Raises:
    RuntimeError: the child exited before writing a result.
  """
  for line in proc.stdout:
    if line.startswith(RESULT):
      return json.loads(line[len(RESULT) :])
  raise RuntimeError(
    f'timing process {what} exited with status {proc.wait()} (its log is above)'
  )
