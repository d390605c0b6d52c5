"""Builds the benchmark's model under each trainer, and runs one step.

The three trainers get the same model (a ReformerLM with full causal
self-attention, dropout 0.1 (none in 'char') and a byte vocabulary, or the
config's encoder-decoder model), the same initialization seed and optimizer.
"""

import functools
import time

from tools.bench import configs


# scientific_papers_terraformer.gin's attention and optimizer settings, as
# that file binds them.
_TERRAFORMER_GIN = """
LSHSelfAttention.attention_dropout = 0.2
LSHSelfAttention.chunk_len = 128
LSHSelfAttention.n_buckets = 128
LSHSelfAttention.n_chunks_after = 0
LSHSelfAttention.n_chunks_before = 1
LSHSelfAttention.n_hashes = 2
LSHSelfAttention.n_parallel_heads = 1
ref2_encoder/LSHSelfAttention.n_chunks_after = 1
ConfigurableTerraformer.encoder_attention_type = @ref2_encoder/LSHSelfAttention
ConfigurableTerraformer.encoder_decoder_attention_type = @LSHSelfAttention
"""
_ADAFACTOR = dict(
  beta1=0.0,
  decay_rate=0.9,
  clipping_threshold=1.0,
  epsilon1=1e-16,
  epsilon2=0.001,
  factored=True,
  multiply_by_parameter_scale=True,
)


def _terraformer(cfg):
  """trax's `ConfigurableTerraformer` as scientific_papers_terraformer.gin
  builds it, at `cfg`'s sizes."""
  import gin  # pylint: disable=g-import-not-at-top
  from trax import layers as tl  # pylint: disable=g-import-not-at-top
  from trax import models  # pylint: disable=g-import-not-at-top

  gin.parse_config(_TERRAFORMER_GIN)
  d = cfg['d_model']
  return models.ConfigurableTerraformer(
    cfg['vocab'],
    d_model=d,
    d_ff=2 * d,
    dropout=0.2,
    ff_dropout=0.1,
    ff_activation=tl.Relu,
    max_len=cfg['length'],
    n_heads=4,
    n_encoder_layers=cfg['n_layers'],
    n_decoder_layers=cfg['n_layers'],
    d_attention_key=d // 4,
    d_attention_value=d // 4,
    pos_type='fixed-base',
    pos_d_axial_embs=(d // 2, d // 2),
    mode='train',
  )


def model_and_optimizer(cfg):
  """The config's model (trax layers, mode 'train', not initialized) and its
  optimizer factory: (model, optimizer_fn)."""
  # pylint: disable=g-import-not-at-top
  from trax import layers as tl
  from trax import models
  from trax import optimizers

  # pylint: enable=g-import-not-at-top
  d = cfg['d_model']
  if cfg.get('model') == 'terraformer':
    return (
      _terraformer(cfg),
      functools.partial(optimizers.Adafactor, **_ADAFACTOR),
    )
  if cfg.get('model') == 'reformer':
    model = models.Reformer(
      cfg['vocab'],
      d_model=d,
      d_ff=2 * d,
      n_encoder_layers=cfg['n_layers'],
      n_decoder_layers=cfg['n_layers'],
      n_heads=4,
      dropout=0.1,
      ff_dropout=0.1,
      ff_activation=tl.Relu,
      max_len=cfg['length'],
      mode='train',
    )
    return model, functools.partial(optimizers.Adam, b1=0.9, b2=0.98, eps=1e-9)
  model = models.ReformerLM(
    configs.VOCAB,
    d_model=d,
    d_ff=4 * d,
    d_attention_key=d // 4,
    d_attention_value=d // 4,
    n_layers=cfg['n_layers'],
    n_heads=4,
    dropout=cfg.get('dropout', 0.1),
    max_len=cfg['length'],
    attention_type=tl.SelfAttention,
    mode='train',
  )
  return model, optimizers.Adam


def build(spec, cfg):
  """Builds model + trainer; returns (trainer, weights_bytes, slots_bytes).

  Args:
    spec: a `--trainers` entry (`configs.split_trainer`); its environment
      arguments apply to the process, not here.
    cfg: a config's shapes (`configs.config`).
  """
  trainer_name, extra_kwargs, _ = configs.split_trainer(spec)
  # pylint: disable=g-import-not-at-top
  from trax_revplus import trax_import

  trax_import.import_trax()
  from trax import fastmath
  from trax import layers as tl
  from trax import optimizers
  from trax import shapes
  from trax.optimizers import trainer as stock_trainer
  import trax_revplus
  from trax_revplus import memory
  from trax_revplus import trainer as rev_trainer

  # pylint: enable=g-import-not-at-top
  if trainer_name == 'ours':
    trax_revplus.activate()
  else:
    trax_revplus.deactivate()
  try:
    model, optimizer = model_and_optimizer(cfg)
    loss = tl.WeightedCategoryCrossEntropy()
    sig = shapes.signature(configs.batch(cfg))
    rng = fastmath.random.get_prng(0)
    if trainer_name == 'default':
      model_with_loss = tl.Serial(model, loss)
      model_with_loss.init(sig, rng=rng)
      opt = optimizer()
      opt.tree_init(model_with_loss.weights)
      trainer = optimizers.Trainer(model_with_loss, opt, n_devices=1)
      return (
        trainer,
        memory.array_bytes(model_with_loss.weights),
        memory.array_bytes(opt.slots),
      )
    module = stock_trainer if trainer_name == 'stock' else rev_trainer
    blocks, loss_layer = module.extract_reversible_blocks([model, loss])
    module.init_reversible_blocks(blocks, loss_layer, sig, rng)
    kwargs = {}
    if trainer_name == 'ours':
      # Steady-state steps: phase records (which wait for each phase) on
      # the first step only, as in a long run after its first steps.
      kwargs = dict(
        memory_log_tensorboard=False, memory_log_first_steps=1, **extra_kwargs
      )
    trainer = module.ReversibleSerialTrainer(
      blocks, loss_layer, optimizer, n_devices=1, **kwargs
    )
    weights = [l.weights for l in trainer.all_layers]
    return (
      trainer,
      memory.array_bytes(weights),
      memory.array_bytes(trainer.slots),
    )
  finally:
    trax_revplus.deactivate()


def step(trainer, batch, step_number):
  """Runs step `step_number` to its end; returns (seconds, loss)."""
  import jax  # pylint: disable=g-import-not-at-top
  from trax import fastmath  # pylint: disable=g-import-not-at-top

  t0 = time.perf_counter()
  loss, _ = trainer.one_step(
    batch, fastmath.random.get_prng(step_number), step=step_number
  )
  loss = float(jax.block_until_ready(loss))
  return time.perf_counter() - t0, loss


def chip_peak_bytes():
  """The peak bytes in use on this process's first device since it
  started (`memory_stats()['peak_bytes_in_use']`), or None where the
  backend keeps no such figure (the CPU)."""
  import jax  # pylint: disable=g-import-not-at-top

  stats = jax.local_devices()[0].memory_stats()
  if not stats or 'peak_bytes_in_use' not in stats:
    return None
  return int(stats['peak_bytes_in_use'])
