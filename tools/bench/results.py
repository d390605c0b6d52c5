"""bench.json and bench.md: what a run records, merged with earlier runs.

`--quick` runs write bench_quick.json and bench_quick.md, so a smoke run
never overwrites the documented figures.
"""

from importlib import metadata
import json
import os
import shlex
import sys
import time

from tools.bench import markdown
from tools.bench import summary


def paths(out_dir, quick):
  """(bench.json path, bench.md path) in `out_dir`."""
  suffix = '_quick' if quick else ''
  return (
    os.path.join(out_dir, f'bench{suffix}.json'),
    os.path.join(out_dir, f'bench{suffix}.md'),
  )


def environment(backend):
  """Python, JAX and trax versions, CPUs, platform and devices of this run.

  Args:
    backend: the backend as a child process saw it
      (`trax_revplus.backend.probe`): the benchmark's own process opens
      none, a TPU chip belonging to one process.
  """
  return dict(
    python=sys.version.split()[0],
    jax=metadata.version('jax'),
    trax=metadata.version('trax'),
    cpu_count=os.cpu_count(),
    platform=backend['platform'],
    devices=backend['devices'],
  )


def new(opts, argv, backend):
  """The results of a run that has measured nothing yet.

  Args:
    opts: the parsed flags (`cli.define_flags`).
    argv: the command line, program first.
    backend: as `environment` takes it.
  """
  # Quoted as a shell needs it, so the recorded command runs as given.
  return dict(
    command=shlex.join(['python'] + list(argv)),
    started=time.strftime('%Y-%m-%d %H:%M:%S'),
    steps=opts.steps,
    memory_steps=opts.memory_steps,
    quick=opts.quick,
    trainers=list(opts.trainers),
    environment=environment(backend),
    configs={},
  )


def merge_previous(results, previous, opts):
  """With `--update`: keeps from `previous` (an earlier bench.json) the
  configs, parts (timing, memory) and memory figures of trainers that this
  run does not measure; notes what it measures again (`updated_parts`)
  and the earlier commands (`previous_commands`)."""
  for name, r in previous.get('configs', {}).items():
    if name not in opts.configs:
      results['configs'][name] = r
      continue
    kept = {
      k: v
      for k, v in r.items()
      if k == 'config'
      or (k in ('timing', 'timing_mode') and not opts.timing)
      or (k == 'memory' and not opts.memory)
    }
    if opts.memory and 'memory' in r:  # trainers not measured now
      kept['memory'] = {
        t: m for t, m in r['memory'].items() if t not in opts.trainers
      }
    results.setdefault('updated_parts', {})[name] = [
      k
      for k, measured in (('timing', opts.timing), ('memory', opts.memory))
      if measured
    ]
    results['configs'][name] = dict(kept)
  results['previous_commands'] = previous.get('previous_commands', []) + [
    previous.get('command')
  ]


def save(results, json_path, md_path):
  """Summarizes `results` and writes them to `json_path` and `md_path`.

  Called after each part, so an interrupted run keeps what it measured.
  """
  summary.summarize(results)
  with open(json_path, 'w') as f:
    json.dump(results, f, indent=1)
  with open(md_path, 'w') as f:
    commands = [c for c in results.get('previous_commands', []) if c]
    commands.append(results['command'])
    f.write(
      'Commands: '
      + ', then '.join(f'`{c}`' for c in commands)
      + '\n\n'
      + markdown.markdown(results)
    )
