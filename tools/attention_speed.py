"""The speed model's rule for attention heads at once, measured on a device.

trax's efficient attention layers compute their (example, head) pairs
`n_parallel_heads` at a time; the trainer's plan may set that number
(`parallel_heads`) below or above the config's. Which numbers step fastest
on a backend is the speed model's rule
(`trax_revplus.trainer._search.speed_rank.SPEED_PARALLEL_HEADS`); this tool
measures what it rests on. For each distinct attention layer of a gin
config's model (each reversible layer holding one: trax's
`extract_reversible_blocks`, as the trainers cut the model), at each number
of rows a call may get and each number of pairs at once that runs there, it
compiles the layer's forward and gradient alone (`trax_revplus.step_floor`,
as the floor does) and times it on this process's first device: seconds
per call and per row, TFLOP/s, and XLA's temporary bytes. A program the
backend refuses to compile (on a TPU, for memory) is named as refused.
`train --step_floor` times a few of these settings per attention kind in
a run (`step_floor.parallel_heads_settings`: the plan's, the config's, all
pairs at once and its halvings), with fewer calls; this tool times every
number at every row count, with the floor's calls.

It opens JAX's backend: on a TPU, run it alone on the chip.

Usage:
  python tools/attention_speed.py \
      --config_file=gin_configs/reformer_enwik8_full.gin \
      --config="local_text_inputs.paths = None" --rows=1,2,4 --json=OUT.json
"""

import argparse
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def _pairs_at_once(heads: int, rows: int, configured):
  """Numbers of pairs at once that run a call of `rows` rows of a layer of
  `heads` heads: 1, 2, 4, ... up to all its pairs (those trax accepts),
  the configured number among them."""
  # pylint: disable=g-import-not-at-top
  from trax_revplus.trainer._step import attention_heads

  found = set()
  n = 1
  while n <= rows * heads:
    if attention_heads.runs_at([(heads, configured)], n, rows):
      found.add(n)
    n *= 2
  found.add(rows * heads)
  if configured is not None:
    found.add(min(configured, rows * heads))
  return sorted(found)


def measure(config_files, bindings, rows_list, max_seconds, only_heads=None):
  """{'backend', 'layers': [{'name', 'heads', 'configured', 'rows',
  'parallel_heads', 'seconds', 'seconds_per_row', 'tflops_per_second',
  'temp_bytes', 'refused'}]}."""
  # pylint: disable=g-import-not-at-top
  from trax_revplus.cli import gin_config

  gin_config.import_trax_quietly()
  gin_config.parse_configs(config_files, bindings)
  import jax
  from trax import layers as tl
  from trax.optimizers import trainer as stock_trainer

  from trax_revplus import step_floor
  from trax_revplus import three_trainers
  from trax_revplus.cli import parsed_config
  from trax_revplus.trainer._step import attention_heads

  cfg = parsed_config.Config(bindings)
  model, loss = cfg.model(), cfg.loss()
  tl.Serial(model, loss).init(three_trainers.init_signature(cfg.batch))
  blocks, _ = stock_trainer.extract_reversible_blocks([model, loss])
  # One of each distinct attention holder, by its printed form.
  holders = {}
  for std, revs in blocks:
    for layer in list(std) + list(revs):
      found = attention_heads.layer_heads([layer])
      if found and str(layer) not in holders:
        holders[str(layer)] = (layer, found[0])
  batch = tuple(cfg.batch)
  device_rows = batch[0].shape[0] // jax.local_device_count()
  one_device = step_floor.per_device(batch, jax.local_device_count())
  results = []
  start = time.time()
  for layer, (heads, configured) in holders.values():
    for rows in rows_list:
      if device_rows % rows:
        continue
      for n in _pairs_at_once(heads, rows, configured):
        if only_heads and n not in only_heads:
          continue
        if time.time() - start > max_seconds:
          break
        entry = {
          'name': layer.name,
          'attention': type(
            attention_heads.attention_layers([layer])[0]
          ).__name__,
          'heads': heads,
          'configured': configured,
          'rows': rows,
          'parallel_heads': n,
        }
        try:
          floor = step_floor.measure(
            model,
            loss,
            one_device,
            rows,
            parallel_heads=n,
            only=lambda l, target=layer: l is target,
            # This tool times each setting itself, with the floor's calls.
            settings=False,
          )
        except Exception as e:  # pylint: disable=broad-except
          # Refused by the backend (RESOURCE_EXHAUSTED), or out of memory.
          entry['refused'] = f'{type(e).__name__}: {str(e).splitlines()[0]}'
        else:
          kind = floor.kinds[0]
          entry.update(
            seconds=kind.seconds,
            seconds_per_row=kind.seconds / rows,
            tflops_per_second=kind.flops / kind.seconds / 1e12,
            temp_bytes=kind.temp_bytes,
          )
        results.append(entry)
        print(json.dumps(entry), flush=True)
  return {'backend': jax.default_backend(), 'layers': results}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--config_file', action='append', required=True)
  parser.add_argument('--config', action='append', default=[])
  parser.add_argument('--rows', default='1,2,4', help='rows per call')
  parser.add_argument('--max_seconds', type=float, default=400)
  parser.add_argument(
    '--parallel_heads', default='', help='only these pairs at once, e.g. 1,8'
  )
  parser.add_argument('--json', help='write the figures here')
  args = parser.parse_args(argv)
  rows = [int(r) for r in args.rows.split(',')]
  only = [int(n) for n in args.parallel_heads.split(',') if n]
  figures = measure(args.config_file, args.config, rows, args.max_seconds, only)
  print('| layer | rows | pairs at once | s / call | s / row | TFLOP/s | MiB |')
  print('|---|---|---|---|---|---|---|')
  for e in figures['layers']:
    if 'refused' in e:
      print(
        f'| {e["attention"]} | {e["rows"]} | {e["parallel_heads"]} | '
        f'refused | | | |'
      )
      continue
    print(
      f'| {e["attention"]} | {e["rows"]} | {e["parallel_heads"]} | '
      f'{e["seconds"]:.4f} | {e["seconds_per_row"]:.4f} | '
      f'{e["tflops_per_second"]:.1f} | {e["temp_bytes"] / 2**20:.0f} |'
    )
  if args.json:
    with open(args.json, 'w') as f:
      json.dump(figures, f, indent=1)


if __name__ == '__main__':
  main()
