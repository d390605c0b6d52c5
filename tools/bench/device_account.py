"""Device memory, child side: accounts built trainers, without a step.

Each request runs in a process of its own (`device_memory_child`): ours
clears JAX's caches and sets process-wide state. The figures are
`trax_revplus.device_memory`'s, through `trainer_memory`, the same
accounting as `trax-revplus estimate`.
"""

import os
import tempfile
import time

from tools.bench import configs
from tools.bench import model
from tools.bench import protocol


def account(trainer_name, trainer, batch):
  """One built trainer's device figures.

  Args:
    trainer_name: 'default', 'stock' or 'ours'.
    trainer: the built trainer.
    batch: the step's batch (host arrays).

  Returns:
    {'peak_device_bytes', 'largest_program_bytes', 'peak_call', 'n_calls'}
    and, for ours under a budget, its 'plan'; or {'error'} (with
    'fits': False where no plan of ours fits its budget).
  """
  # pylint: disable=g-import-not-at-top
  import jax
  from trax_revplus import device_memory
  from trax_revplus import errors
  from trax_revplus.trainer._search import planner

  # pylint: enable=g-import-not-at-top
  backend = jax.default_backend()
  sds = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in batch)
  try:
    memory = device_memory.trainer_memory(trainer_name, trainer, sds, backend)
    step = memory.step
  except planner.DeviceMemoryBudgetError as e:
    return {'error': str(e), 'fits': False}
  except Exception as e:  # pylint: disable=broad-except
    return {
      'error': errors.one_line(
        e,
        context=False,
        typed=True,
        max_chars=device_memory.report.MAX_ERROR_CHARS,
      )
    }
  out = {
    'peak_device_bytes': step.peak_device_bytes,
    'largest_program_bytes': step.largest_program_bytes,
    'peak_call': step.peak_call.name,
    'n_calls': len(step.calls),
  }
  if trainer_name != 'default' and trainer_name != 'stock':
    out['plan'] = trainer.planned(sds).plan.settings()
  out['min_peak_device_bytes'] = memory.min_peak_device_bytes
  return out


def _logged_peak(spec, cfg, batch):
  """The peak_device_bytes ours' memory log records for a real step 1:
  an int, or the sorted list of the differing figures it recorded."""
  from trax_revplus import memory  # pylint: disable=g-import-not-at-top

  with tempfile.TemporaryDirectory() as tmp:
    logged = model.build(spec, cfg)[0]
    logged.memory_log.set_output_dir(tmp)
    model.step(logged, batch, 1)
    logged.memory_log.close()
    records = memory.read_memory_log(
      os.path.join(tmp, memory.MEMORY_LOG_FILENAME)
    )
  peaks = {
    r.get('peak_device_bytes')
    for r in records
    if r.get('step') == 1 and 'peak_device_bytes' in r
  }
  return peaks.pop() if len(peaks) == 1 else sorted(peaks)


def device_memory_child(request):
  """One process: accounts `request['trainers']` on a config; sends
  {spec: figures} to the parent (`protocol.send`).

  Args:
    request: {'config': name, 'quick': bool, 'length': int or None,
      'trainers': [spec, ...], 'memory_log': bool}. With memory_log, ours
      also runs one real step with its memory log on and reports the
      peak_device_bytes the log recorded (`logged_peak_device_bytes`).
  """
  cfg = configs.config(request['config'], request['quick'])
  if request.get('length'):
    cfg['length'] = request['length']
  batch = configs.batch(cfg)
  out = {}
  for spec in request['trainers']:
    t0 = time.perf_counter()
    try:
      trainer = model.build(spec, cfg)[0]
    except Exception as e:  # pylint: disable=broad-except
      out[spec] = {'error': f'{type(e).__name__}: {e}'.splitlines()[0]}
      continue
    name = configs.split_trainer(spec)[0]
    out[spec] = account(name, trainer, batch)
    out[spec]['seconds'] = time.perf_counter() - t0
    if request.get('memory_log') and name == 'ours':
      out[spec]['logged_peak_device_bytes'] = _logged_peak(spec, cfg, batch)
  protocol.send(out)
