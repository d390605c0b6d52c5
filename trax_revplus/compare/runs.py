"""The two training processes: their command, output, and what they left.

Each run is `python -m trax_revplus.cli train` in a fresh process; its
entry of compare.json (`collect_run`) gathers its exit status, its
`run_stats.json` (the classes that ran and the figures of each step) and the
peaks of its memory log; the summary it printed is for the reader of its
log.
"""

import json
import os
import re
import subprocess
import sys
from typing import Sequence, TextIO

from trax_revplus import memory
from trax_revplus.memory import reading
from trax_revplus.compare.common import Run
from trax_revplus.compare.common import RUN_STATS_FILENAME

# A Python exception line ("jax.errors.JaxRuntimeError: ...") or the CLI's
# one-line error.
_ERROR_LINE = re.compile(
  r'^((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt)'
  r'\b(?::.*)?|trax-revplus \w+: error: .*)$'
)


def run_command(
  implementation: str,
  config_files: Sequence[str],
  bindings: Sequence[str],
  output_dir: str,
  progress_every_n_steps: int | None,
) -> list[str]:
  command = [
    sys.executable,
    '-m',
    'trax_revplus.cli',
    'train',
    f'--implementation={implementation}',
    f'--output_dir={output_dir}',
  ]
  command += [f'--config_file={os.path.abspath(p)}' for p in config_files]
  command += [f'--config={b}' for b in bindings]
  if progress_every_n_steps is not None:
    command.append(f'--progress_every_n_steps={progress_every_n_steps}')
  return command


def run_streaming(
  command: Sequence[str], log_path: str, prefix: str, stream: TextIO | None
) -> tuple[int, str]:
  """Runs `command`, copying its output to `log_path` and, prefixed, `stream`
  (None: to `log_path` only).

  Returns:
    (exit_code, output): int exit status (negative: killed by that signal)
    and the text it printed (stdout and stderr, interleaved).
  """
  env = dict(os.environ, PYTHONUNBUFFERED='1')
  lines = []
  with open(log_path, 'w', encoding='utf-8') as log:
    process = subprocess.Popen(
      command,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
      errors='replace',
      env=env,
    )
    assert process.stdout is not None  # stdout=PIPE
    try:
      for line in process.stdout:
        lines.append(line)
        log.write(line)
        log.flush()
        if stream is not None:
          stream.write(f'{prefix}{line}')
          stream.flush()
      process.wait()
    except BaseException:
      # Ctrl-C reaches the child too; wait for it so no run is left behind.
      process.terminate()
      process.wait()
      raise
  return process.returncode, ''.join(lines)


def failure_reason(exit_code: int, output: str) -> str:
  """One line saying why a training process failed.

  Args:
    exit_code: int, its exit status (negative: killed by that signal).
    output: str, what it printed.

  Returns:
    str, e.g. "exit 1: AttributeError: module 'jax.lib' has no attribute
    'xla_bridge'".
  """
  if exit_code < 0:
    head = f'killed by signal {-exit_code}'
  else:
    head = f'exit {exit_code}'
  lines = [line.strip() for line in output.splitlines() if line.strip()]
  errors = [line for line in lines if _ERROR_LINE.match(line)]
  last = errors[-1] if errors else (lines[-1] if lines else '')
  if len(last) > 300:
    last = last[:297] + '...'
  return f'{head}: {last}' if last else head


def _read_json(path):
  try:
    with open(path, encoding='utf-8') as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def collect_run(
  implementation: str,
  exit_code: int,
  output: str,
  output_dir: str,
  log_path: str,
  wall_seconds: float,
) -> Run:
  """The RUN entry of compare.json for one finished training process.

  Args:
    implementation: 'stock' or 'revplus'.
    exit_code: int, the process's exit status.
    output: str, what it printed.
    output_dir: str, its training output dir.
    log_path: str, where its output was saved.
    wall_seconds: float, wall time of the process.

  Returns:
    dict, see the module docstring.
  """
  stats = _read_json(os.path.join(output_dir, RUN_STATS_FILENAME))
  records = memory_records(output_dir)
  return {
    'implementation': implementation,
    'status': 'ok' if exit_code == 0 else 'failed',
    'exit_code': exit_code,
    'error': None if exit_code == 0 else failure_reason(exit_code, output),
    'output_dir': output_dir,
    'log': log_path,
    'wall_seconds': wall_seconds,
    'trainer': (stats or {}).get('trainer'),
    'trainer_fix': (stats or {}).get('trainer_fix'),
    'reversible_layers': (stats or {}).get('reversible_layers'),
    'stats': stats,
    'memory_log': dict(
      memory.peaks(records.records),
      records=len(records.records),
      unreadable_lines=records.unreadable,
      unreadable_note=records.unreadable_note(),
    )
    if records.lines
    else None,
  }


def memory_records(output_dir: str) -> reading.LogReading:
  """The run's memory.jsonl as read (`memory.reading`); no records without
  one or when it cannot be read."""
  path = os.path.join(output_dir, memory.MEMORY_LOG_FILENAME)
  try:
    return reading.read(path)
  except OSError:
    return reading.LogReading(path, [], 0, 0, None, None)
