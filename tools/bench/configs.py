"""The benchmark's model configs and trainer specs (`--configs`, `--trainers`).

Nothing here imports trax or JAX at module level: a wrong flag must fail in
the time it takes to parse it, not after trax's imports.
"""

import ast
import os

TRAINERS = ('default', 'stock', 'ours')  # every trainer, in table order
# Variant arguments that go into the environment of the trainer's processes
# rather than to its constructor: glibc reads GLIBC_TUNABLES when a process
# starts, and some of its settings (the arena count) cannot be changed once
# JAX's runtime has started its threads.
ENV_ARGS = ('GLIBC_TUNABLES',)
TRAINER_NAMES = {
  'default': 'default Trainer',
  'stock': 'stock ReversibleSerialTrainer',
  'ours': 'trax_revplus ReversibleSerialTrainer',
}

# ReformerLMs: n_layers decoder blocks (each 2 ReversibleHalfResidual + 2
# ReversibleSwap), d_ff = 4 * d_model, 4 heads of d_model / 4, byte vocabulary.
# 'ende': trax's encoder-decoder `Reformer` as reformer_wmt_ende.gin sets it
# (input vocabulary 33300, Adam with its b2 and eps), at the sizes of
# gin_configs/trax/reformer_wmt_ende_cpu.gin: n_layers encoder and n_layers
# decoder layers, d_ff = 2 * d_model; small steps, where the per-step work
# around the program (copies, dispatch, the allocator) weighs most.
# 'terraformer': trax's `ConfigurableTerraformer` as
# scientific_papers_terraformer.gin sets it (LSH attention in the encoder
# and the encoder-decoder attention with the file's chunk_len, n_buckets,
# n_hashes and chunk windows, dropout 0.2, vocab 32000, Adafactor), at the
# sizes of gin_configs/trax/scientific_papers_terraformer_cpu.gin.
# 'char': the main job's ReformerLM (gin_configs/reformer_char_lm_base.gin):
# no dropout.
CONFIGS = {
  'l6': dict(n_layers=6, length=1024, d_model=128, batch=4),
  'l24': dict(n_layers=24, length=1024, d_model=128, batch=4),
  'l12': dict(n_layers=12, length=2048, d_model=256, batch=2),
  # An accelerator's size of 'l12': a step of a few hundred milliseconds
  # on one TPU v5e chip.
  'lm12': dict(n_layers=12, length=2048, d_model=512, batch=8),
  'l64': dict(n_layers=64, length=64, d_model=32, batch=2),
  # 'l12' and 'lm12' four times as deep: what planning costs with depth
  # (tools/planning_cost.py).
  'l48': dict(n_layers=48, length=2048, d_model=256, batch=2),
  'lm48': dict(n_layers=48, length=2048, d_model=512, batch=8),
  'ende': dict(
    n_layers=2, length=128, d_model=64, batch=4, model='reformer', vocab=33300
  ),
  'terraformer': dict(
    n_layers=2,
    length=256,
    d_model=64,
    batch=2,
    model='terraformer',
    vocab=32000,
  ),
  'char': dict(n_layers=4, length=256, d_model=128, batch=8, dropout=0.0),
}
_QUICK = {'length': 64, 'd_model': 32}
VOCAB = 256  # token ids of every batch are below it


def config(name, quick=False):
  """The shapes of config `name` (a copy), scaled down with `quick`."""
  cfg = dict(CONFIGS[name])
  if quick:
    cfg.update(_QUICK)
  return cfg


def describe(cfg):
  """`cfg` in words, as the tables' first column."""
  shape = (
    f'length {cfg["length"]}, d_model {cfg["d_model"]}, batch {cfg["batch"]}'
  )
  if cfg.get('model') == 'reformer':
    return (
      f'encoder-decoder Reformer, {cfg["n_layers"]} + '
      f'{cfg["n_layers"]} layers, vocab {cfg["vocab"]}, {shape}'
    )
  if cfg.get('model') == 'terraformer':
    return (
      f'encoder-decoder Terraformer (LSH), {cfg["n_layers"]} + '
      f'{cfg["n_layers"]} layers, vocab {cfg["vocab"]}, {shape}'
    )
  if cfg.get('dropout') == 0.0:
    return f'{cfg["n_layers"]} layers, {shape}, no dropout'
  return f'{cfg["n_layers"]} layers, {shape}'


def batch(cfg, seed=0):
  """The (inputs, targets, weights) batch every step of every trainer uses.

  The same seed in every process, so that the trainers' losses can be
  compared across processes.
  """
  import numpy as np  # pylint: disable=g-import-not-at-top

  rs = np.random.RandomState(seed)
  x = rs.randint(1, VOCAB, size=(cfg['batch'], cfg['length'])).astype(np.int32)
  return (x, x, np.ones_like(x, dtype=np.float32))


def parse_trainer(spec):
  """'ours+a=1+b=None' -> ('ours', {'a': 1, 'b': None}).

  Raises:
    ValueError: an unknown trainer, arguments for another trainer than
      ours, or an argument that is not NAME=<Python literal>.
  """
  name, *args = spec.split('+')
  if name not in TRAINERS:
    raise ValueError(f'unknown trainer {name!r}; choose from {list(TRAINERS)}')
  if args and name != 'ours':
    raise ValueError(f'{spec!r}: only ours takes constructor arguments')
  kwargs = {}
  for arg in args:
    key, sep, value = arg.partition('=')
    try:
      if not sep or not key.isidentifier():
        raise ValueError
      kwargs[key] = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      raise ValueError(
        f'{spec!r}: {arg!r} is not NAME=VALUE with VALUE a Python literal'
      ) from None
  return name, kwargs


def split_trainer(spec):
  """Splits a `--trainers` entry into (name, constructor args, environment).

  E.g. "ours+GLIBC_TUNABLES='x'+a=1" -> ('ours', {'a': 1},
  {'GLIBC_TUNABLES': 'x'}): `parse_trainer`'s arguments, those named in
  `ENV_ARGS` apart, for the environment of the trainer's processes.

  Raises:
    ValueError: as `parse_trainer`, or an environment argument whose value
      is not a str.
  """
  name, kwargs = parse_trainer(spec)
  env = {k: v for k, v in kwargs.items() if k in ENV_ARGS}
  for key, value in env.items():
    if not isinstance(value, str):
      raise ValueError(f'{spec!r}: {key} must be a quoted str, got {value!r}')
  ctor = {k: v for k, v in kwargs.items() if k not in ENV_ARGS}
  return name, ctor, env


def child_env(spec):
  """Environment for the processes of trainer `spec`, or None to inherit.

  Raises:
    ValueError: as `split_trainer`.
  """
  env = split_trainer(spec)[2]
  return {**os.environ, **env} if env else None


def check_configs(names):
  """Raises ValueError naming the entries of `names` that are no config."""
  unknown = set(names) - set(CONFIGS)
  if unknown:
    raise ValueError(
      f'unknown configs {sorted(unknown)}; choose from {sorted(CONFIGS)}'
    )


def check_trainers(specs):
  """Checks `--trainers` entries; returns {spec: constructor args}.

  Ours' argument names are checked against the settings its constructor takes,
  which imports trax: only when some entry has arguments.

  Raises:
    ValueError: as `split_trainer`, or an argument ours' constructor does
      not take.
  """
  variants = {spec: split_trainer(spec)[1] for spec in specs}
  if any(variants.values()):  # importing trax takes a while
    from trax_revplus import trainer as rev_trainer  # pylint: disable=g-import-not-at-top

    ours_args = rev_trainer.ReversibleSerialTrainer.gin_parameters
    for spec, kwargs in variants.items():
      unknown = sorted(set(kwargs) - set(ours_args))
      if unknown:
        raise ValueError(
          f'{spec!r}: trax_revplus.ReversibleSerialTrainer takes no '
          f'argument {unknown[0]!r}'
        )
  return variants
