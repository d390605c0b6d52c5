"""Ratios, target checks and the depth scaling of a benchmark's results.

Read from `results` as bench.json holds it, so that a run with `--update`
summarizes the figures it keeps from earlier runs too.
"""

from tools.bench import configs

# Step-time targets per config: (ours / stock, ours / default) at most.
_TARGETS = {
  'l6': (0.85, 1.40),
  'l24': (0.85, 1.40),
  'l12': (0.95, 1.36),
  'l64': (0.5, None),
}


def ratio(a, b):
  """a / b, or None where either is missing or b is 0."""
  return None if a is None or b is None or not b else a / b


def summarize(results):
  """Adds ratios, target checks and the depth scaling to `results`.

  Returns:
    `results`, changed in place.
  """
  for name, r in results['configs'].items():
    tm = r.get('timing', {})
    med = {t: tm.get(t, {}).get('median_step_s') for t in tm}
    first = {t: tm.get(t, {}).get('first_step_s') for t in tm}
    ratios = dict(
      ours_over_stock=ratio(med.get('ours'), med.get('stock')),
      ours_over_default=ratio(med.get('ours'), med.get('default')),
      stock_over_default=ratio(med.get('stock'), med.get('default')),
    )
    r['ratios'] = ratios
    checks = {}
    vs_stock, vs_default = _TARGETS.get(name, (None, None))
    if ratios['ours_over_stock'] is not None and vs_stock is not None:
      checks[f'step ours/stock <= {vs_stock}'] = (
        ratios['ours_over_stock'] <= vs_stock
      )
    if ratios['ours_over_default'] is not None and vs_default is not None:
      checks[f'step ours/default <= {vs_default}'] = (
        ratios['ours_over_default'] <= vs_default
      )
    if first.get('ours') is not None and first.get('stock') is not None:
      checks['first step ours <= stock'] = first['ours'] <= first['stock']
      second = {t: tm.get(t, {}).get('second_step_s') for t in tm}
      if second.get('ours') is not None and second.get('stock') is not None:
        checks['first two steps ours <= stock'] = (
          first['ours'] + second['ours'] <= first['stock'] + second['stock']
        )
    mem = r.get('memory', {})
    if 'ours' in mem and 'stock' in mem:
      checks['peak RSS above baseline ours <= stock'] = (
        mem['ours']['peak_above_baseline_bytes']
        <= mem['stock']['peak_above_baseline_bytes']
      )
    r['checks'] = checks
  cfgs = results['configs']
  if 'l6' in cfgs and 'l24' in cfgs:
    scaling = {}
    # Every trainer measured on both configs, also in earlier --update runs.
    for t in configs.TRAINERS:
      m6 = cfgs['l6'].get('memory', {}).get(t)
      m24 = cfgs['l24'].get('memory', {}).get(t)
      if not m6 or not m24:
        continue
      added = (m24['weights_bytes'] + m24['slots_bytes']) - (
        m6['weights_bytes'] + m6['slots_bytes']
      )
      growth = (
        m24['peak_above_baseline_bytes'] - m6['peak_above_baseline_bytes']
      )
      scaling[t] = dict(
        peak_growth_bytes=growth,
        weights_and_slots_added_bytes=added,
        growth_over_added=ratio(growth, added),
      )
    results['depth_scaling'] = scaling
    results.pop('depth_scaling_check', None)
    results.pop('depth_scaling_note', None)
    if any(v['peak_growth_bytes'] < 0 for v in scaling.values()):
      # A deeper model cannot need less memory: one of the two peaks was
      # not measured above its own baseline (e.g. it includes the imports).
      results['depth_scaling_note'] = (
        'not checked: a peak growth below 0 means the 6- and 24-layer '
        'peaks are not comparable; re-measure both with --notiming'
      )
    elif 'ours' in scaling:
      results['depth_scaling_check'] = {
        'ours growth <= 1.2 x weights and slots added': scaling['ours'][
          'growth_over_added'
        ]
        <= 1.2
      }
  return results
