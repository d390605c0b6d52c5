"""tools/bench: flag errors, trainer specs, tables, and the memory child.

In-process: the benchmark's modules are imported from the checkout; the
peak RSS process through tools/bench.py, with the tests marked slow. The
entry script from any directory is in test_bench_processes.py; the timing
processes with real trainers, stepped in turns, in tools/bench_smoke.py.
"""

import json
import os
import re
import sys

from absl import app
from absl import flags
import pytest

# tools/ is not installed: import it from the checkout this test is in.
sys.path.insert(
  0,
  os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
)

# pylint: disable=g-import-not-at-top,wrong-import-position
from tools.bench import cli
from tools.bench import configs
from tools.bench import host_memory
from tools.bench import main
from tools.bench import markdown
from tools.bench import protocol
from tools.bench import summary
# pylint: enable=g-import-not-at-top,wrong-import-position

_FLAG_ERRORS = [
  ('--configs=l6,l7', "unknown configs ['l7']; choose from"),
  ('--trainers=ours,stok', "unknown trainer 'stok'; choose from"),
  ('--trainers=ours+donat=True', "takes no argument 'donat'"),
  ('--trainers=ours+GLIBC_TUNABLES=1', 'GLIBC_TUNABLES must be a quoted'),
]


def _parse(*args):
  """The benchmark's flags parsed from `args`, apart from absl's own."""
  flag_values = flags.FlagValues()
  cli.define_flags(flag_values)
  flag_values(['bench.py', *args])
  return flag_values


@pytest.mark.parametrize('flag,message', _FLAG_ERRORS)
def test_unknown_names_are_usage_errors(flag, message, tmp_path):
  out_dir = tmp_path / 'bench_results'
  # Nothing to measure either way: a missing check would end the run
  # quickly with bench.json written, instead of starting a benchmark.
  argv = ['bench.py', flag, '--notiming', '--nomemory', f'--out_dir={out_dir}']
  opts = _parse(*argv[1:])
  with pytest.raises(app.UsageError, match=re.escape(message)):
    main.bench(opts, argv)
  assert not out_dir.exists()  # nothing measured, nothing written
  # The checks themselves, as main calls them.
  with pytest.raises(ValueError, match=re.escape(message)):
    configs.check_configs(opts.configs)
    configs.check_trainers(opts.trainers)


def test_trainer_variants_parse_and_get_their_own_table_rows():
  assert configs.parse_trainer('ours') == ('ours', {})
  with pytest.raises(ValueError, match='only ours takes constructor'):
    configs.parse_trainer('stock+donate=False')
  with pytest.raises(ValueError, match="'donate=no' is not NAME=VALUE"):
    configs.parse_trainer('ours+donate=no')
  assert configs.parse_trainer(
    'ours+host_mmap_threshold=None+n_async_layers=2'
  ) == ('ours', {'host_mmap_threshold': None, 'n_async_layers': 2})
  # An environment argument goes to the trainer's processes, not to its
  # constructor.
  lean = "ours+GLIBC_TUNABLES='glibc.malloc.arena_max=1'+n_async_layers=2"
  assert configs.parse_trainer(lean) == (
    'ours',
    {'GLIBC_TUNABLES': 'glibc.malloc.arena_max=1', 'n_async_layers': 2},
  )
  assert configs.split_trainer(lean) == (
    'ours',
    {'n_async_layers': 2},
    {'GLIBC_TUNABLES': 'glibc.malloc.arena_max=1'},
  )
  assert configs.child_env(lean)['GLIBC_TUNABLES'] == (
    'glibc.malloc.arena_max=1'
  )
  assert configs.child_env(lean)['PATH'] == os.environ['PATH']
  assert configs.child_env('ours+n_async_layers=2') is None
  with pytest.raises(ValueError, match='GLIBC_TUNABLES must be a quoted str'):
    configs.child_env('ours+GLIBC_TUNABLES=1')
  assert configs.check_trainers(['stock', 'ours+n_async_layers=2']) == {
    'stock': {},
    'ours+n_async_layers=2': {'n_async_layers': 2},
  }
  timing = {
    t: dict(median_step_s=s, first_step_s=10.0, second_step_s=3.0)
    for t, s in (
      ('default', 2.0),
      ('stock', 4.0),
      ('ours', 3.0),
      ('ours+donate=False', 3.3),
    )
  }
  results = dict(
    configs={'l6': dict(config=configs.config('l6'), timing=timing)}
  )
  text = markdown.markdown(summary.summarize(results))
  # The main table keeps the three trainers; the variant gets its own row
  # with its ratios to stock and default.
  assert '| 2.000 | 4.000 | 3.000 | 0.75 | 1.50 |' in text
  assert '| l6 | `ours+donate=False` | 3.300 | 0.82 | 1.65 | 10.0 | - |' in text


def test_memory_median_keeps_every_process_s_running_peaks(monkeypatch):
  runs = iter(
    [
      dict(
        peak_above_baseline_bytes=p,
        step_s=[1.0, 1.0],
        peak_above_baseline_after_step_bytes=[p - 5, p],
      )
      for p in (30, 10, 20)
    ]
  )
  monkeypatch.setattr(
    host_memory, 'run_memory', lambda *unused_args: next(runs)
  )
  result = host_memory.run_memory_median('l6', 'ours', 3, 2, False)
  assert result['peak_above_baseline_bytes'] == 20
  assert result['peak_above_baseline_after_step_bytes'] == [15, 20]
  assert result['peak_above_baseline_bytes_runs'] == [30, 10, 20]
  assert result['peak_above_baseline_after_step_bytes_runs'] == [
    [25, 30],
    [5, 10],
    [15, 20],
  ]


def test_children_start_the_entry_script():
  cmd = protocol.command('--timing_child=l6:ours')
  assert cmd[0] == sys.executable and os.path.isfile(cmd[1])
  assert cmd[1].endswith(os.path.join('tools', 'bench.py'))


def test_a_child_that_exits_without_a_result_is_an_error():
  import subprocess  # pylint: disable=g-import-not-at-top

  proc = subprocess.Popen(
    [
      sys.executable,
      '-c',
      f'print("noise"); print({protocol.RESULT!r} + '
      '\'{"a": 1}\'); import sys; sys.exit(3)',
    ],
    stdout=subprocess.PIPE,
    text=True,
  )
  assert protocol.receive(proc, 'l6:ours') == {'a': 1}
  with pytest.raises(RuntimeError, match='l6:ours exited with status 3'):
    protocol.receive(proc, 'l6:ours')


@pytest.mark.slow
def test_memory_process_reports_its_peak_after_each_step(tmp_path):
  """The benchmark's peak RSS of ours as a user runs it: tools/bench.py,
  whose memory process (fresh) reports its running peak after each of 3
  steps."""
  import subprocess  # pylint: disable=g-import-not-at-top

  proc = subprocess.run(
    protocol.command(
      '--quick',
      '--configs=l6',
      '--trainers=ours',
      '--memory_steps=3',
      '--notiming',
      f'--out_dir={tmp_path}',
    ),
    capture_output=True,
    text=True,
    check=False,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  results = json.loads((tmp_path / 'bench_quick.json').read_text())
  mem = results['configs']['l6']['memory']['ours']
  peaks = mem['peak_above_baseline_after_step_bytes']
  assert len(peaks) == len(mem['step_s']) == 3
  assert peaks == sorted(peaks)  # a running peak never falls
  assert peaks[0] > 0  # above the baseline from the first step
  # The process's peak is read after its last step.
  assert peaks[-1] <= mem['peak_above_baseline_bytes']
  assert mem['weights_bytes'] > 0 and mem['slots_bytes'] > 0
  assert mem['peak_rss_bytes'] == (
    mem['baseline_rss_bytes'] + mem['peak_above_baseline_bytes']
  )


def test_encoder_decoder_config_builds_trax_s_reformer_for_each_trainer():
  """The 'ende' row: trax's encoder-decoder Reformer, its 33300-token input
  vocabulary (two embeddings and the output layer hold most weights), the
  same weights under stock and ours."""
  from tools.bench import model  # pylint: disable=g-import-not-at-top

  cfg = configs.config('ende', quick=True)
  assert configs.describe(cfg).startswith(
    'encoder-decoder Reformer, 2 + 2 layers, vocab 33300'
  )
  sizes = {name: model.build(name, cfg)[1:] for name in ('stock', 'ours')}
  assert sizes['stock'] == sizes['ours']
  weights_bytes, slots_bytes = sizes['ours']
  assert weights_bytes > 3 * 33300 * cfg['d_model'] * 4
  assert slots_bytes == 2 * weights_bytes  # Adam: two slots per weight


def test_a_trainer_that_fails_is_reported_not_timed():
  timing = {
    'default': dict(median_step_s=2.0, first_step_s=10.0, second_step_s=3.0),
    'stock': dict(
      median_step_s=None,
      first_step_s=None,
      second_step_s=None,
      failed_at_step=1,
      error='JaxRuntimeError: donate twice',
    ),
    'ours': dict(median_step_s=3.0, first_step_s=9.0, second_step_s=3.0),
  }
  results = dict(
    configs={
      'terraformer': dict(config=configs.config('terraformer'), timing=timing)
    }
  )
  text = markdown.markdown(summary.summarize(results))
  assert '| 2.000 | - | 3.000 | - | 1.50 | - |' in text
  assert (
    '- terraformer: stock fails at step 1: JaxRuntimeError: donate '
    'twice' in text
  )


def test_terraformer_config_builds_trax_s_lsh_terraformer():
  """The 'terraformer' row: trax's ConfigurableTerraformer with LSH
  attention as scientific_papers_terraformer.gin sets it."""
  from tools.bench import model  # pylint: disable=g-import-not-at-top

  cfg = configs.config('terraformer', quick=True)
  assert configs.describe(cfg).startswith(
    'encoder-decoder Terraformer (LSH), 2 + 2 layers, vocab 32000'
  )
  from trax_revplus.trainer._step import attention_heads  # pylint: disable=g-import-not-at-top

  trainer, weights_bytes, slots_bytes = model.build('ours', cfg)
  assert weights_bytes > 32000 * cfg['d_model'] * 4 and slots_bytes > 0
  # By name: gin's registration wraps trax's attention classes.
  lsh = [
    l
    for l in attention_heads.sublayers(trainer.all_layers)
    if type(l).__name__ == 'LSHSelfAttention'
  ]
  assert lsh and all(
    l._n_hashes == 2 and l._chunk_len == 128  # pylint: disable=protected-access
    for l in lsh
  )


def test_char_config_is_the_main_job_s_model():
  """The 'char' row: gin_configs/reformer_char_lm_base.gin's ReformerLM,
  which draws nothing (dropout 0.0)."""
  from tools.bench import model  # pylint: disable=g-import-not-at-top
  from trax import layers as tl  # pylint: disable=g-import-not-at-top
  from trax_revplus.trainer._step import attention_heads  # pylint: disable=g-import-not-at-top

  cfg = configs.config('char')
  assert (cfg['n_layers'], cfg['length'], cfg['d_model'], cfg['batch']) == (
    4,
    256,
    128,
    8,
  )
  assert configs.describe(cfg).endswith(', no dropout')
  net, _ = model.model_and_optimizer(configs.config('char', quick=True))
  rates = [
    l._initial_rate
    for l in attention_heads.sublayers([net])  # pylint: disable=protected-access
    if isinstance(l, tl.Dropout)
  ]
  assert rates and all(r == 0.0 for r in rates)


# A timing child's stand-in: it opens JAX's backend as the real one does
# when it builds its trainer (failing to build where it cannot), then
# answers each step with a time, a loss and a device peak of 5 MiB.
_FAKE_TIMING_CHILD = f"""
import json, sys
def send(obj):
  print({protocol.RESULT!r} + json.dumps(obj), flush=True)
try:
  import jax
  jax.devices()
except RuntimeError as e:
  send(dict(error=str(e)[:200]))
  sys.exit(0)
send(dict(build_s=0.1, weights_bytes=10, slots_bytes=20,
          glibc_tunables=None))
for line in sys.stdin:
  send(dict(seconds=0.01 * int(line), loss=1.0, chip_peak_bytes=5 << 20))
"""


def _fake_timing_children(monkeypatch):
  monkeypatch.setattr(
    protocol,
    'command',
    lambda *args: [sys.executable, '-c', _FAKE_TIMING_CHILD, *args],
  )


def test_on_a_one_chip_host_the_trainers_are_timed_one_at_a_time(
  monkeypatch, one_chip_host
):
  """`--sequential` (always so on an accelerator): each trainer's process
  is built, stepped and ended before the next starts, and reports its
  device peak; stepped in turns, the second process cannot open the
  device."""
  from tools.bench import timing  # pylint: disable=g-import-not-at-top

  _fake_timing_children(monkeypatch)
  for name, value in one_chip_host.items():  # The children inherit it.
    monkeypatch.setenv(name, value)
  trainers = list(configs.TRAINERS)
  timed = timing.time_config('l6', trainers, 2, True, sequential=True)
  for t in trainers:
    assert timed[t]['error'] is None, timed[t]['error']
    assert timed[t]['step_s'] == [0.03, 0.04]
    assert timed[t]['median_step_s'] == 0.035
    assert timed[t]['chip_peak_bytes'] == 5 << 20
  in_turns = timing.time_config('l6', trainers, 2, True)
  assert in_turns['default']['error'] is None
  assert in_turns['stock']['failed_at_step'] == 0
  assert 'libtpu multi-process lockfile' in in_turns['stock']['error']
  results = dict(
    configs={
      'l6': dict(
        config=configs.config('l6', True),
        timing=timed,
        timing_mode='sequential',
      )
    }
  )
  text = markdown.markdown(summary.summarize(results))
  assert ' timed | device peak default / stock / ours (MiB) |' in text
  assert (
    '| 0.035 | 0.035 | 0.035 | 1.00 | 1.00 | 1.00 | 0.0 / 0.0 / 0.0 '
    '| 0.0 / 0.0 / 0.0 | one at a time | 5 / 5 / 5 |'
  ) in text


# tools/bench.py's own process on a simulated one-chip host, its timing
# children stand-ins that open the device.
_BENCH_PARENT = """
import sys
sys.path.insert(0, {root!r})
from absl import app
from absl import flags
from tools.bench import cli, main, protocol
protocol.command = lambda *args: [sys.executable, '-c', {child!r}, *args]
cli.define_flags(flags.FLAGS)
app.run(main.main, argv=['bench.py'] + sys.argv[1:])
"""


def test_the_benchmark_s_own_process_holds_no_backend(tmp_path, one_chip_host):
  import subprocess  # pylint: disable=g-import-not-at-top

  root = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  )
  out_dir = tmp_path / 'out'
  proc = subprocess.run(
    [
      sys.executable,
      '-c',
      _BENCH_PARENT.format(root=root, child=_FAKE_TIMING_CHILD),
      '--quick',
      '--configs=l6',
      '--trainers=stock,ours',
      '--steps=1',
      '--nomemory',
      '--sequential',
      f'--out_dir={out_dir}',
    ],
    env=one_chip_host,
    capture_output=True,
    text=True,
    check=False,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  results = json.loads((out_dir / 'bench_quick.json').read_text())
  assert results['environment']['platform'] == 'cpu'
  assert results['environment']['devices'] == ['cpu:0']
  assert results['configs']['l6']['timing_mode'] == 'sequential'
  for t in ('stock', 'ours'):
    timed = results['configs']['l6']['timing'][t]
    assert timed['error'] is None and timed['chip_peak_bytes'] == 5 << 20


def test_the_median_step_is_of_the_steps_on_the_settled_plan(monkeypatch):
  """Steps a child reports as run on a plan ready first (ours' first
  steps while its fused program compiles) are kept but not in the
  median."""
  from tools.bench import timing  # pylint: disable=g-import-not-at-top

  child = _FAKE_TIMING_CHILD.replace(
    'chip_peak_bytes=5 << 20)',
    'chip_peak_bytes=5 << 20, on_ready_plan=int(line) <= 3)',
  )
  assert child != _FAKE_TIMING_CHILD
  monkeypatch.setattr(
    protocol, 'command', lambda *args: [sys.executable, '-c', child, *args]
  )
  timed = timing.time_config('l6', ['ours'], 3, True)['ours']
  assert timed['step_s'] == [0.03, 0.04, 0.05]
  assert timed['settled_step_s'] == [0.04, 0.05]
  assert timed['steps_on_ready_plan'] == [1, 2, 3]
  assert timed['median_step_s'] == 0.045
