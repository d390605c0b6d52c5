"""How a profiled step spent its time: the device busy, idle, and idle
while a transfer was under way, from a trace `train --profile` wrote.

Reads the Perfetto trace JAX's profiler writes
(`OUTPUT_DIR/profile/plugins/profile/<time>/perfetto_trace.json.gz`) and
measures, over the traced span (the first to the last event of the host
thread that ran the steps):

  device_busy_seconds      the union of the device's op events (a TPU's or
                           GPU's `XLA Ops` line; on a CPU, XLA's own
                           threads' events stand in);
  transfer_seconds         the union of transfer events (host-to-device
                           and device-to-host copies, their waits), on any
                           line;
  transfer_wait_seconds    the time in transfers while the device is not
                           busy: what a step spends waiting for a
                           transfer, as the profile shows it;
  the same over the span, as fractions, and the events taking the most
  time, by name, on each line.

Usage:
  python tools/profile_summary.py RUN_DIR_OR_TRACE [--json=OUT.json]
"""

import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys

# Events of a copy between host and device, or a wait for one, in XLA's,
# PJRT's and the TPU runtime's names.
TRANSFER = re.compile(
  r'transfer|devicetohost|hosttodevice|d2h|h2d|deviceput|copytohost|'
  r'bufferfromhost|literal|infeed|outfeed|dma',
  re.IGNORECASE,
)


def trace_path(path):
  """The perfetto trace under a run dir, a profile dir or the file itself."""
  if os.path.isfile(path):
    return path
  found = sorted(
    glob.glob(
      os.path.join(path, '**', 'perfetto_trace.json.gz'), recursive=True
    )
  )
  if not found:
    raise FileNotFoundError(f'no perfetto_trace.json.gz under {path}')
  return found[-1]


def _union(intervals):
  """Total length of the union of (start, end) intervals."""
  total, end = 0.0, None
  start = None
  for a, b in sorted(intervals):
    if end is None or a > end:
      if end is not None:
        total += end - start
      start, end = a, b
    else:
      end = max(end, b)
  if end is not None:
    total += end - start
  return total


def _merged(intervals):
  merged = []
  for a, b in sorted(intervals):
    if merged and a <= merged[-1][1]:
      merged[-1][1] = max(merged[-1][1], b)
    else:
      merged.append([a, b])
  return merged


def _overlap_outside(intervals, busy):
  """Length of the union of `intervals` outside the union of `busy`."""
  transfer = _merged(intervals)
  busy = _merged(busy)
  total, j = 0.0, 0
  for a, b in transfer:
    cursor = a
    while j < len(busy) and busy[j][1] <= a:
      j += 1
    k = j
    while k < len(busy) and busy[k][0] < b:
      if busy[k][0] > cursor:
        total += busy[k][0] - cursor
      cursor = max(cursor, busy[k][1])
      k += 1
    if cursor < b:
      total += b - cursor
  return total


def summarize(path):
  """The figures of the module docstring for the trace at `path`."""
  with gzip.open(trace_path(path), 'rt', encoding='utf-8') as f:
    trace = json.load(f)
  events = trace['traceEvents'] if isinstance(trace, dict) else trace
  processes, threads = {}, {}
  for e in events:
    if e.get('ph') != 'M':
      continue
    if e.get('name') == 'process_name':
      processes[e['pid']] = e['args']['name']
    elif e.get('name') == 'thread_name':
      threads[(e['pid'], e['tid'])] = e['args']['name']
  spans = [e for e in events if e.get('ph') == 'X' and 'dur' in e]
  device_pids = {p for p, n in processes.items() if n.startswith('/device:')}
  on_device = [
    e
    for e in spans
    if e['pid'] in device_pids
    and 'XLA Ops' in threads.get((e['pid'], e['tid']), '')
  ]
  if not on_device:  # A CPU: XLA's compute threads run the programs.
    on_device = [
      e
      for e in spans
      if re.search(r'XLAEigen|XLA Ops', threads.get((e['pid'], e['tid']), ''))
      and not e['name'].startswith('ThreadpoolListener')
    ]
  host_lines = collections.Counter(
    (e['pid'], e['tid']) for e in spans if e['pid'] not in device_pids
  )
  main = next(
    (
      line
      for line, _ in host_lines.most_common()
      if not threads.get(line, '').startswith('tf_')
    ),
    None,
  )
  steps = [e for e in spans if (e['pid'], e['tid']) == main] or spans
  begin = min(e['ts'] for e in steps)
  end = max(e['ts'] + e['dur'] for e in steps)
  busy = [
    (max(e['ts'], begin), min(e['ts'] + e['dur'], end))
    for e in on_device
    if e['ts'] < end and e['ts'] + e['dur'] > begin
  ]
  transfers = [
    (max(e['ts'], begin), min(e['ts'] + e['dur'], end))
    for e in spans
    if TRANSFER.search(e['name'])
    and e['ts'] < end
    and e['ts'] + e['dur'] > begin
  ]
  span = (end - begin) / 1e6
  busy_seconds = _union(busy) / 1e6
  transfer_seconds = _union(transfers) / 1e6
  wait_seconds = _overlap_outside(transfers, busy) / 1e6
  by_line = collections.defaultdict(collections.Counter)
  for e in spans:
    line = (
      f'{processes.get(e["pid"], e["pid"])} / '
      f'{threads.get((e["pid"], e["tid"]), e["tid"])}'
    )
    by_line[line][e['name']] += e['dur'] / 1e6
  return {
    'trace': trace_path(path),
    'span_seconds': span,
    'device': sorted(processes[p] for p in device_pids) or ['host CPU'],
    'device_busy_seconds': busy_seconds,
    'device_busy_fraction': busy_seconds / span if span else None,
    'transfer_seconds': transfer_seconds,
    'transfer_wait_seconds': wait_seconds,
    'transfer_wait_fraction': wait_seconds / span if span else None,
    'top_events_seconds': {
      line: dict(counter.most_common(12)) for line, counter in by_line.items()
    },
  }


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('path', help='a run dir, its profile dir or the trace')
  parser.add_argument('--json', help='also write the figures here')
  args = parser.parse_args(argv)
  try:
    figures = summarize(args.path)
  except (OSError, ValueError, KeyError) as e:
    print(f'profile_summary: error: {e}', file=sys.stderr)
    return 1
  if args.json:
    with open(args.json, 'w', encoding='utf-8') as f:
      json.dump(figures, f, indent=1)
  print(
    f'{figures["trace"]}: {figures["span_seconds"]:.3f} s traced; device '
    f'busy {figures["device_busy_fraction"]:.1%}; transfers '
    f'{figures["transfer_seconds"]:.3f} s, waited on with the device idle '
    f'{figures["transfer_wait_seconds"]:.3f} s '
    f'({figures["transfer_wait_fraction"]:.1%})'
  )
  return 0


if __name__ == '__main__':
  sys.exit(main())
